"""The real Claude Code and Codex CLIs, driven by a real worker, solve an example task end to end
against local mock model servers (the mocks script the tool calls a model would make)."""

import pytest
from django.conf import settings

from conftest import WorkerProcess, wait_for
from runs_app.launching import LaunchOptions, launch_run
from runs_app.models import Trial, TrialEvent
from runs_app.tests.factories import EXAMPLES, import_examples, make_experiment
from runs_app.tests.mock_servers import AnthropicMock, OpenAIMock, Turn, message, shell, text, tool_use

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

NODE_BIN = settings.BASE_DIR / "node_modules" / ".bin"
FIX = (EXAMPLES / "tasks" / "fix-mean" / "reference" / "stats.py").read_text()
WRITE_FIX = f"cat > stats.py <<'EOF'\n{FIX}EOF\npython3 -m unittest discover -s tests"

REAL_KEY = "sk-test-real-key-only-the-gateway-holds"

EXPERIMENT = """
experiment_id: real-cli
variants:
  - variant_id: agent
    agent: {agent}
"""


def run_example(tmp_path, agent: str, overrides: list[str], worker_env: dict[str, str]) -> Trial:
    import_examples()
    experiment = make_experiment(tmp_path, EXPERIMENT.format(agent=agent))
    worker = WorkerProcess(tmp_path, extra_env=worker_env).start()
    try:
        run = launch_run(experiment, options=LaunchOptions(task_slugs=["fix-mean"], overrides=overrides))

        def finished():
            run.refresh_from_db()
            return run.is_final

        wait_for(finished, timeout=150, message=lambda: worker.log()[-4000:])
    finally:
        worker.kill()
    return Trial.objects.get(run=run)


@pytest.mark.skipif(
    not (NODE_BIN / "claude").exists(), reason="run `make agents` (npm ci) for the claude CLI"
)
def test_the_real_claude_cli_solves_an_example_task_through_the_worker(tmp_path):
    script = [
        Turn([text("I'll rewrite mean()."), tool_use("Bash", {"command": WRITE_FIX, "description": "Fix"})]),
        Turn([text("mean() is fixed and the tests pass.")]),
    ]
    with AnthropicMock(script) as api:
        trial = run_example(
            tmp_path,
            "{type: claude-code, model: claude-sonnet-4-6, permission_mode: acceptEdits, "
            "allowed_tools: [Bash, Read, Write, Edit], max_retries: 0}",
            [f"agent.base_url={api.url}"],
            {"ANTHROPIC_API_KEY": "sk-test-not-a-real-key"},
        )

    assert trial.status == "passed", (trial.error_category, trial.error_message, trial.agent_stderr[-2000:])
    assert trial.input_tokens > 0 and trial.output_tokens > 0 and trial.turns >= 2
    calls = TrialEvent.objects.filter(trial=trial, kind="tool_call")
    assert [event.data["name"] for event in calls] == ["Bash"]
    assert "sk-test-not-a-real-key" not in trial.agent_stdout + trial.agent_stderr
    assert "+    return total / count" in trial.diff


@pytest.mark.skipif(not (NODE_BIN / "codex").exists(), reason="run `make agents` (npm ci) for the codex CLI")
def test_the_real_codex_cli_solves_an_example_task_through_the_worker(tmp_path):
    script = [Turn([message("Rewriting mean()."), shell(WRITE_FIX)]), Turn([message("Fixed.")])]
    with OpenAIMock(script) as api:
        trial = run_example(
            tmp_path,
            "{type: codex, model: gpt-5.5, max_retries: 0}",
            [f"agent.base_url={api.url}/v1"],
            {"OPENAI_API_KEY": "sk-test-not-a-real-key"},
        )

    assert trial.status == "passed", (trial.error_category, trial.error_message, trial.agent_stderr[-2000:])
    assert trial.input_tokens + trial.cache_read_tokens > 0 and trial.output_tokens > 0
    assert TrialEvent.objects.filter(trial=trial, kind="tool_call", data__name="Bash").exists()


@pytest.mark.skipif(
    not (NODE_BIN / "claude").exists(), reason="run `make agents` (npm ci) for the claude CLI"
)
def test_claude_reaches_its_model_only_through_the_gateway_which_counts_every_call(tmp_path):
    script = [Turn([tool_use("Bash", {"command": WRITE_FIX, "description": "Fix"})]), Turn([text("Fixed.")])]
    with AnthropicMock(script) as api:
        trial = run_example(
            tmp_path,
            "{type: claude-code, model: claude-sonnet-4-6, max_retries: 0, "
            "prices: {input: 3.0, output: 15.0, cache_write: 3.75, cache_read: 0.3}}",
            [f"agent.base_url={api.url}"],
            {"ANTHROPIC_API_KEY": REAL_KEY},
        )
        sent, requests = list(api.sent_usage), api.model_requests()

    assert trial.status == "passed", (trial.error_category, trial.error_message, trial.agent_stderr[-2000:])
    # Every request carried the real key, which only the gateway adds; the CLI held a placeholder.
    assert requests and {r["headers"].get("x-api-key") for r in requests} == {REAL_KEY}
    total = {name: sum(u[name] for u in sent) for name in sent[0]}
    assert trial.input_tokens == total["input_tokens"] and trial.output_tokens == total["output_tokens"]
    assert trial.cache_read_tokens == total["cache_read_input_tokens"]
    assert trial.cache_creation_tokens == total["cache_creation_input_tokens"]
    expected = (
        3.0 * total["input_tokens"]
        + 15.0 * total["output_tokens"]
        + 3.75 * total["cache_creation_input_tokens"]
        + 0.3 * total["cache_read_input_tokens"]
    ) / 1e6
    assert abs(trial.cost_usd - expected) < 1e-9
    calls = TrialEvent.objects.filter(trial=trial, kind="usage", data__source="gateway", data__status=200)
    assert calls.count() == len(requests) == trial.turns
    assert REAL_KEY not in trial.agent_stdout + trial.agent_stderr


@pytest.mark.skipif(not (NODE_BIN / "codex").exists(), reason="run `make agents` (npm ci) for the codex CLI")
def test_codex_is_priced_at_the_gateway(tmp_path):
    script = [Turn([message("Rewriting mean()."), shell(WRITE_FIX)]), Turn([message("Fixed.")])]
    with OpenAIMock(script) as api:
        trial = run_example(
            tmp_path,
            "{type: codex, model: gpt-5.5, max_retries: 0, "
            "prices: {input: 1.0, output: 8.0, cache_read: 0.1}}",
            [f"agent.base_url={api.url}/v1"],
            {"OPENAI_API_KEY": REAL_KEY},
        )
        sent, requests = list(api.sent_usage), api.model_requests()

    assert trial.status == "passed", (trial.error_category, trial.error_message, trial.agent_stderr[-2000:])
    assert {r["headers"].get("Authorization") for r in requests} == {f"Bearer {REAL_KEY}"}
    cached = sum(u["input_tokens_details"]["cached_tokens"] for u in sent)
    fresh = sum(u["input_tokens"] for u in sent) - cached
    output = sum(u["output_tokens"] for u in sent)
    assert (trial.input_tokens, trial.cache_read_tokens, trial.output_tokens) == (fresh, cached, output)
    assert (
        trial.cost_usd > 0 and abs(trial.cost_usd - (fresh * 1.0 + output * 8.0 + cached * 0.1) / 1e6) < 1e-9
    )


@pytest.mark.skipif(
    not (NODE_BIN / "claude").exists(), reason="run `make agents` (npm ci) for the claude CLI"
)
def test_claude_gets_the_system_prompt_file_of_its_variant(tmp_path):
    import json

    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "system.md").write_text("You are the MARKER-7431 reviewer.")
    script = [Turn([tool_use("Bash", {"command": WRITE_FIX, "description": "Fix"})]), Turn([text("Fixed.")])]
    with AnthropicMock(script) as api:
        trial = run_example(
            tmp_path,
            "{type: claude-code, model: claude-sonnet-4-6, max_retries: 0, system_prompt_file: system.md}",
            [f"agent.base_url={api.url}"],
            {"ANTHROPIC_API_KEY": "sk-test-not-a-real-key"},
        )
        systems = [json.dumps(request["body"].get("system")) for request in api.model_requests()]

    assert trial.status == "passed", (trial.error_category, trial.error_message, trial.agent_stderr[-2000:])
    assert systems and all("MARKER-7431" in system for system in systems)


@pytest.mark.skipif(
    not (NODE_BIN / "claude").exists(), reason="run `make agents` (npm ci) for the claude CLI"
)
def test_claude_runs_on_an_auth_token_which_the_gateway_sends_as_a_bearer(tmp_path):
    token = "tok-test-bearer-7788"
    script = [Turn([tool_use("Bash", {"command": WRITE_FIX, "description": "Fix"})]), Turn([text("Fixed.")])]
    with AnthropicMock(script) as api:
        trial = run_example(
            tmp_path,
            "{type: claude-code, model: claude-sonnet-4-6, max_retries: 0}",
            [f"agent.base_url={api.url}"],
            {"ANTHROPIC_API_KEY": "", "ANTHROPIC_AUTH_TOKEN": token},
        )
        requests = api.model_requests()

    assert trial.status == "passed", (trial.error_category, trial.error_message, trial.agent_stderr[-2000:])
    headers = [{name.lower(): value for name, value in r["headers"].items()} for r in requests]
    assert headers and {h.get("authorization") for h in headers} == {f"Bearer {token}"}
    assert not any(h.get("x-api-key") for h in headers)
    assert token not in trial.agent_stdout + trial.agent_stderr
