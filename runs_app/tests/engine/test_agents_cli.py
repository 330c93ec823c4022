"""The real Claude Code and Codex CLIs (from the project's node_modules) against local mock servers.

Each test makes a workspace holding a buggy calc.py, runs the CLI exactly as ``prepare()`` says,
with a scrubbed environment and HOME/TMPDIR in a temp folder, feeds its stdout to the parser line
by line (as the runner does), and checks what the parser and ``finish()`` report.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from runs_app.engine.agents import AgentSetupError, get_agent, write_files
from runs_app.engine.agents.base import PROJECT_ROOT, AgentInvocation, BaseParser
from runs_app.engine.usage import budget_crossed
from runs_app.tests.mock_servers import (
    AnthropicMock,
    HttpError,
    OpenAIMock,
    Turn,
    message,
    patch,
    shell,
    text,
    tool_use,
)

CLAUDE = PROJECT_ROOT / "node_modules" / ".bin" / "claude"
CODEX = PROJECT_ROOT / "node_modules" / ".bin" / "codex"
needs_claude = pytest.mark.skipif(
    not CLAUDE.exists(), reason="node_modules/.bin/claude is missing: run `npm ci` in the project root"
)
needs_codex = pytest.mark.skipif(
    not CODEX.exists(), reason="node_modules/.bin/codex is missing: run `npm ci` in the project root"
)
pytestmark = pytest.mark.timeout(30)

DUMMY_KEY = "sk-dummy-offline"
BUGGY = "def add(a, b):\n    return a - b\n"
CHECK = "python3 -B -c 'import calc; print(calc.add(2, 3))'"
PATCH = (
    "*** Begin Patch\n*** Update File: calc.py\n@@\n def add(a, b):\n"
    "-    return a - b\n+    return a + b\n*** End Patch\n"
)
SONNET = {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_read": 0.30}  # USD per MTok


@pytest.fixture
def sandbox(tmp_path: Path) -> SimpleNamespace:
    workspace, home, tmp = tmp_path / "ws", tmp_path / "home", tmp_path / "tmp"
    for folder in (workspace, home, tmp):
        folder.mkdir()
    (workspace / "calc.py").write_text(BUGGY)
    return SimpleNamespace(workspace=workspace, home=home, tmp=tmp)


def drive(
    invocation: AgentInvocation,
    parser: BaseParser,
    sandbox: SimpleNamespace,
    *,
    timeout: float = 25.0,
    should_stop: Callable[[BaseParser], bool] | None = None,
) -> SimpleNamespace:
    """Run the agent like the runner will: own process group, scrubbed env, live parsing, kill on stop."""
    write_files(invocation)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(sandbox.home), "TMPDIR": str(sandbox.tmp)}
    env.update(LANG="C.UTF-8", TERM="dumb", **invocation.env_extra)
    env.update(dict.fromkeys(invocation.secrets_needed, DUMMY_KEY))
    started = time.monotonic()
    proc = subprocess.Popen(
        invocation.argv,
        cwd=sandbox.workspace,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    proc.stdin.write(invocation.stdin or b"")
    proc.stdin.close()
    stderr: list[bytes] = []
    reader = threading.Thread(target=lambda: stderr.append(proc.stderr.read()), daemon=True)
    reader.start()
    flags = {"timed_out": False, "stopped": False}

    def kill(flag: str) -> None:
        flags[flag] = True
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.killpg(proc.pid, signal.SIGKILL)

    watchdog = threading.Timer(timeout, kill, args=("timed_out",))
    watchdog.start()
    stdout = []
    try:
        for raw in proc.stdout:
            stdout.append(raw)
            parser.feed_line(raw.decode())
            if should_stop and should_stop(parser):
                kill("stopped")
                break
        proc.wait(timeout=5)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            kill("stopped")
            proc.wait(timeout=5)
        proc.stdout.close()
    reader.join(timeout=2)
    code = proc.returncode
    return SimpleNamespace(
        exit_code=code,
        signal=-code if code < 0 else None,
        stdout=b"".join(stdout),
        stderr=b"".join(stderr),
        timed_out=flags["timed_out"],
        cancelled=flags["stopped"],
        killed=flags["timed_out"] or flags["stopped"],
        duration_seconds=time.monotonic() - started,
    )


def header(request: dict, name: str) -> str | None:
    return next((v for k, v in request["headers"].items() if k.lower() == name), None)


# --- Claude Code ------------------------------------------------------------------------------


def claude_config(api: AnthropicMock, **extra) -> dict:
    return {"model": "claude-sonnet-4-6", "base_url": api.url, "max_retries": 0, **extra}


@needs_claude
def test_it_fixes_calc_with_the_real_claude_cli(sandbox):
    calc = str(sandbox.workspace / "calc.py")
    script = [
        Turn([tool_use("Read", {"file_path": calc})]),
        Turn(
            [
                text("add() subtracts."),
                tool_use("Edit", {"file_path": calc, "old_string": "a - b", "new_string": "a + b"}),
            ]
        ),
        Turn([tool_use("Bash", {"command": CHECK, "description": "Check add()"})]),
        Turn([text("Fixed add() in calc.py.")]),
    ]
    agent = get_agent("claude-code")
    with AnthropicMock(script) as api:
        invocation = agent.prepare(
            "Fix the bug in calc.py",
            sandbox.workspace,
            sandbox.home,
            claude_config(api),
            {"ANTHROPIC_API_KEY": "k"},
        )
        parser = agent.parser()
        result = drive(invocation, parser, sandbox)

    outcome = agent.finish(result, parser)
    assert outcome.status == "completed", (outcome.error, result.stderr)
    assert (sandbox.workspace / "calc.py").read_text() == BUGGY.replace("a - b", "a + b")
    assert [(c["name"], c["status"]) for c in outcome.tool_calls] == [
        ("Read", "success"),
        ("Edit", "success"),
        ("Bash", "success"),
    ]
    assert outcome.tool_calls[2]["output"].strip() == "5"
    assert outcome.final_text == "Fixed add() in calc.py."
    # The CLI adds up what the server reported, and prices it at the model's list prices.
    sent = api.sent_usage
    usage = outcome.usage
    assert usage.input_tokens == sum(u["input_tokens"] for u in sent)
    assert usage.cache_creation_tokens == sum(u["cache_creation_input_tokens"] for u in sent)
    assert usage.cache_read_tokens == sum(u["cache_read_input_tokens"] for u in sent)
    assert usage.output_tokens == sum(u["output_tokens"] for u in sent)
    expected_cost = (
        usage.input_tokens * SONNET["input"]
        + usage.output_tokens * SONNET["output"]
        + usage.cache_creation_tokens * SONNET["cache_write"]
        + usage.cache_read_tokens * SONNET["cache_read"]
    ) / 1_000_000
    assert usage.cost_usd == pytest.approx(expected_cost)
    assert usage.turns == len(sent) == 4
    request = api.model_requests()[0]
    assert request["body"]["model"] == "claude-sonnet-4-6"
    assert header(request, "x-api-key") == DUMMY_KEY


@needs_claude
def test_it_classifies_a_real_claude_overload_error(sandbox):
    agent = get_agent("claude-code")
    with AnthropicMock(error=HttpError(529, "overloaded_error", "Overloaded (mock)")) as api:
        invocation = agent.prepare(
            "Fix calc.py", sandbox.workspace, sandbox.home, claude_config(api), {"ANTHROPIC_API_KEY": "k"}
        )
        parser = agent.parser()
        result = drive(invocation, parser, sandbox)

    outcome = agent.finish(result, parser)
    assert (outcome.status, outcome.error_category, outcome.exit_code) == ("error", "overloaded", 1)
    assert "529" in outcome.error
    assert (sandbox.workspace / "calc.py").read_text() == BUGGY


@needs_claude
def test_it_stops_real_claude_at_the_first_retry_of_a_rejected_key(sandbox):
    agent = get_agent("claude-code")
    with AnthropicMock(error=HttpError(401, "authentication_error", "invalid x-api-key (mock)")) as api:
        config = claude_config(api, max_retries=5)
        invocation = agent.prepare(
            "Fix calc.py", sandbox.workspace, sandbox.home, config, {"ANTHROPIC_API_KEY": "k"}
        )
        parser = agent.parser()
        result = drive(invocation, parser, sandbox, should_stop=lambda p: p.fatal is not None)

    outcome = agent.finish(result, parser)
    assert (outcome.status, outcome.error_category) == ("error", "auth")
    assert result.cancelled and result.duration_seconds < 10  # 5 retries would take ~15 s


@needs_claude
def test_it_cuts_real_claude_off_when_the_token_budget_is_crossed(sandbox):
    calc = str(sandbox.workspace / "calc.py")
    script = [
        Turn([tool_use("Read", {"file_path": calc})]),
        Turn([text("Never sent in time.")], delay=15),
    ]
    limits = {"max_total_tokens": 1000}  # the first response alone reports 1100 tokens
    agent = get_agent("claude-code")
    with AnthropicMock(script) as api:
        invocation = agent.prepare(
            "Fix calc.py", sandbox.workspace, sandbox.home, claude_config(api), {"ANTHROPIC_API_KEY": "k"}
        )
        parser = agent.parser()
        result = drive(
            invocation, parser, sandbox, should_stop=lambda p: budget_crossed(p.usage, limits) is not None
        )

    outcome = agent.finish(result, parser, limit_hit=budget_crossed(parser.usage, limits))
    assert (outcome.status, outcome.limit) == ("limit", "max_total_tokens")
    assert not parser.finished and result.duration_seconds < 10
    assert parser.usage.total_tokens > 1000 and parser.usage.turns == 1


# --- Codex ------------------------------------------------------------------------------------


def codex_config(api_url: str, **extra) -> dict:
    return {"model": "gpt-5.5", "base_url": api_url + "/v1", "max_retries": 0, **extra}


@needs_codex
def test_it_fixes_calc_with_the_real_codex_cli(sandbox):
    script = [
        Turn([message("Patching add()."), patch(PATCH)]),
        Turn([shell(CHECK)]),
        Turn([message("Fixed add() in calc.py.")]),
    ]
    agent = get_agent("codex")
    with OpenAIMock(script) as api:
        invocation = agent.prepare(
            "Fix the bug in calc.py",
            sandbox.workspace,
            sandbox.home,
            codex_config(api.url),
            {"OPENAI_API_KEY": "k"},
        )
        parser = agent.parser()
        result = drive(invocation, parser, sandbox)

    outcome = agent.finish(result, parser)
    assert outcome.status == "completed", (outcome.error, result.stderr)
    assert (sandbox.workspace / "calc.py").read_text() == BUGGY.replace("a - b", "a + b")
    assert [(c["name"], c["status"]) for c in outcome.tool_calls] == [
        ("apply_patch", "success"),
        ("Bash", "success"),
    ]
    bash = outcome.tool_calls[1]
    assert bash["input"]["command"] == CHECK and bash["output"].strip() == "5"
    assert outcome.final_text == "Fixed add() in calc.py."
    sent = api.sent_usage
    cached = sum(u["input_tokens_details"]["cached_tokens"] for u in sent)
    assert outcome.usage.input_tokens == sum(u["input_tokens"] for u in sent) - cached
    assert outcome.usage.cache_read_tokens == cached
    assert outcome.usage.output_tokens == sum(u["output_tokens"] for u in sent)
    assert outcome.usage.turns == len(api.model_requests()) == 3
    request = api.model_requests()[0]
    assert request["body"]["model"] == "gpt-5.5"
    assert header(request, "authorization") == f"Bearer {DUMMY_KEY}"


@needs_codex
def test_it_classifies_a_real_codex_server_error(sandbox):
    agent = get_agent("codex")
    with OpenAIMock(error=HttpError(500, "server_error", "Internal server error (mock)")) as api:
        invocation = agent.prepare(
            "Fix calc.py", sandbox.workspace, sandbox.home, codex_config(api.url), {"OPENAI_API_KEY": "k"}
        )
        parser = agent.parser()
        result = drive(invocation, parser, sandbox)

    outcome = agent.finish(result, parser)
    assert (outcome.status, outcome.error_category, outcome.exit_code) == ("error", "api_error", 1)
    assert outcome.error


@needs_codex
def test_it_stops_real_codex_early_when_its_server_is_down(sandbox):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    agent = get_agent("codex")
    config = codex_config(f"http://127.0.0.1:{port}", network_retry_limit=1)
    invocation = agent.prepare(
        "Fix calc.py", sandbox.workspace, sandbox.home, config, {"OPENAI_API_KEY": "k"}
    )
    parser = agent.parser(config)
    result = drive(invocation, parser, sandbox, should_stop=lambda p: p.fatal is not None)

    outcome = agent.finish(result, parser)
    assert (outcome.status, outcome.error_category) == ("error", "connection")
    assert result.duration_seconds < 10  # Codex alone would retry forever


def test_it_refuses_to_start_either_cli_without_its_api_key(sandbox):
    for kind, key in (("claude-code", "ANTHROPIC_API_KEY"), ("codex", "OPENAI_API_KEY")):
        with pytest.raises(AgentSetupError, match=key):
            get_agent(kind).prepare("Fix calc.py", sandbox.workspace, sandbox.home, {}, {})
