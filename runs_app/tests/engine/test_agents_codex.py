"""Codex: the stream parser on the recorded samples, config.toml and argv, set-up errors."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from runs_app.engine.agents import AgentSetupError, base, get_agent
from runs_app.engine.agents.codex import CodexStreamParser, unwrap_shell

SAMPLES = Path(__file__).parents[1] / "fixtures" / "agent-samples"
KEY = {"OPENAI_API_KEY": "sk-test"}
FIX_COMMAND = "sed -i 's/a - b/a + b/' calc.py && python3 -c 'import calc; print(calc.add(2, 3))'"


def feed(name: str, parser: CodexStreamParser | None = None) -> tuple[CodexStreamParser, list]:
    parser = parser or CodexStreamParser()
    events = []
    for line in (SAMPLES / name).read_text().splitlines():
        events += parser.feed_line(line)
    return parser, events


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
    code = int((SAMPLES / (name.rsplit(".", 1)[0] + ".exit_code")).read_text())
    return parser, get_agent("codex").finish(process(code), parser)


# Usage per FORMATS.md: turn.completed sums the turn's model calls and its input includes the
# cached tokens, which the parser keeps apart: fix = 3300 input of which 600 cached, 93 output.
@pytest.mark.parametrize(
    ("sample", "calls", "usage", "turns"),
    [
        ("codex-exec-fix.jsonl", [("Bash", "success"), ("Bash", "success")], (2700, 600, 93, 15), 3),
        (
            "codex-exec-builtin-ws-fallback.jsonl",
            [("Bash", "success"), ("Bash", "success")],
            (2700, 600, 93, 15),
            3,
        ),
        (
            "codex-exec-multi.jsonl",
            [("Bash", "error"), ("apply_patch", "success"), ("Bash", "success")],
            (3400, 1200, 126, 20),
            4,
        ),
        ("codex-exec-patch.jsonl", [("apply_patch", "success")], (1900, 200, 61, 10), 2),
        ("codex-exec-text.jsonl", [], (1000, 0, 30, 5), 1),
        # The sandbox-denied `sed` is missing from Codex's stream: only `cat` is there.
        ("codex-exec-readonly-denied.jsonl", [("Bash", "success")], (2700, 600, 93, 15), 2),
    ],
)
def test_it_counts_tool_calls_usage_and_turns_on_each_success_sample(sample, calls, usage, turns):
    parser, outcome = finish(sample)

    assert [(call["name"], call["status"]) for call in parser.tool_calls] == calls
    got = parser.usage
    assert (got.input_tokens, got.cache_read_tokens, got.output_tokens, got.reasoning_tokens) == usage
    assert got.total_tokens == usage[0] + usage[1] + usage[2]
    assert got.cost_usd is None  # Codex streams no cost
    assert got.turns == turns
    assert outcome.status == "completed" and outcome.error is None
    assert outcome.final_text


def test_it_unwraps_shell_commands_so_bash_criteria_match_both_clis():
    parser, _ = feed("codex-exec-fix.jsonl")

    first = parser.tool_calls[0]
    assert first["input"]["command"] == FIX_COMMAND
    assert first["input"]["raw_command"].startswith("/bin/bash -lc ")
    assert (first["exit_code"], first["output"]) == (0, "5\n")
    assert parser.tool_calls[1]["input"]["command"] == "cat calc.py"
    assert parser.final_text.startswith("Fixed add() in calc.py")


def test_it_records_failed_commands_and_file_changes():
    parser, events = feed("codex-exec-multi.jsonl")

    failed, change, _ = parser.tool_calls
    assert failed["exit_code"] == 1 and "AssertionError: -1" in failed["output"]
    assert change["input"]["changes"] == [{"path": "/home/dev/work/codex-multi/calc.py", "kind": "update"}]
    reasoning = [e for e in events if e.kind == "message" and e.data.get("reasoning")]
    assert reasoning and reasoning[0].data["text"].startswith("**Checking add()**")


def test_it_emits_events_in_stream_order():
    _, events = feed("codex-exec-fix.jsonl")

    calls = ["tool_call", "tool_result"] * 2
    assert [e.kind for e in events] == ["system", "system", "message", *calls, "message", "usage"]


def test_it_keeps_websocket_fallback_notices_as_warnings():
    parser, events = feed("codex-exec-builtin-ws-fallback.jsonl")

    warnings = [e for e in events if e.data.get("subtype") == "warning"]
    assert len(warnings) == 1 and "Falling back from WebSockets" in warnings[0].data["message"]
    assert len(parser.retry_notices) == 4 and parser.fatal is None


@pytest.mark.parametrize(
    ("sample", "text", "notices"),
    [
        ("codex-exec-error-500.jsonl", "high demand", 1),
        ("codex-exec-error-500-default-retries.jsonl", "high demand", 5),
        ("codex-exec-error-failed.jsonl", "stream disconnected before completion: The model failed", 1),
    ],
)
def test_it_classifies_each_failed_turn(sample, text, notices):
    parser, outcome = finish(sample)

    assert (outcome.status, outcome.error_category, outcome.exit_code) == ("error", "api_error", 1)
    assert text in outcome.error
    assert len(parser.retry_notices) == notices
    assert parser.usage.total_tokens == 0


def test_it_gives_up_on_an_unreachable_server_after_a_few_network_retries():
    parser = CodexStreamParser(network_retry_limit=3)
    lines = (SAMPLES / "codex-exec-error-down.jsonl").read_text().splitlines()
    fatal_at = None
    for number, line in enumerate(lines):
        parser.feed_line(line)
        if parser.fatal and fatal_at is None:
            fatal_at = number

    assert fatal_at == 4  # thread.started, turn.started, then the third "waiting for network"
    assert parser.fatal_category == "connection"
    # The runner stops it there, or the wall clock does: either way an error, not a timeout limit.
    killed = get_agent("codex").finish(process(124, timed_out=True, killed=True), parser)
    assert (killed.status, killed.error_category) == ("error", "connection")
    assert "cannot reach its model server" in killed.error


def test_it_takes_the_network_retry_limit_from_config():
    parser = get_agent("codex").parser({"network_retry_limit": 1})
    lines = (SAMPLES / "codex-exec-error-down.jsonl").read_text().splitlines()
    for line in lines[:3]:
        parser.feed_line(line)

    assert parser.fatal is not None


def test_it_estimates_cost_from_configured_prices():
    parser = get_agent("codex").parser({"prices": {"input": 1.0, "cache_read": 0.1, "output": 10.0}})
    feed("codex-exec-fix.jsonl", parser)

    assert parser.usage.cost_usd == pytest.approx((2700 * 1.0 + 600 * 0.1 + 93 * 10.0) / 1_000_000)


def test_it_calls_a_stream_without_a_finished_turn_an_error():
    parser = CodexStreamParser()
    for line in (SAMPLES / "codex-exec-fix.jsonl").read_text().splitlines()[:-1]:
        parser.feed_line(line)

    outcome = get_agent("codex").finish(process(0), parser)
    assert (outcome.status, outcome.error_category) == ("error", "no_result")


@pytest.mark.parametrize(
    ("wrapped", "inner"),
    [
        ("/bin/bash -lc 'cat calc.py'", "cat calc.py"),
        ('/bin/bash -lc "echo \\"hi\\""', 'echo "hi"'),
        ("/usr/bin/sh -c ls", "ls"),
        ("python3 run.py", "python3 run.py"),
        ("/bin/bash -lc 'unterminated", "/bin/bash -lc 'unterminated"),
    ],
)
def test_it_unwraps_only_shell_wrappers(wrapped, inner):
    assert unwrap_shell(wrapped) == inner


# --- prepare(): argv, CODEX_HOME/config.toml, set-up errors -----------------------------------


@pytest.fixture
def fake_codex(tmp_path: Path) -> str:
    path = tmp_path / "bin" / "codex"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


def prepare(
    config: dict, secrets: dict | None = None, prompt: str = "Fix calc.py", home: Path = Path("/sb/home")
):
    return get_agent("codex").prepare(
        prompt, Path("/sb/ws"), home, config, KEY if secrets is None else secrets
    )


def test_it_builds_the_argv_users_run_with_stdin_closed(fake_codex):
    invocation = prepare({"binary": fake_codex, "model": "gpt-5.5"})

    assert invocation.argv == [
        fake_codex, "exec", "--json", "--skip-git-repo-check", "--sandbox", "workspace-write",
        "-m", "gpt-5.5", "Fix calc.py",
    ]  # fmt: skip
    assert invocation.stdin == b""
    assert invocation.env_extra == {"CODEX_HOME": "/sb/home/.codex"}
    assert invocation.secrets_needed == ["OPENAI_API_KEY"]


def test_a_later_turn_resumes_the_thread_with_the_sandbox_as_a_config_value(fake_codex):
    parser = get_agent("codex").parser()
    parser.feed_line('{"type": "thread.started", "thread_id": "0199-thread"}')
    invocation = get_agent("codex").resume(
        "Use a.txt", parser.session_id, Path("/sb/ws"), Path("/sb/home"), {"binary": fake_codex}, KEY
    )

    assert invocation.argv == [
        fake_codex, "exec", "resume", "--json", "--skip-git-repo-check",
        "-c", 'sandbox_mode="workspace-write"', "0199-thread", "Use a.txt",
    ]  # fmt: skip
    with pytest.raises(AgentSetupError, match="no thread_id to resume"):
        get_agent("codex").resume("x", "", Path("/sb/ws"), Path("/sb/home"), {"binary": fake_codex}, KEY)


def test_it_writes_a_config_toml_pointing_at_the_model_server(fake_codex):
    invocation = prepare(
        {"binary": fake_codex, "model": "gpt-5.5", "base_url": "http://127.0.0.1:9/v1/", "max_retries": 1}
    )

    config = tomllib.loads(invocation.files_to_write["/sb/home/.codex/config.toml"].decode())
    assert config["model"] == "gpt-5.5"
    assert (config["approval_policy"], config["check_for_update_on_startup"]) == ("never", False)
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == "http://127.0.0.1:9/v1"
    assert (provider["wire_api"], provider["env_key"], provider["supports_websockets"]) == (
        "responses",
        "OPENAI_API_KEY",
        False,
    )
    assert (provider["request_max_retries"], provider["stream_max_retries"]) == (1, 1)


def test_it_takes_the_base_url_from_config_then_worker_env_then_openai(fake_codex):
    def base_url(config: dict, secrets: dict) -> str:
        text = prepare({"binary": fake_codex, **config}, {**KEY, **secrets}).files_to_write
        toml = tomllib.loads(next(iter(text.values())).decode())
        return toml["model_providers"]["evalsite"]["base_url"]

    worker = {"OPENAI_BASE_URL": "http://127.0.0.1:7/v1"}
    assert base_url({"base_url": "http://127.0.0.1:8/v1"}, worker) == "http://127.0.0.1:8/v1"
    assert base_url({}, worker) == "http://127.0.0.1:7/v1"
    assert base_url({}, {}) == "https://api.openai.com/v1"


def test_it_escapes_config_strings(fake_codex):
    invocation = prepare({"binary": fake_codex, "model": 'odd"name\\x'})

    assert tomllib.loads(next(iter(invocation.files_to_write.values())).decode())["model"] == 'odd"name\\x'


def test_it_reads_long_prompts_from_stdin(fake_codex):
    invocation = prepare({"binary": fake_codex}, prompt="y" * 200_000)

    assert invocation.argv[-1] == "-" and invocation.stdin == b"y" * 200_000


def test_it_says_which_key_to_set_and_what_to_install(tmp_path, monkeypatch, fake_codex):
    with pytest.raises(AgentSetupError, match="OPENAI_API_KEY"):
        prepare({"binary": fake_codex}, {})
    monkeypatch.setattr(base, "PROJECT_ROOT", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("EVALSITE_CODEX_BIN", raising=False)
    with pytest.raises(
        AgentSetupError, match=r"`codex` CLI is not installed.*make agents.*EVALSITE_CODEX_BIN"
    ):
        prepare({})
