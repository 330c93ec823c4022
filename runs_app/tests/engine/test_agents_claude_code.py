"""Claude Code: the stream parser on the recorded samples, the argv/env it is run with, set-up errors."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from runs_app.engine.agents import AgentSetupError, base, get_agent
from runs_app.engine.agents.claude_code import ClaudeStreamParser

SAMPLES = Path(__file__).parents[1] / "fixtures" / "agent-samples"
KEY = {"ANTHROPIC_API_KEY": "sk-test"}


def feed(name: str, parser: ClaudeStreamParser | None = None) -> tuple[ClaudeStreamParser, list]:
    parser = parser or ClaudeStreamParser()
    events = []
    for line in (SAMPLES / name).read_text().splitlines():
        events += parser.feed_line(line)
    return parser, events


def exit_code(name: str) -> int:
    return int((SAMPLES / (name.rsplit(".", 1)[0] + ".exit_code")).read_text())


def process(code: int = 0, **fields) -> SimpleNamespace:
    defaults = {
        "signal": None,
        "stdout": b"",
        "stderr": b"",
        "timed_out": False,
        "cancelled": False,
        "killed": False,
    }
    return SimpleNamespace(exit_code=code, **{**defaults, **fields})


def finish(name: str):
    parser, _ = feed(name)
    return parser, get_agent("claude-code").finish(process(exit_code(name)), parser)


# Totals from FORMATS.md "usage arithmetic": result.usage sums the API calls; sonnet-4-6 list
# prices give total_cost_usd. (input, cache_creation, cache_read, output, cost, turns)
FIX_TOTALS = (3100, 400, 300, 81, 0.012105, 2)


@pytest.mark.parametrize(
    ("sample", "tools", "totals"),
    [
        ("claude-stream-fix.jsonl", ["Bash"], FIX_TOTALS),
        ("claude-stream-write.jsonl", ["Write"], FIX_TOTALS),
        ("claude-stream-partial-fix.jsonl", ["Bash"], FIX_TOTALS),
        ("claude-stream-multi.jsonl", ["Read", "Edit", "Bash"], (6600, 800, 1800, 166, 0.02583, 4)),
        ("claude-2.1.332-stream-fix.jsonl", ["Bash"], FIX_TOTALS),
        ("claude-2.1.332-stream-write.jsonl", ["Write"], FIX_TOTALS),
    ],
)
def test_it_counts_tool_calls_usage_cost_and_turns_on_each_success_sample(sample, tools, totals):
    parser, outcome = finish(sample)

    assert [call["name"] for call in parser.tool_calls] == tools
    assert all(call["status"] == "success" for call in parser.tool_calls)
    usage = parser.usage
    assert (
        usage.input_tokens,
        usage.cache_creation_tokens,
        usage.cache_read_tokens,
        usage.output_tokens,
    ) == totals[:4]
    assert usage.cost_usd == pytest.approx(totals[4])
    assert usage.turns == totals[5]
    assert usage.total_tokens == sum(totals[:4])
    assert outcome.status == "completed" and outcome.error is None
    assert outcome.final_text.startswith(("Fixed add()", "Created test_calc.py"))


def test_it_counts_one_api_message_once_when_it_spans_several_lines():
    parser = ClaudeStreamParser()
    lines = (SAMPLES / "claude-stream-write.jsonl").read_text().splitlines()
    for line in lines[:3]:  # init, then text and Write tool_use of the same message.id
        parser.feed_line(line)

    assert (parser.usage.input_tokens, parser.usage.cache_creation_tokens, parser.usage.turns) == (
        1500,
        200,
        1,
    )


def test_it_keeps_running_totals_live_and_lets_the_result_line_correct_them():
    parser = ClaudeStreamParser()
    lines = (SAMPLES / "claude-stream-fix.jsonl").read_text().splitlines()
    seen = []
    for line in lines:
        parser.feed_line(line)
        seen.append((parser.usage.input_tokens, parser.usage.output_tokens, parser.usage.turns))

    # Before the result line only the message_start snapshots are known (output_tokens 1 each).
    assert seen[1] == (1500, 1, 1)
    assert seen[3] == (3100, 2, 2)
    assert seen[4] == (3100, 81, 2)
    # The live cost is estimated from list prices; the CLI's own figure replaces it at the end.
    live = (3100 * 3 + 2 * 15 + 400 * 3.75 + 300 * 0.30) / 1_000_000
    parser_before_result = ClaudeStreamParser()
    for line in lines[:4]:
        parser_before_result.feed_line(line)
    assert parser_before_result.usage.cost_usd == pytest.approx(live)
    assert parser.usage.cost_usd == pytest.approx(0.012105)


def test_it_takes_real_output_tokens_from_partial_message_deltas():
    parser = ClaudeStreamParser()
    lines = (SAMPLES / "claude-stream-partial-fix.jsonl").read_text().splitlines()
    for line in lines[:-1]:  # everything but the result line
        parser.feed_line(line)

    assert parser.usage.output_tokens == 40 + 41
    assert parser.usage.input_tokens == 3100


def test_it_emits_messages_tool_calls_results_and_usage_in_order():
    _, events = feed("claude-stream-fix.jsonl")

    kinds = [e.kind for e in events]
    assert kinds == ["system", "usage", "tool_call", "tool_result", "usage", "message", "usage"]
    call = events[2].data
    assert call["name"] == "Bash" and call["input"]["command"].startswith("sed -i")
    assert events[3].data == {"id": call["id"], "name": "Bash", "is_error": False, "output": "5"}
    assert events[-1].data["total_tokens"] == 3881


@pytest.mark.parametrize(
    ("sample", "category", "text", "retries"),
    [
        ("claude-stream-error.jsonl", "api_error", "API Error: 500", 10),
        ("claude-stream-error-500-retries2.jsonl", "api_error", "API Error: 500", 2),
        ("claude-json-error.json", "api_error", "API Error: 500", 0),
        ("claude-stream-error-529-retries2.jsonl", "overloaded", "API Error: 529", 2),
        ("claude-stream-error-down-retries2.jsonl", "connection", "Unable to connect to API", 2),
        ("claude-stream-error-400.jsonl", "prompt_too_long", "Prompt is too long", 0),
    ],
)
def test_it_classifies_each_api_error_sample(sample, category, text, retries):
    parser, outcome = finish(sample)

    assert exit_code(sample) == 1
    assert outcome.status == "error"
    assert outcome.error_category == category
    assert text in outcome.error
    assert len(parser.retries) == retries
    assert parser.usage.total_tokens == 0 and parser.usage.turns == 0


def test_it_flags_a_rejected_key_as_fatal_at_the_first_retry():
    parser = ClaudeStreamParser()
    lines = (SAMPLES / "claude-stream-error-401.jsonl").read_text().splitlines()
    parser.feed_line(lines[0])
    assert parser.fatal is None
    parser.feed_line(lines[1])  # first api_retry with error authentication_failed

    assert parser.fatal_category == "auth" and "ANTHROPIC_API_KEY" in parser.fatal
    # Stopped there by the runner, the trial still ends as an auth error, not a cancel.
    outcome = get_agent("claude-code").finish(process(-15, signal=15, cancelled=True, killed=True), parser)
    assert (outcome.status, outcome.error_category) == ("error", "auth")
    _, full = finish("claude-stream-error-401.jsonl")
    assert (full.status, full.error_category) == ("error", "auth")


def test_an_api_error_reported_as_the_cli_is_stopped_for_its_timeout_is_the_timeout():
    # Stopped for its wall clock, the CLI loses its forwarder first and may say it cannot connect.
    parser, _ = feed("claude-stream-error-down-retries2.jsonl")
    outcome = get_agent("claude-code").finish(process(-9, signal=9, timed_out=True, killed=True), parser)

    assert (outcome.status, outcome.limit) == ("limit", "timeout")


def test_it_reports_max_turns_as_a_limit_not_an_error():
    parser, outcome = finish("claude-stream-maxturns.jsonl")

    assert (outcome.status, outcome.limit) == ("limit", "max_turns")
    assert outcome.error == "Reached maximum number of turns (1)"
    assert [call["name"] for call in parser.tool_calls] == ["Read"]
    assert (parser.usage.input_tokens, parser.usage.output_tokens) == (1500, 40)
    assert parser.usage.cost_usd == pytest.approx(0.00585)
    # One API call was made; the CLI's num_turns also counts the blocked next call.
    assert (parser.usage.turns, parser.cli_num_turns) == (1, 2)


def test_it_records_permission_denials_without_failing_the_run():
    parser, outcome = finish("claude-stream-permission-denied.jsonl")

    assert outcome.status == "completed"
    assert [(d["tool_name"], d["tool_input"]["description"]) for d in outcome.permission_denials] == [
        ("Bash", "Fix add() and verify")
    ]
    call = parser.tool_calls[0]
    assert (call["status"], call["denied"]) == ("error", True)
    assert "requires approval" in call["output"]


def test_it_reads_the_single_json_result_object():
    parser, outcome = finish("claude-json-fix.json")

    assert outcome.status == "completed"
    assert (parser.usage.input_tokens, parser.usage.output_tokens, parser.usage.turns) == (3100, 81, 2)
    assert parser.usage.cost_usd == pytest.approx(0.012105)


def test_it_calls_a_stream_without_its_result_line_an_error():
    parser = ClaudeStreamParser()
    for line in (SAMPLES / "claude-stream-fix.jsonl").read_text().splitlines()[:-1]:
        parser.feed_line(line)

    outcome = get_agent("claude-code").finish(process(0, stderr=b"segfault"), parser)
    assert (outcome.status, outcome.error_category) == ("error", "no_result")
    assert "segfault" in outcome.error


def test_it_tells_timeout_cancel_and_budget_stops_apart():
    agent = get_agent("claude-code")
    lines = (SAMPLES / "claude-stream-fix.jsonl").read_text().splitlines()[:2]

    def partial() -> ClaudeStreamParser:
        parser = ClaudeStreamParser()
        for line in lines:
            parser.feed_line(line)
        return parser

    timed_out = agent.finish(process(-9, signal=9, timed_out=True, killed=True), partial())
    cancelled = agent.finish(process(-15, signal=15, cancelled=True, killed=True), partial())
    budget = agent.finish(process(-15, signal=15, cancelled=True), partial(), limit_hit="max_usd")
    assert (timed_out.status, timed_out.limit) == ("limit", "timeout")
    assert cancelled.status == "cancelled"
    assert (budget.status, budget.limit) == ("limit", "max_usd")


def test_it_turns_lines_that_are_not_json_into_output_events():
    parser = ClaudeStreamParser()

    assert [e.kind for e in parser.feed_line("Warning: no stdin data received in 3s")] == ["output"]
    assert parser.feed_line("   ") == []


# --- prepare(): argv, environment, set-up errors ---------------------------------------------


@pytest.fixture
def fake_claude(tmp_path: Path) -> str:
    path = tmp_path / "bin" / "claude"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


def test_it_builds_the_argv_users_run(fake_claude, tmp_path):
    config = {
        "binary": fake_claude,
        "model": "claude-sonnet-4-6",
        "permission_mode": "acceptEdits",
        "allowed_tools": ["Bash", "Edit"],
        "max_turns": 7,
        "append_system_prompt": "Be brief.",
        "extra_args": ["--effort", "low"],
    }
    invocation = get_agent("claude-code").prepare("Fix calc.py", tmp_path, tmp_path / "home", config, KEY)

    assert invocation.argv == [
        fake_claude, "-p", "Fix calc.py", "--output-format", "stream-json", "--verbose",
        "--model", "claude-sonnet-4-6", "--permission-mode", "acceptEdits", "--allowedTools", "Bash,Edit",
        "--max-turns", "7", "--append-system-prompt", "Be brief.", "--exclude-dynamic-system-prompt-sections",
        "--setting-sources=project", "--effort", "low",
    ]  # fmt: skip
    assert invocation.stdin == b""


# --- coder-eval's Claude Code options, as its SDK (claude_agent_sdk 0.2.189) passes them ---------


def _options(fake_claude, tmp_path, **config) -> list[str]:
    invocation = get_agent("claude-code").prepare(
        "p", tmp_path, tmp_path, {"binary": fake_claude, **config}, KEY
    )
    return invocation.argv[invocation.argv.index("--verbose") + 1 :]


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_a_system_prompt_is_appended_to_claude_codes_own_by_default(fake_claude, tmp_path):
    argv = _options(fake_claude, tmp_path, system_prompt="Be terse.")

    assert _after(argv, "--append-system-prompt") == "Be terse."
    assert "--exclude-dynamic-system-prompt-sections" in argv and "--system-prompt" not in argv


def test_system_prompt_mode_replace_sends_the_whole_system_prompt(fake_claude, tmp_path):
    argv = _options(fake_claude, tmp_path, system_prompt="You grade.", system_prompt_mode="replace")

    assert _after(argv, "--system-prompt") == "You grade."
    assert "--append-system-prompt" not in argv and "--exclude-dynamic-system-prompt-sections" not in argv


def test_replace_without_a_prompt_or_two_appended_prompts_are_refused(fake_claude, tmp_path):
    with pytest.raises(AgentSetupError, match="system_prompt_mode: replace needs system_prompt"):
        _options(fake_claude, tmp_path, system_prompt_mode="replace")
    with pytest.raises(AgentSetupError, match="append_system_prompt: system_prompt is appended"):
        _options(fake_claude, tmp_path, system_prompt="a", append_system_prompt="b")


def test_setting_sources_default_to_the_project_and_may_be_none(fake_claude, tmp_path):
    assert "--setting-sources=project" in _options(fake_claude, tmp_path)
    assert "--setting-sources=" in _options(fake_claude, tmp_path, setting_sources=[])
    assert "--setting-sources=user,project" in _options(
        fake_claude, tmp_path, setting_sources=["user", "project"]
    )
    with pytest.raises(AgentSetupError, match="setting_sources: must be a list of user, project, local"):
        _options(fake_claude, tmp_path, setting_sources=["global"])


def test_plugins_become_plugin_dirs_and_settings_a_settings_argument(fake_claude, tmp_path):
    plugins = [{"type": "local", "path": "/bundle/plugins/a"}, {"type": "local", "path": "/bundle/plugins/b"}]
    argv = _options(
        fake_claude, tmp_path, plugins=plugins, claude_settings={"permissions": {"deny": ["Read(x)"]}}
    )

    assert [argv[i + 1] for i, arg in enumerate(argv) if arg == "--plugin-dir"] == [
        "/bundle/plugins/a",
        "/bundle/plugins/b",
    ]
    assert json.loads(_after(argv, "--settings")) == {"permissions": {"deny": ["Read(x)"]}}
    assert (
        _after(_options(fake_claude, tmp_path, claude_settings=".claude/eval.json"), "--settings")
        == ".claude/eval.json"
    )


def test_context_window_sets_the_cli_auto_compact_window(fake_claude, tmp_path):
    config = {"binary": fake_claude, "context_window": 200_000}
    invocation = get_agent("claude-code").prepare("p", tmp_path, tmp_path, config, KEY)

    assert invocation.env_extra["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == "200000"
    with pytest.raises(AgentSetupError, match="context_window: must be an integer from 100000 to 1000000"):
        _options(fake_claude, tmp_path, context_window=50_000)
    with pytest.raises(AgentSetupError, match="autoCompactWindow"):
        _options(
            fake_claude, tmp_path, context_window=200_000, claude_settings={"autoCompactWindow": 300_000}
        )


def test_sdk_options_reach_the_cli_as_the_sdk_passes_them(fake_claude, tmp_path):
    sdk = {
        "effort": "high", "fallback_model": "claude-haiku-4-5", "betas": ["context-1m-2025-08-07"],
        "thinking": {"type": "enabled", "budget_tokens": 4000}, "include_hook_events": True,
        "strict_mcp_config": True, "output_format": {"type": "json_schema", "schema": {"type": "object"}},
        "enable_file_checkpointing": True, "client_app": "suite/1.0",
    }  # fmt: skip
    config = {"binary": fake_claude, "sdk_options": sdk}
    invocation = get_agent("claude-code").prepare("p", tmp_path, tmp_path, config, KEY)
    argv = invocation.argv

    assert _after(argv, "--effort") == "high" and _after(argv, "--fallback-model") == "claude-haiku-4-5"
    assert (
        _after(argv, "--betas") == "context-1m-2025-08-07" and _after(argv, "--max-thinking-tokens") == "4000"
    )
    assert "--include-hook-events" in argv and "--strict-mcp-config" in argv
    assert json.loads(_after(argv, "--json-schema")) == {"type": "object"}
    assert invocation.env_extra["CLAUDE_CODE_ENABLE_SDK_FILE_CHECKPOINTING"] == "true"
    assert invocation.env_extra["CLAUDE_AGENT_SDK_CLIENT_APP"] == "suite/1.0"
    adaptive = _options(
        fake_claude, tmp_path, sdk_options={"thinking": {"type": "adaptive", "display": "summarized"}}
    )
    assert (
        _after(adaptive, "--thinking") == "adaptive"
        and _after(adaptive, "--thinking-display") == "summarized"
    )


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("verbatim_prompts", "cannot reach the Claude Code CLI: it marks the SDK's stream-json input"),
        ("user", "cannot reach the Claude Code CLI: it names the OS user"),
        ("max_turns", "is the harness's"),
        ("hooks", "is the harness's"),
        ("efort", "is not a ClaudeAgentOptions field"),
    ],
)
def test_sdk_options_the_cli_cannot_take_are_refused_by_name(fake_claude, tmp_path, key, message):
    with pytest.raises(AgentSetupError, match=f"sdk_options.{key}: .*{message}"):
        _options(fake_claude, tmp_path, sdk_options={key: True})


def test_a_later_turn_resumes_the_session_the_stream_reported(fake_claude, tmp_path):
    parser = get_agent("claude-code").parser()
    parser.feed_line('{"type": "system", "subtype": "init", "session_id": "5e55-10n", "tools": []}')
    config = {"binary": fake_claude, "model": "claude-sonnet-4-6"}

    invocation = get_agent("claude-code").resume(
        "Use a.txt", parser.session_id, tmp_path, tmp_path, config, KEY
    )

    assert invocation.argv[:3] == [fake_claude, "-p", "Use a.txt"]
    assert invocation.argv[-2:] == ["--resume", "5e55-10n"]


def test_it_sets_the_environment_and_asks_for_the_key_as_a_secret(fake_claude, tmp_path):
    secrets = {**KEY, "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}
    config = {"binary": fake_claude, "max_retries": 2}
    invocation = get_agent("claude-code").prepare("p", tmp_path, tmp_path, config, secrets)

    assert invocation.env_extra == {
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
        "CLAUDE_CODE_MAX_RETRIES": "2",
    }
    assert invocation.secrets_needed == ["ANTHROPIC_API_KEY"]
    assert "sk-test" not in repr(invocation)


def test_it_sends_long_prompts_and_dash_prompts_on_stdin(fake_claude, tmp_path):
    agent = get_agent("claude-code")
    for prompt in ("x" * 200_000, "- fix the bug"):
        invocation = agent.prepare(prompt, tmp_path, tmp_path, {"binary": fake_claude}, KEY)
        assert invocation.argv[1:3] == ["-p", "--output-format"]
        assert invocation.stdin == prompt.encode()


def test_it_says_which_key_to_set_when_it_is_missing(fake_claude, tmp_path):
    with pytest.raises(AgentSetupError, match="ANTHROPIC_API_KEY.*environment of the worker"):
        get_agent("claude-code").prepare("p", tmp_path, tmp_path, {"binary": fake_claude}, {})


def test_it_says_what_to_install_when_the_cli_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(base, "PROJECT_ROOT", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("EVALSITE_CLAUDE_BIN", raising=False)

    with pytest.raises(AgentSetupError, match=r"make agents.*EVALSITE_CLAUDE_BIN") as error:
        get_agent("claude-code").prepare("p", tmp_path, tmp_path, {}, {})
    assert "ANTHROPIC_API_KEY" in str(error.value)  # both problems in one message
    with pytest.raises(AgentSetupError, match="not an executable"):
        get_agent("claude-code").prepare("p", tmp_path, tmp_path, {"binary": str(tmp_path / "nope")}, KEY)


def test_it_looks_for_the_cli_in_config_env_node_modules_then_path(fake_claude, tmp_path, monkeypatch):
    agent = get_agent("claude-code")
    local = tmp_path / "project" / "node_modules" / ".bin" / "claude"
    local.parent.mkdir(parents=True)
    local.write_text("#!/bin/sh\n")
    local.chmod(0o755)
    on_path = tmp_path / "path"
    on_path.mkdir()
    (on_path / "claude").write_text("#!/bin/sh\n")
    (on_path / "claude").chmod(0o755)
    monkeypatch.setattr(base, "PROJECT_ROOT", tmp_path / "project")
    monkeypatch.setenv("PATH", str(on_path))
    monkeypatch.setenv("EVALSITE_CLAUDE_BIN", fake_claude)

    def binary(config: dict) -> str:
        return agent.prepare("p", tmp_path, tmp_path, config, KEY).argv[0]

    assert binary({"binary": str(local)}) == str(local)
    assert binary({}) == fake_claude
    monkeypatch.delenv("EVALSITE_CLAUDE_BIN")
    assert binary({}) == str(local)
    local.unlink()
    assert binary({}) == os.path.join(on_path, "claude")


@pytest.mark.parametrize("reported", ["NaN", "Infinity", "-1", '"12"', "null"])
def test_a_total_cost_that_is_not_a_finite_amount_is_stored_as_unknown(reported):
    line = (SAMPLES / "claude-json-fix.json").read_text().strip()
    parser, _ = feed("claude-json-fix.json")
    broken = ClaudeStreamParser()
    # Python's json reads NaN and Infinity: the parser must not pass them on as a cost.
    broken.feed_line(line.replace('"total_cost_usd":0.012105000000000001', f'"total_cost_usd":{reported}'))
    assert '"total_cost_usd":0.012105000000000001' in line
    assert broken.usage.cost_usd == 0.0 and parser.usage.cost_usd == pytest.approx(0.012105)
