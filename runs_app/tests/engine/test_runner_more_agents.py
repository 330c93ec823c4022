"""The Gemini CLI, opencode and Aider, the real CLIs from their registries, driven by a real worker
through the model gateway, solve the fix-mean example against local mock model servers."""

import base64

import pytest
from django.conf import settings

from runs_app.models import TrialEvent
from runs_app.tests.engine.test_runner_real_agents import FIX, REAL_KEY, WRITE_FIX, run_example
from runs_app.tests.mock_servers import (
    AnthropicMock,
    ChatMock,
    GeminiMock,
    Turn,
    message,
    shell,
    text,
    tool_use,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

NODE_BIN = settings.BASE_DIR / "node_modules" / ".bin"
AIDER = settings.BASE_DIR / ".agents" / "aider" / "bin" / "aider"
OPENCODE = settings.BASE_DIR / ".agents" / "opencode" / "bin" / "opencode"


# The Gemini CLI refuses commands with a heredoc or substitutions ("Blocked: command
# substitution detected"): the fix goes in base64.
B64_FIX = (
    'python3 -c "import base64, pathlib; '
    f"pathlib.Path('stats.py').write_bytes(base64.b64decode('{base64.b64encode(FIX.encode()).decode()}'))\""
)


def _failure(trial) -> tuple:
    results = [e.data for e in TrialEvent.objects.filter(trial=trial, kind__in=["tool_result", "error"])]
    criteria = [(c.description, c.score, c.details) for c in trial.criterion_results.all()]
    return trial.error_category, trial.error_message, results, criteria, trial.agent_stderr[-1500:]


@pytest.mark.skipif(not (NODE_BIN / "gemini").exists(), reason="run `make agents` for the gemini CLI")
def test_the_real_gemini_cli_solves_an_example_task_through_the_gateway(tmp_path):
    script = [Turn([message("I'll rewrite mean()."), shell(B64_FIX)]), Turn([message("mean() is fixed.")])]
    with GeminiMock(script) as api:
        trial = run_example(
            tmp_path,
            "{type: gemini-cli, model: gemini-2.5-pro, max_retries: 0}",
            [f"agent.base_url={api.url}"],
            {"GEMINI_API_KEY": REAL_KEY},
        )
        sent, requests = list(api.sent_usage), api.model_requests()

    assert trial.status == "passed", _failure(trial)
    # the real key only in the gateway's header, never as the CLI's placeholder or a query key
    assert requests and {r["headers"].get("x-goog-api-key") for r in requests} == {REAL_KEY}
    assert all("key=" not in r["path"] for r in requests)
    cached = sum(u["cachedContentTokenCount"] for u in sent)
    assert (trial.input_tokens, trial.cache_read_tokens) == (
        sum(u["promptTokenCount"] for u in sent) - cached,
        cached,
    )
    assert trial.output_tokens == sum(u["candidatesTokenCount"] + u["thoughtsTokenCount"] for u in sent)
    assert trial.turns == len(requests) and trial.cost_usd > 0  # priced from the table (gemini-2.5-pro)
    assert TrialEvent.objects.filter(trial=trial, kind="tool_call", data__name="Bash").exists()
    assert REAL_KEY not in trial.agent_stdout + trial.agent_stderr
    assert "+    return total / count" in trial.diff


@pytest.mark.skipif(not OPENCODE.exists(), reason="run `make agents` for the opencode CLI (.agents/opencode)")
def test_the_real_opencode_cli_solves_an_example_task_through_the_gateway(tmp_path):
    script = [Turn([message("Rewriting mean()."), shell(WRITE_FIX)]), Turn([message("Fixed.")])]
    with ChatMock(script) as api:
        trial = run_example(
            tmp_path,
            "{type: opencode, model: gpt-5.5}",
            [f"agent.base_url={api.url}/v1"],
            {"OPENAI_API_KEY": REAL_KEY},
        )
        sent, requests = list(api.sent_usage), api.model_requests()

    assert trial.status == "passed", _failure(trial)
    assert requests and {r["headers"].get("Authorization") for r in requests} == {f"Bearer {REAL_KEY}"}
    assert trial.output_tokens == sum(u["completion_tokens"] for u in sent)
    assert trial.turns == len(requests) == 2  # --title: no title-generating call
    assert TrialEvent.objects.filter(trial=trial, kind="tool_call", data__name="Bash").exists()
    assert REAL_KEY not in trial.agent_stdout + trial.agent_stderr


@pytest.mark.skipif(not AIDER.exists(), reason="run `make agents` for aider (.agents/aider)")
def test_the_real_aider_solves_an_example_task_through_the_gateway(tmp_path):
    # Aider edits files from its reply: in the whole-file format, the file name, then the file.
    script = [Turn([message(f"I'll fix mean().\n\nstats.py\n```\n{FIX}```\n")]), Turn([message("Done.")])]
    with ChatMock(script) as api:
        trial = run_example(
            tmp_path,
            "{type: aider, model: gpt-5.5, edit_format: whole}",
            [f"agent.base_url={api.url}/v1"],
            {"OPENAI_API_KEY": REAL_KEY},
        )
        sent, requests = list(api.sent_usage), api.model_requests()

    assert trial.status == "passed", _failure(trial)
    assert requests and {r["headers"].get("Authorization") for r in requests} == {f"Bearer {REAL_KEY}"}
    assert trial.output_tokens == sum(u["completion_tokens"] for u in sent) and trial.turns == len(requests)
    edits = TrialEvent.objects.filter(trial=trial, kind="tool_call", data__name="Edit")
    assert [e.data["input"]["file_path"] for e in edits] == ["stats.py"]
    assert REAL_KEY not in trial.agent_stdout + trial.agent_stderr


@pytest.mark.skipif(not (NODE_BIN / "claude").exists(), reason="run `make agents` for the claude CLI")
@pytest.mark.parametrize(
    ("provider", "suffix", "key_name", "path_part"),
    [
        (
            "vertex",
            "/v1",
            "VERTEX_ACCESS_TOKEN",
            "/projects/evals-1/locations/europe-west1/publishers/anthropic/",
        ),
        ("bedrock", "", "AWS_BEARER_TOKEN_BEDROCK", "/model/claude-sonnet-4-6/invoke-with-response-stream"),
    ],
)
def test_claude_code_runs_on_vertex_and_bedrock_with_the_gateway_holding_the_token(
    tmp_path, provider, suffix, key_name, path_part
):
    script = [Turn([tool_use("Bash", {"command": WRITE_FIX, "description": "Fix"})]), Turn([text("Fixed.")])]
    with AnthropicMock(script) as api:
        trial = run_example(
            tmp_path,
            f"{{type: claude-code, provider: {provider}, region: europe-west1, project_id: evals-1, "
            "model: claude-sonnet-4-6, max_retries: 0}",
            [f"agent.base_url={api.url}{suffix}"],
            {"ANTHROPIC_API_KEY": "", key_name: REAL_KEY},
        )
        sent, requests = list(api.sent_usage), api.model_requests()

    assert trial.status == "passed", _failure(trial)
    assert requests and all(path_part in r["path"] for r in requests)
    headers = [{name.lower(): value for name, value in r["headers"].items()} for r in requests]
    assert {h.get("authorization") for h in headers} == {f"Bearer {REAL_KEY}"}
    # the gateway read the usage of Vertex's SSE and of Bedrock's binary event stream alike
    assert trial.input_tokens == sum(u["input_tokens"] for u in sent)
    assert trial.output_tokens == sum(u["output_tokens"] for u in sent) and trial.turns == len(requests)
    assert REAL_KEY not in trial.agent_stdout + trial.agent_stderr
