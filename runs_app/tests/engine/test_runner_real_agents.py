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
