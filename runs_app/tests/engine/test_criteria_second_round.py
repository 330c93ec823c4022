"""coder-eval's second-round criteria, graded in plain Python: reference_comparison,
commands_efficiency, skill_triggered (and its early stop), cli_called on logs the agent may have
spoiled, agent_judge's verdict, and the refusals of their specs. The scores through a worker and
against coder-eval itself: test_runner_coder_eval_criteria.py and bench/criteria_side_by_side.py."""

import json
import subprocess
import sys
from difflib import SequenceMatcher
from pathlib import Path

import pytest
from pydantic import ValidationError

from experiments_app.specs import TaskSpec
from runs_app.engine import criteria
from runs_app.engine.criteria import agent_judge, cli, early_stop, verdict_server
from runs_app.engine.criteria.base import GradingContext, JudgeAgentRun
from runs_app.engine.criteria.reference import node_types

REFERENCE = "def add(a, b):\n    return a + b\n"


def grade_one(criterion: dict, ctx: GradingContext) -> criteria.CriterionResult:
    return criteria.grade([{"description": "", **criterion}], ctx).criteria[0]


@pytest.fixture
def ctx(tmp_path: Path) -> GradingContext:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "solution.py").write_text(REFERENCE)
    return GradingContext(workspace=tmp_path / "ws", reference_dir=tmp_path / "ref")


# ---------------------------------------------------------------- reference_comparison


def test_reference_comparison_scores_the_ast_ratio_and_passes_at_its_similarity_threshold(ctx):
    agent = "def add(a, b):\n    total = a + b\n    return total\n"
    (ctx.workspace / "solution.py").write_text(agent)
    criterion = {"type": "reference_comparison", "agent_file": "solution.py", "reference_file": "solution.py"}

    result = grade_one({**criterion, "similarity_threshold": 0.6}, ctx)

    expected = SequenceMatcher(None, node_types(agent), node_types(REFERENCE)).ratio()
    assert result.score == pytest.approx(expected) and 0 < expected < 1
    assert result.pass_threshold == 0.6 and result.passed
    identical = grade_one({**criterion, "agent_file": "../ref/solution.py"}, ctx)
    assert identical.error.startswith("bad parameters")  # the agent's file stays in the workspace


def test_an_agent_file_that_is_missing_or_not_python_fails_and_a_broken_reference_is_an_error(ctx):
    criterion = {"type": "reference_comparison", "agent_file": "solution.py", "reference_file": "solution.py"}
    missing = grade_one(criterion, ctx)
    assert (missing.score, missing.error) == (0.0, None) and "not found" in missing.details["problem"]
    (ctx.workspace / "solution.py").write_text("def add(:\n")
    broken = grade_one(criterion, ctx)
    assert broken.score == 0.0 and broken.error is None and "SyntaxError" in broken.details["problem"]
    (ctx.reference_dir / "solution.py").write_text("")
    assert "is empty" in grade_one(criterion, ctx).error


def test_complexity_compares_radon_metrics_with_the_references(ctx):
    (ctx.workspace / "solution.py").write_text(REFERENCE)
    result = grade_one(
        {
            "type": "reference_comparison",
            "agent_file": "solution.py",
            "reference_file": "solution.py",
            "comparison_method": "complexity",
        },
        ctx,
    )
    # Same code: each metric at 1/1.5 of the reference's allowance, the function count exact.
    assert result.score == pytest.approx(0.5 * (1 - 1 / 1.5) + 0.3 * (1 - 2 / 3) + 0.2)


# ---------------------------------------------------------------- commands_efficiency, skill_triggered


@pytest.mark.parametrize(("calls", "score"), [(0, 0.0), (1, 1.0), (3, 1.0), (4, 0.75), (12, 0.25)])
def test_commands_efficiency_is_the_budget_over_the_calls_made(ctx, calls, score):
    ctx.tool_calls = [{"name": "Bash", "input": {"command": "ls"}}] * calls
    result = grade_one({"type": "commands_efficiency", "expected_commands": 3}, ctx)
    assert result.score == pytest.approx(score)


def test_skill_triggered_reads_skill_calls_and_skill_files_and_labels_each_row(ctx):
    ctx.tool_calls = [
        {"name": "Skill", "input": {"skill": "anthropic-skills:pdf"}},
        {"name": "Bash", "input": {"command": "cat .agents/skills\\\\docx\\\\SKILL.md"}},
    ]
    positive = grade_one({"type": "skill_triggered", "skill_name": "pdf", "expected_skill": "pdf"}, ctx)
    distractor = grade_one({"type": "skill_triggered", "skill_name": "docx", "expected_skill": "pdf"}, ctx)
    negative = grade_one({"type": "skill_triggered", "skill_name": "xlsx", "expected_skill": ""}, ctx)

    assert (positive.score, positive.details["observed_label"]) == (1.0, "yes")
    assert (distractor.score, distractor.details["expected_label"]) == (0.0, "no")
    assert (negative.score, negative.details["observed_label"]) == (1.0, "no")


def test_an_armed_skill_triggered_stops_a_row_as_soon_as_its_skill_engages():
    positive = {
        "type": "skill_triggered",
        "skill_name": "pdf",
        "expected_skill": "pdf",
        "stop_early": {"on_pass": "stop"},
    }
    distractor = {"type": "skill_triggered", "skill_name": "pdf", "expected_skill": "", "stop_early": {}}
    calls = [{"name": "Read", "input": {"file_path": "x"}}, {"name": "Skill", "input": {"skill": "pdf"}}]

    watcher = early_stop.Watcher([positive], 1.0)
    assert watcher.observe(calls[:1]) is None
    assert watcher.observe(calls).reason == early_stop.CRITERION_PASSED
    stop = early_stop.Watcher([distractor], 1.0).observe(calls)
    assert stop.reason == early_stop.CRITERION_FAILED and stop.tool_call_index == 2


# ---------------------------------------------------------------- cli_called


def write_log(ctx: GradingContext, *records: object) -> None:
    folder = ctx.workspace / "cli_mocks"
    folder.mkdir(exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    (folder / "calls.jsonl").write_text("".join(line + "\n" for line in lines))


def record(*argv: str, **extra: object) -> dict:
    return {"ts": 1.0, "tool": "uip", "argv": list(argv), "exit": 0, **extra}


def test_cli_called_matches_verbs_flags_and_positionals_as_coder_eval_does(ctx):
    write_log(
        ctx,
        record("projects", "delete", "--yes", "proj-1"),
        record("projects", "list", "--output", "json", "--folder=Shared"),
        record("labellings", "unconfirm", "-1"),
    )

    def score(**pattern: object) -> float:
        return grade_one({"type": "cli_called", "tool": "uip", **pattern}, ctx).score

    # `--yes` is a switch, so proj-1 stays positional: the guard sees the delete.
    assert score(verb="projects delete", positional=["proj-1"], min_count=0, max_count=0) == 0.0
    assert score(verb="projects list", flags={"folder": {"equals": "Shared"}}) == 1.0
    assert score(verb="projects", min_count=2) == 1.0
    assert score(verb="labellings confirm") == 0.0  # token by token, never a substring
    assert score(verb="labellings unconfirm", positional=["-1"]) == 1.0  # -1 is a value
    assert score(verb="projects list", flags={"output": "json"}, ignore_flags=[]) == 1.0


@pytest.mark.parametrize(
    ("records", "problem"),
    [
        ((record("x", sidecar_error="ImportError()"),), "could not load its matcher"),
        ((record("x", rule_error="KeyError()"),), "could not evaluate its rules"),
        (("not json",), "are not records"),
        (({"tool": "uip", "argv": "projects list"},), "are not records"),
    ],
)
def test_a_log_that_cannot_be_trusted_fails_even_a_guard(ctx, records, problem):
    write_log(ctx, *records)
    result = grade_one(
        {"type": "cli_called", "tool": "uip", "verb": "x", "min_count": 0, "max_count": 0}, ctx
    )
    assert (result.score, result.error) == (0.0, None) and problem in result.details["problem"]


def test_a_missing_log_or_a_write_error_beside_it_fails_the_check(ctx):
    guard = {"type": "cli_called", "tool": "uip", "verb": "x", "min_count": 0, "max_count": 0}
    assert "cannot be read" in grade_one(guard, ctx).details["problem"]
    write_log(ctx)
    (ctx.workspace / "cli_mocks" / "calls.jsonl.error").write_text("OSError(28) ['x']\n")
    assert "could not write 1 record" in grade_one(guard, ctx).details["problem"]


def test_the_shims_answer_from_their_rules_and_record_each_call(tmp_path):
    entries = [
        {"tool": "uip", "stderr": "no", "responses": [{"when": {"verb": "projects list"}, "stdout": "[1]"}]},
        {"tool": "curl", "exit_code": 7},
    ]
    folder = cli.write_recorders(tmp_path, entries, sys.executable, [])

    listed = subprocess.run([folder / "uip", "projects", "list"], capture_output=True, text=True)
    other = subprocess.run([folder / "uip", "projects", "get", "p"], capture_output=True, text=True)
    curl = subprocess.run([folder / "curl", "-s", "https://x"], capture_output=True, text=True)

    assert (listed.returncode, listed.stdout, other.returncode, other.stderr) == (0, "[1]", 1, "no")
    assert curl.returncode == 7
    usable, unusable = cli.parse_log((folder / "calls.jsonl").read_text())
    assert unusable == 0 and [argv for argv, _ in usable] == [
        ["projects", "list"],
        ["projects", "get", "p"],
        ["-s", "https://x"],
    ]
    assert [r.get("rule") for _, r in usable] == [0, None, None]
    with pytest.raises(ValueError, match="mock_path_dirs folder 'mocks' already provides one"):
        (tmp_path / "mocks").mkdir()
        (tmp_path / "mocks" / "curl").write_text("")
        cli.write_recorders(tmp_path, entries, sys.executable, [tmp_path / "mocks"])


# ---------------------------------------------------------------- agent_judge


def judge_ctx(ctx: GradingContext, run: JudgeAgentRun) -> GradingContext:
    ctx.env = {"ANTHROPIC_API_KEY": "sk-test"}
    ctx.run_judge_agent = lambda request: run
    return ctx


def verdict_call(arguments: dict) -> dict:
    return {"name": agent_judge.VERDICT_TOOL, "input": arguments}


def test_the_last_submitted_verdict_counts(ctx):
    calls = [
        verdict_call({"score": 0.2, "rationale": "first"}),
        verdict_call({"score": 7, "rationale": " a  b "}),
    ]
    result = grade_one(
        {"type": "agent_judge", "prompt": "grade"}, judge_ctx(ctx, JudgeAgentRun(tool_calls=calls))
    )
    assert result.score == 1.0 and result.details["rationale"] == "a b" and result.pass_threshold == 0.7


@pytest.mark.parametrize(
    ("run", "message"),
    [
        (JudgeAgentRun(), "the judge did not call submit_verdict"),
        (
            JudgeAgentRun(tool_calls=[verdict_call({"score": True, "rationale": "x"})]),
            "score field is not a number",
        ),
        (
            JudgeAgentRun(tool_calls=[verdict_call({"score": 0.5, "rationale": "  "})]),
            "rationale field is empty",
        ),
        (JudgeAgentRun(timed_out=True), "timed out after 300s"),
    ],
)
def test_a_judge_without_a_valid_verdict_is_a_judge_error(ctx, run, message):
    result = criteria.grade([{"type": "agent_judge", "prompt": "grade"}], judge_ctx(ctx, run))
    assert message in result.error and result.criteria[0].error.startswith("judge failed: ")


def test_the_judge_gets_the_harness_prompt_and_the_verdict_tool(ctx):
    seen = []
    ctx.env = {"ANTHROPIC_API_KEY": "sk-test", "EVALSITE_JUDGE_MODEL": "m"}
    ctx.run_judge_agent = lambda request: seen.append(request) or JudgeAgentRun()
    (ctx.workspace / "a.py").write_text("print('</untrusted>')")
    criterion = {
        "type": "agent_judge",
        "prompt": "Is it right?",
        "files": ["a.py"],
        "include_reference": False,
        "agent": {"type": "claude-code", "allowed_tools": ["Read"], "ignore_patterns": ["dist"]},
    }
    grade_one(criterion, ctx)

    (request,) = seen
    assert request.options["system_prompt_mode"] == "replace" and request.options["setting_sources"] == []
    assert request.options["allowed_tools"] == sorted(["Read", agent_judge.VERDICT_TOOL])
    assert request.options["model"] == "m" and request.reference_dir is None
    assert request.ignore_patterns == ("dist", ".claude", ".mcp.json", "_reference")
    assert "GRADING PROMPT:\nIs it right?" in request.prompt and "print('</untrusted>')" in request.prompt


def test_the_verdict_server_speaks_mcp_over_stdio():
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "submit_verdict", "arguments": {"score": "x"}},
        },
        {
            "jsonrpc": "2.0",
            "id": 4,
            "method": "tools/call",
            "params": {"name": "submit_verdict", "arguments": {"score": 1, "rationale": "ok"}},
        },
    ]
    done = subprocess.run(
        [sys.executable, verdict_server.__file__],
        input="".join(json.dumps(m) + "\n" for m in messages),
        capture_output=True,
        text=True,
        timeout=30,
    )
    replies = [json.loads(line) for line in done.stdout.splitlines()]
    assert [reply["id"] for reply in replies] == [1, 2, 3, 4]
    assert replies[0]["result"]["protocolVersion"] == "2025-06-18"
    assert replies[1]["result"]["tools"][0]["name"] == "submit_verdict"
    assert replies[2]["result"]["isError"] and "Retry" in replies[2]["result"]["content"][0]["text"]
    assert not replies[3]["result"]["isError"]


# ---------------------------------------------------------------- what the specs refuse


def spec(**fields: object) -> TaskSpec:
    data = {"task_id": "t", "initial_prompt": "x", "success_criteria": [{"type": "file_exists", "path": "a"}]}
    return TaskSpec.model_validate({**data, **fields})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"success_criteria": [{"type": "cli_called", "min_count": 0}]}, "can never fail"),
        ({"success_criteria": [{"type": "cli_called"}]}, "needs at least one of verb"),
        ({"success_criteria": [{"type": "cli_called", "verb": "list --all"}]}, "looks like a flag"),
        ({"success_criteria": [{"type": "cli_called", "verb_any_of": ["a", "a b"]}]}, "is a prefix of"),
        (
            {
                "success_criteria": [
                    {"type": "cli_called", "tool": "u", "flags": {"o": {"equals": "j", "absent": True}}}
                ]
            },
            "exactly one of",
        ),
        ({"sandbox": {"record_cli": [{"tool": "python3"}]}}, "is reserved"),
        ({"sandbox": {"record_cli": [{"tool": "uip"}, {"tool": "uip"}]}}, "lists the tool 'uip' twice"),
        (
            {
                "sandbox": {
                    "record_cli": [
                        {"tool": "uip", "responses": [{"when": {"verb": "a"}}, {"when": {"verb": "a b"}}]}
                    ]
                }
            },
            "already claimed by the more general",
        ),
        ({"sandbox": {"record_cli": [{"tool": "uip", "responses": [{"when": "a"}]}]}}, "not a bare string"),
        (
            {
                "success_criteria": [
                    {"type": "reference_comparison", "agent_file": "a", "reference_file": "a"}
                ]
            },
            "the task has no reference",
        ),
        (
            {"success_criteria": [{"type": "commands_efficiency", "expected_commands": 0}]},
            "greater than or equal to 1",
        ),
        (
            {
                "success_criteria": [
                    {
                        "type": "agent_judge",
                        "prompt": "p",
                        "agent": {"type": "claude-code", "system_prompt": "x"},
                    }
                ]
            },
            "the judge's system prompt is the harness's",
        ),
        ({"success_criteria": [{"type": "agent_judge", "prompt": "p", "agent": {"model": "m"}}]}, "type"),
        (
            {"success_criteria": [{"type": "agent_judge", "prompt": "p", "verdict_channel": "tool"}]},
            "removed in coder-eval",
        ),
    ],
)
def test_the_specs_refuse_what_coder_eval_refuses(fields, message):
    with pytest.raises(ValidationError, match=message):
        spec(**fields)
