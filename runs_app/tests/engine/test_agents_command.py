"""The none, oracle and command agents, the shared outcome rules and the budget check."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest

from runs_app.engine.agents import AgentSetupError, get_agent, write_files
from runs_app.engine.agents.command import CommandParser
from runs_app.engine.usage import Usage, budget_crossed


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


def test_it_runs_nothing_for_the_none_agent(tmp_path):
    agent = get_agent("none")
    invocation = agent.prepare("Fix it", tmp_path, tmp_path, {}, {})

    assert invocation.argv is None
    assert agent.finish(None, agent.parser()).status == "completed"


def test_it_copies_the_reference_over_the_workspace(tmp_path):
    reference, workspace = tmp_path / "reference", tmp_path / "ws"
    (reference / "pkg").mkdir(parents=True)
    (reference / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (reference / "pkg" / "run.sh").write_text("#!/bin/sh\n")
    (reference / "pkg" / "run.sh").chmod(0o755)
    workspace.mkdir()
    (workspace / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (workspace / "README.md").write_text("kept")

    invocation = get_agent("oracle").prepare("p", workspace, tmp_path, {"reference_path": str(reference)}, {})

    assert invocation.argv is None
    assert "a + b" in (workspace / "calc.py").read_text()
    assert (workspace / "README.md").read_text() == "kept"
    assert (workspace / "pkg" / "run.sh").stat().st_mode & 0o111


def test_it_explains_a_missing_reference(tmp_path):
    oracle = get_agent("oracle")
    with pytest.raises(AgentSetupError, match="no reference solution"):
        oracle.prepare("p", tmp_path, tmp_path, {}, {})
    with pytest.raises(AgentSetupError, match="does not exist"):
        oracle.prepare("p", tmp_path, tmp_path, {"reference_path": str(tmp_path / "missing")}, {})


def test_it_runs_a_command_string_with_the_prompt_on_stdin(tmp_path):
    config = {"command": "python3 solve.py", "task_id": "calc-fix", "env": {"MODE": "fast"}}
    invocation = get_agent("command").prepare("Fix it", tmp_path, tmp_path, config, {})

    assert invocation.argv == ["sh", "-c", "python3 solve.py"]
    assert invocation.stdin == b"Fix it"
    assert invocation.env_extra == {
        "MODE": "fast", "EVALSITE_TASK_ID": "calc-fix", "EVALSITE_TURN": "1", "EVALSITE_SESSION_ID": "",
    }  # fmt: skip
    assert invocation.files_to_write == {}


def test_a_later_turn_runs_the_command_again_with_the_reply_and_the_session_it_reported(tmp_path):
    agent = get_agent("command")
    parser = agent.parser()
    parser.feed_line('{"type": "session", "id": "s-42"}')
    config = {"command": "python3 solve.py", "task_id": "t", "turn": 3}

    invocation = agent.resume("Use a.txt", parser.session_id, tmp_path, tmp_path, config, {})

    assert agent.can_resume and invocation.stdin == b"Use a.txt"
    assert (invocation.env_extra["EVALSITE_TURN"], invocation.env_extra["EVALSITE_SESSION_ID"]) == (
        "3",
        "s-42",
    )


def test_it_can_put_the_prompt_in_a_file(tmp_path):
    config = {"command": ["./agent", "--go"], "prompt_via": "file"}
    invocation = get_agent("command").prepare("Fix it", tmp_path, tmp_path, config, {})

    assert invocation.argv == ["./agent", "--go"]
    assert invocation.env_extra["EVALSITE_PROMPT_FILE"] == str(tmp_path / "PROMPT.md")
    assert invocation.stdin == b""
    write_files(invocation)
    assert (tmp_path / "PROMPT.md").read_text() == "Fix it"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "set `command`"),
        ({"command": "  "}, "set `command`"),
        ({"command": ["ok", 3]}, "set `command`"),
        ({"command": "x", "prompt_via": "argv"}, "prompt_via must be"),
        ({"command": "x", "secrets": ["MY_TOKEN"]}, "MY_TOKEN.*worker"),
    ],
)
def test_it_rejects_bad_command_configs(tmp_path, config, message):
    with pytest.raises(AgentSetupError, match=message):
        get_agent("command").prepare("p", tmp_path, tmp_path, config, {})


def test_it_passes_declared_secrets_by_name_only(tmp_path):
    config = {"command": "x", "secrets": ["MY_TOKEN"]}
    invocation = get_agent("command").prepare("p", tmp_path, tmp_path, config, {"MY_TOKEN": "t0k"})

    assert invocation.secrets_needed == ["MY_TOKEN"]
    assert "t0k" not in repr(invocation)


def test_it_parses_the_json_lines_protocol_and_plain_output():
    parser = CommandParser()
    lines = [
        "starting",
        '{"type": "message", "text": "Looking at calc.py"}',
        '{"type": "tool_call", "name": "Bash", "input": {"command": "pytest"}}',
        '{"type": "tool_call", "name": "Edit", "input": {"file_path": "calc.py"}, "status": "error"}',
        '{"type": "usage", "input_tokens": 100, "output_tokens": 20, "cost_usd": 0.5}',
        '{"type": "usage", "input_tokens": 50, "output_tokens": "lots", "cache_read_tokens": 7, '
        '"cost_usd": 0.25}',
        '{"type": "something-else"}',
        "[1, 2]",
        '{"type": "message", "text": "Done"}',
    ]
    kinds = [event.kind for line in lines for event in parser.feed_line(line)]

    assert kinds == [
        "output",
        "message",
        "tool_call",
        "tool_call",
        "usage",
        "usage",
        "output",
        "output",
        "message",
    ]
    assert [(c["name"], c["status"]) for c in parser.tool_calls] == [("Bash", "success"), ("Edit", "error")]
    usage = parser.usage
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.turns) == (150, 20, 7, 2)
    assert usage.cost_usd == pytest.approx(0.75)
    assert parser.final_text == "Done"


def test_it_runs_a_real_command_agent_end_to_end(tmp_path):
    script = (
        "import json, sys\n"
        "prompt = sys.stdin.read()\n"
        "open('calc.py', 'w').write('def add(a, b):\\n    return a + b\\n')\n"
        "print(json.dumps({'type': 'tool_call', 'name': 'Write', 'input': {'file_path': 'calc.py'}}))\n"
        "print(json.dumps({'type': 'usage', 'input_tokens': len(prompt), 'output_tokens': 3}))\n"
        "print('plain words')\n"
    )
    (tmp_path / "agent.py").write_text(script)
    agent = get_agent("command")
    invocation = agent.prepare("Fix calc", tmp_path, tmp_path, {"command": "python3 agent.py"}, {})
    done = subprocess.run(
        invocation.argv, cwd=tmp_path, input=invocation.stdin, capture_output=True, timeout=20
    )
    parser = agent.parser()
    events = [event for line in done.stdout.decode().splitlines() for event in parser.feed_line(line)]

    outcome = agent.finish(process(done.returncode), parser)
    assert outcome.status == "completed"
    assert [c["name"] for c in outcome.tool_calls] == ["Write"]
    assert outcome.usage.input_tokens == len("Fix calc")
    assert events[-1].data == {"text": "plain words"}
    assert "a + b" in (tmp_path / "calc.py").read_text()


def test_it_classifies_command_exits_from_the_stream_first():
    agent = get_agent("command")

    def outcome(result, lines=(), **kw):
        parser = agent.parser()
        for line in lines:
            parser.feed_line(line)
        return agent.finish(result, parser, **kw)

    nonzero = outcome(process(3))
    assert (nonzero.status, nonzero.notes) == ("completed", ["exit code 3"])
    missing = outcome(process(127, stderr=b"sh: 1: nope: not found"))
    assert (missing.status, missing.error_category) == ("error", "crash") and "not found" in missing.error
    reported = outcome(process(0), ['{"type": "error", "message": "quota gone", "category": "rate_limit"}'])
    assert (reported.status, reported.error, reported.error_category) == ("error", "quota gone", "rate_limit")
    assert outcome(process(-9, signal=9, killed=True, timed_out=True)).limit == "timeout"
    assert outcome(process(-9, signal=9, killed=True, cancelled=True)).status == "cancelled"
    assert outcome(process(-11, signal=11)).error_category == "crash"
    assert outcome(process(-15, cancelled=True), limit_hit="max_total_tokens").limit == "max_total_tokens"


def test_it_names_the_budget_a_usage_crosses():
    usage = Usage(input_tokens=900, output_tokens=50, cache_read_tokens=40, cache_creation_tokens=10, turns=3)

    assert budget_crossed(usage, {}) is None
    assert budget_crossed(usage, {"max_total_tokens": 1000}) is None
    assert budget_crossed(usage, {"max_total_tokens": 999}) == "max_total_tokens"
    assert budget_crossed(usage, {"max_usd": 0.0}) is None  # no cost known: cannot judge
    usage.cost_usd = 0.02
    assert budget_crossed(usage, {"max_usd": 0.01}) == "max_usd"
    assert budget_crossed(usage, {"max_turns": 2}) == "max_turns"
    assert budget_crossed(usage, {"max_turns": 3}) is None
    assert json.loads(json.dumps(usage.as_dict()))["total_tokens"] == 1000
