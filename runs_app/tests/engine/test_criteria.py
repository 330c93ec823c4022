"""Grading: every criterion type passes, fails and rejects bad parameters; weights, thresholds,
gating, errors, the one list of types, and dataset suite thresholds (the judge: test_judge.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest

from experiments_app.specs.criteria import ALL_CRITERION_TYPES, CRITERION_TYPES
from runs_app.engine import criteria
from runs_app.engine.criteria import (
    CommandOutcome,
    CriterionConfigError,
    CriterionResult,
    GradingContext,
    check_params,
    grade,
    suite_passed,
    suite_rollup,
)

# ---------------------------------------------------------------- helpers


def sandbox_runner(workspace: Path):
    """What the runner provides, minus process control: a shell command in the workspace."""

    def run(command: str, timeout: float) -> CommandOutcome:
        try:
            done = subprocess.run(
                command, shell=True, cwd=workspace, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as exc:
            return CommandOutcome(-9, str(exc.stdout or ""), str(exc.stderr or ""), timed_out=True)
        return CommandOutcome(done.returncode, done.stdout, done.stderr)

    return run


def make_ctx(workspace: Path, **fields) -> GradingContext:
    fields.setdefault("run_command", sandbox_runner(workspace))
    return GradingContext(workspace=workspace, **fields)


def write(workspace: Path, name: str, text: str) -> Path:
    path = workspace / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def grade_one(criterion: dict, ctx: GradingContext) -> CriterionResult:
    result = grade([criterion], ctx)
    return result.criteria[0]


def bash(command: str, is_error: bool | None = False) -> dict:
    call = {"name": "Bash", "input": {"command": command}}
    if is_error is not None:
        call["is_error"] = is_error
    return call


# ---------------------------------------------------------------- file_exists


def test_it_passes_file_exists_when_the_file_is_there(tmp_path):
    write(tmp_path, "hello.py", "print('hi')\n")
    result = grade_one({"type": "file_exists", "path": "hello.py", "description": "d"}, make_ctx(tmp_path))
    assert (result.score, result.passed, result.error) == (1.0, True, None)


def test_it_fails_file_exists_when_the_file_is_missing(tmp_path):
    result = grade_one({"type": "file_exists", "path": "hello.py"}, make_ctx(tmp_path))
    assert (result.score, result.passed, result.error) == (0.0, False, None)
    assert "does not exist" in result.details["problem"]


def test_it_matches_file_exists_globs(tmp_path):
    write(tmp_path, "out/report-1.txt", "x")
    ctx = make_ctx(tmp_path)
    assert grade_one({"type": "file_exists", "path": "out/*.txt"}, ctx).passed
    assert not grade_one({"type": "file_exists", "path": "out/*.json"}, ctx).passed


def test_it_rejects_file_exists_without_a_path():
    with pytest.raises(CriterionConfigError, match="'path' is required"):
        check_params({"type": "file_exists"})


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "a/../../b", "~/x"])
def test_it_rejects_paths_that_escape_the_workspace(tmp_path, path):
    with pytest.raises(CriterionConfigError, match="workspace|'\\.\\.'"):
        check_params({"type": "file_contains", "path": path, "includes": ["x"]})
    result = grade_one({"type": "file_exists", "path": path}, make_ctx(tmp_path))
    assert result.error and not result.passed


def test_it_fails_a_symlink_that_leads_outside_the_workspace(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    write(tmp_path, "secret.txt", "TOKEN=abc")
    (workspace / "leak.txt").symlink_to(tmp_path / "secret.txt")
    result = grade_one(
        {"type": "file_contains", "path": "leak.txt", "includes": ["TOKEN"]}, make_ctx(workspace)
    )
    assert (result.score, result.error) == (0.0, None)
    assert "resolves outside its folder" in result.details["problem"]


def test_it_fails_a_fifo_instead_of_blocking_on_it(tmp_path):
    os.mkfifo(tmp_path / "pipe.txt")
    result = grade_one({"type": "file_contains", "path": "pipe.txt", "includes": ["x"]}, make_ctx(tmp_path))
    assert (result.score, result.error) == (0.0, None)
    assert "not a regular file" in result.details["problem"]


def test_it_checks_only_the_type_of_values_a_dataset_row_fills_in():
    check_params(
        {
            "type": "json_check",
            "path": "${row.file}",
            "assertions": [{"expression": "${row.expression}", "operator": "regex", "expected": "${row.re}"}],
        }
    )
    check_params({"type": "file_matches_regex", "path": "a.py", "pattern": "def ${row.name}(("})
    with pytest.raises(CriterionConfigError, match="'includes' must be a list"):
        check_params({"type": "file_contains", "path": "a.py", "includes": "${row.words}"})


# ---------------------------------------------------------------- file_contains


def test_it_passes_file_contains_when_all_includes_are_found(tmp_path):
    write(tmp_path, "out.txt", "Hello, World!\n")
    criterion = {
        "type": "file_contains",
        "path": "out.txt",
        "includes": ["Hello", "World"],
        "excludes": ["Bye"],
    }
    result = grade_one(criterion, make_ctx(tmp_path))
    assert (result.score, result.passed) == (1.0, True)


def test_it_scores_file_contains_as_the_mean_of_includes_and_excludes(tmp_path):
    write(tmp_path, "out.txt", "Hello there, TODO\n")
    criterion = {
        "type": "file_contains",
        "path": "out.txt",
        "includes": ["Hello", "World"],
        "excludes": ["TODO"],
    }
    result = grade_one(criterion, make_ctx(tmp_path))
    # includes 1/2 found, excludes 0/1 absent -> (0.5 + 0.0) / 2
    assert result.score == pytest.approx(0.25)
    assert not result.passed
    assert result.details["missing"] == ["World"] and result.details["present"] == ["TODO"]


def test_it_rejects_file_contains_with_includes_that_are_not_a_list():
    with pytest.raises(CriterionConfigError, match="'includes' must be a list of strings"):
        check_params({"type": "file_contains", "path": "a.txt", "includes": "Hello"})


def test_it_rejects_unknown_fields_so_typos_do_not_pass_silently():
    with pytest.raises(CriterionConfigError, match="unknown field\\(s\\) include"):
        check_params({"type": "file_contains", "path": "a.txt", "includes": ["x"], "include": ["y"]})


# ---------------------------------------------------------------- file_matches_regex


def test_it_passes_file_matches_regex_when_the_pattern_is_found(tmp_path):
    write(tmp_path, "calc.py", "def add(a, b):\n    return a + b\n")
    criterion = {"type": "file_matches_regex", "path": "calc.py", "pattern": "def add\\(a, b\\):"}
    result = grade_one(criterion, make_ctx(tmp_path))
    assert result.passed and result.details["matched"] == "def add(a, b):"


def test_it_fails_file_matches_regex_when_the_pattern_is_absent_or_forbidden(tmp_path):
    write(tmp_path, "calc.py", "def add(x, y):\n    return x - y\n")
    ctx = make_ctx(tmp_path)
    assert not grade_one(
        {"type": "file_matches_regex", "path": "calc.py", "pattern": "def add\\(a, b\\)"}, ctx
    ).passed
    forbidden = {"type": "file_matches_regex", "path": "calc.py", "pattern": "x - y", "must_match": False}
    assert grade_one(forbidden, ctx).score == 0.0
    case_blind = {"type": "file_matches_regex", "path": "calc.py", "pattern": "DEF ADD", "flags": 2}
    assert grade_one(case_blind, ctx).passed


def test_it_rejects_file_matches_regex_with_an_invalid_pattern(tmp_path):
    criterion = {"type": "file_matches_regex", "path": "calc.py", "pattern": "def add(("}
    with pytest.raises(CriterionConfigError, match="invalid regular expression"):
        check_params(criterion)
    assert "invalid regular expression" in grade_one(criterion, make_ctx(tmp_path)).error


# ---------------------------------------------------------------- file_check


def test_it_passes_file_check_when_every_sub_check_holds(tmp_path):
    write(tmp_path, "main.py", "from uipath import UiPath\n\ndef main():\n    pass\n")
    criterion = {
        "type": "file_check",
        "path": "main.py",
        "includes": ["from uipath import UiPath"],
        "excludes": ["import os"],
        "patterns": [{"pattern": "def main\\(.*\\):"}, {"pattern": "print\\(", "must_match": False}],
    }
    result = grade_one(criterion, make_ctx(tmp_path))
    assert (result.score, result.passed) == (1.0, True)


def test_it_fails_file_check_with_a_fractional_score(tmp_path):
    write(tmp_path, "main.py", "import os\n\ndef main():\n    print(1)\n")
    criterion = {
        "type": "file_check",
        "path": "main.py",
        "includes": ["import os", "import sys"],
        "patterns": [{"pattern": "def main\\(\\):"}, {"pattern": "print\\(", "must_match": False}],
    }
    result = grade_one(criterion, make_ctx(tmp_path))
    # includes 1/2, patterns 1/2 -> 0.5
    assert result.score == pytest.approx(0.5) and not result.passed
    assert grade_one({"type": "file_check", "path": "gone.py"}, make_ctx(tmp_path)).score == 0.0


def test_it_rejects_file_check_with_a_bad_pattern_entry():
    with pytest.raises(CriterionConfigError, match="patterns\\[1\\].*invalid regular expression"):
        check_params({"type": "file_check", "path": "a.py", "patterns": [{"pattern": "(("}]})
    with pytest.raises(CriterionConfigError, match="'patterns' must be a list"):
        check_params({"type": "file_check", "path": "a.py", "patterns": "def main"})


# ---------------------------------------------------------------- json_check

REPORT = {
    "status": "ok",
    "count": 3,
    "ratio": 0.5,
    "tags": ["fast", "stable"],
    "owner": {"name": "Ada Lovelace", "email": "ada@example.org"},
    "notes": None,
}


def test_it_passes_json_check_with_every_operator(tmp_path):
    write(tmp_path, "report.json", json.dumps(REPORT))
    assertions = [
        {"expression": "status", "expected": "ok"},
        {"expression": "status", "operator": "not_equals", "expected": "failed"},
        {"expression": "tags", "operator": "contains", "expected": "stable"},
        {"expression": "count", "operator": "gt", "expected": 2},
        {"expression": "count", "operator": "gte", "expected": 3},
        {"expression": "ratio", "operator": "lt", "expected": 1},
        {"expression": "ratio", "operator": "lte", "expected": 0.5},
        {"expression": "owner", "operator": "type", "expected": "object"},
        {"expression": "count", "operator": "type", "expected": "number"},
        {"expression": "owner.email", "operator": "regex", "expected": "@example\\.org$"},
        {"expression": "owner.name", "operator": "exists"},
        {"expression": "length(tags)", "expected": 2},
        {"expression": "notes", "expected": None},
    ]
    result = grade_one(
        {"type": "json_check", "path": "report.json", "assertions": assertions}, make_ctx(tmp_path)
    )
    assert (result.score, result.passed) == (1.0, True), result.details


def test_it_fails_json_check_with_the_fraction_of_assertions_that_hold(tmp_path):
    write(tmp_path, "report.json", json.dumps(REPORT))
    assertions = [
        {"expression": "status", "expected": "ok"},
        {"expression": "count", "operator": "gt", "expected": 10},
        {"expression": "status", "operator": "gt", "expected": 1},  # str > int: fails, no crash
        {"expression": "missing", "operator": "exists"},
    ]
    result = grade_one(
        {"type": "json_check", "path": "report.json", "assertions": assertions}, make_ctx(tmp_path)
    )
    assert result.score == pytest.approx(0.25) and result.error is None
    write(tmp_path, "broken.json", "{not json")
    broken = grade_one({"type": "json_check", "path": "broken.json"}, make_ctx(tmp_path))
    assert broken.score == 0.0 and "invalid JSON" in broken.details["problem"]


def test_it_checks_json_against_a_json_schema(tmp_path):
    write(tmp_path, "report.json", json.dumps(REPORT))
    write(tmp_path, "schema.json", json.dumps({"type": "object", "required": ["status", "count"]}))
    write(tmp_path, "strict.json", json.dumps({"type": "object", "required": ["version"]}))
    ctx = make_ctx(tmp_path)
    assert grade_one({"type": "json_check", "path": "report.json", "json_schema": "schema.json"}, ctx).passed
    strict = {
        "type": "json_check",
        "path": "report.json",
        "json_schema": "strict.json",
        "assertions": [{"expression": "status", "expected": "ok"}],
    }
    result = grade_one(strict, ctx)
    assert result.score == 0.0 and result.details["assertions"] == "skipped (schema failed)"


@pytest.mark.parametrize(
    ("assertion", "message"),
    [
        ({"expression": "foo[?", "expected": 1}, "invalid JMESPath"),
        ({"expression": "count", "operator": "bigger", "expected": 1}, "operator must be one of"),
        ({"expression": "count", "operator": "gt"}, "'expected' is required"),
        ({"expression": "count", "operator": "type", "expected": "integer"}, "type must be one of"),
    ],
)
def test_it_rejects_json_check_with_bad_assertions(assertion, message):
    with pytest.raises(CriterionConfigError, match=message):
        check_params({"type": "json_check", "path": "r.json", "assertions": [assertion]})


# ---------------------------------------------------------------- run_command


def test_it_passes_run_command_with_an_exact_stdout(tmp_path):
    write(tmp_path, "hello.py", 'print("Hello, World!")\n')
    criterion = {
        "type": "run_command",
        "command": "python3 hello.py",
        "expected_stdout": "Hello, World!",
        "stdout_match": "exact",
        "timeout": 10,
    }
    result = grade_one(criterion, make_ctx(tmp_path))
    assert (result.score, result.passed) == (1.0, True)
    assert result.details["stdout"] == "Hello, World!\n"


def test_it_fails_run_command_on_a_wrong_exit_code_or_stdout(tmp_path):
    ctx = make_ctx(tmp_path)
    assert not grade_one({"type": "run_command", "command": "exit 3"}, ctx).passed
    assert grade_one({"type": "run_command", "command": "exit 3", "expected_exit_code": 3}, ctx).passed
    contains = {
        "type": "run_command",
        "command": "echo hello world",
        "expected_stdout": "bye",
        "stdout_match": "contains",
    }
    assert grade_one(contains, ctx).details["stdout_ok"] is False
    regex = {
        "type": "run_command",
        "command": "echo v1.2.3",
        "expected_stdout": "^v\\d+\\.\\d+",
        "stdout_match": "regex",
    }
    assert grade_one(regex, ctx).passed


def test_it_reads_a_score_from_stdout(tmp_path):
    ctx = make_ctx(tmp_path)
    result = grade_one(
        {"type": "run_command", "command": "printf '0.75\\nsimilar'", "score_from_stdout": True}, ctx
    )
    assert result.score == 0.75 and not result.passed
    clamped = grade_one({"type": "run_command", "command": "echo 7", "score_from_stdout": True}, ctx)
    assert clamped.score == 1.0
    garbage = grade_one({"type": "run_command", "command": "echo great", "score_from_stdout": True}, ctx)
    assert (garbage.score, garbage.error) == (0.0, None) and "could not parse" in garbage.details["problem"]


def test_it_fails_run_command_that_times_out(tmp_path):
    result = grade_one({"type": "run_command", "command": "exec sleep 5", "timeout": 0.2}, make_ctx(tmp_path))
    assert (result.score, result.error, result.details["timed_out"]) == (0.0, None, True)

    def killed_with_exit_zero(command: str, timeout: float) -> CommandOutcome:
        return CommandOutcome(0, "partial", "", timed_out=True)

    ctx = make_ctx(tmp_path, run_command=killed_with_exit_zero)
    assert grade_one({"type": "run_command", "command": "true"}, ctx).score == 0.0


def test_it_errors_when_the_sandbox_cannot_run_the_command(tmp_path):
    def broken(command: str, timeout: float) -> CommandOutcome:
        raise OSError("sandbox is gone")

    result = grade([{"type": "run_command", "command": "true"}], make_ctx(tmp_path, run_command=broken))
    assert result.error == "criterion 1 (run_command): OSError: sandbox is gone"
    assert not result.passed


@pytest.mark.parametrize(
    ("criterion", "message"),
    [
        ({"type": "run_command"}, "'command' is required"),
        (
            {"type": "run_command", "command": "x", "score_from_stdout": True, "expected_stdout": "1"},
            "exclusive",
        ),
        ({"type": "run_command", "command": "x", "stdout_match": "fuzzy"}, "stdout_match"),
        (
            {"type": "run_command", "command": "x", "expected_stdout": "((", "stdout_match": "regex"},
            "regular",
        ),
        ({"type": "run_command", "command": "x", "timeout": -1}, "'timeout'"),
    ],
)
def test_it_rejects_run_command_with_bad_parameters(criterion, message):
    with pytest.raises(CriterionConfigError, match=message):
        check_params(criterion)


# ---------------------------------------------------------------- command_executed


def test_it_passes_command_executed_when_the_agent_ran_the_command(tmp_path):
    calls = [
        {"name": "Read", "input": {"file_path": "calc.py"}},
        bash("sed -i 's/-/+/' calc.py && python3 -c 'x'"),
    ]
    criterion = {"type": "command_executed", "tool_name": "Bash", "command_pattern": "python", "weight": 0}
    result = grade_one(criterion, make_ctx(tmp_path, tool_calls=calls))
    assert result.passed and result.details["match_count"] == 1 and not result.gating


def test_it_fails_command_executed_with_a_fraction_of_min_count(tmp_path):
    ctx = make_ctx(tmp_path, tool_calls=[bash("pytest -q")])
    result = grade_one({"type": "command_executed", "command_pattern": "pytest", "min_count": 2}, ctx)
    assert result.score == 0.5 and not result.passed
    assert grade_one({"type": "command_executed", "command_pattern": "curl"}, make_ctx(tmp_path)).score == 0.0


def test_it_checks_command_executed_bounds_exclusions_and_success(tmp_path):
    calls = [
        bash("rm -rf build", is_error=True),
        bash("git push --force"),
        bash("git push origin main", None),
    ]
    ctx = make_ctx(tmp_path, tool_calls=calls)
    must_not = {"type": "command_executed", "command_pattern": "rm -rf", "min_count": 0, "max_count": 0}
    assert not grade_one(must_not, ctx).passed
    pushes = {"type": "command_executed", "command_pattern": "git push", "exclude_pattern": "--force"}
    assert grade_one(pushes, ctx).details["match_count"] == 1
    succeeded = {"type": "command_executed", "command_pattern": "rm|push", "require_success": True}
    assert grade_one(succeeded, ctx).details["match_count"] == 1


def test_it_matches_commands_inside_a_shell_wrapper(tmp_path):
    ctx = make_ctx(tmp_path, tool_calls=[bash("""bash -lc "python 'x.py' --fast" """)])
    assert grade_one({"type": "command_executed", "command_pattern": "^python x\\.py --fast$"}, ctx).passed


@pytest.mark.parametrize(
    ("criterion", "message"),
    [
        ({"type": "command_executed", "command_pattern": "(("}, "invalid regular expression"),
        (
            {"type": "command_executed", "min_count": 3, "max_count": 1},
            "max_count \\(1\\) must be >= min_count",
        ),
        ({"type": "command_executed", "min_count": -1}, "'min_count' must be an integer"),
    ],
)
def test_it_rejects_command_executed_with_bad_parameters(criterion, message):
    with pytest.raises(CriterionConfigError, match=message):
        check_params(criterion)


# ---------------------------------------------------------------- classification_match

LABELS = {"type": "classification_match", "allowed_labels": ["positive", "negative"]}


def test_it_passes_classification_match_case_insensitively(tmp_path):
    write(tmp_path, "result.txt", "  POSITIVE\n")
    result = grade_one(LABELS | {"path": "result.txt", "expected_label": "positive"}, make_ctx(tmp_path))
    assert result.passed and result.details["observed_label"] == "positive"


def test_it_fails_classification_match_with_other_and_none_labels(tmp_path):
    write(tmp_path, "result.txt", "neutral")
    ctx = make_ctx(tmp_path)
    other = grade_one(LABELS | {"path": "result.txt", "expected_label": "positive"}, ctx)
    none = grade_one(LABELS | {"path": "missing.txt", "expected_label": "positive"}, ctx)
    assert (other.score, other.details["observed_label"]) == (0.0, "(other)")
    assert (none.score, none.details["observed_label"], none.error) == (0.0, "(none)", None)


def test_it_reads_the_label_from_the_final_answer_without_a_path(tmp_path):
    ctx = make_ctx(tmp_path, final_text="negative")
    assert grade_one(LABELS | {"expected_label": "negative"}, ctx).passed
    assert not grade_one(LABELS | {"expected_label": "positive"}, ctx).passed


def test_it_rejects_classification_match_without_labels():
    with pytest.raises(CriterionConfigError, match="'allowed_labels' needs at least one label"):
        check_params({"type": "classification_match", "expected_label": "a", "allowed_labels": []})
    with pytest.raises(CriterionConfigError, match="'expected_label' is required"):
        check_params({"type": "classification_match", "allowed_labels": ["a"]})


# ---------------------------------------------------------------- weights, thresholds, gating


def test_it_weights_the_score_and_fails_when_a_gating_criterion_fails(tmp_path):
    # coder-eval's fix-calc-agentless on an unfixed calc.py scores (0*3 + 1*1) / 4.
    write(tmp_path, "calc.py", "def add(a, b):\n    return a - b\n")
    task = [
        {
            "type": "run_command",
            "command": "python3 -c 'import calc; assert calc.add(2, 3) == 5'",
            "weight": 3,
        },
        {"type": "file_matches_regex", "path": "calc.py", "pattern": "def add\\(a, b\\):"},
    ]
    result = grade(task, make_ctx(tmp_path))
    assert (result.score, result.passed, result.error) == (0.25, False, None)
    write(tmp_path, "calc.py", "def add(a, b):\n    return a + b\n")
    assert grade(task, make_ctx(tmp_path)).passed


def test_it_leaves_informational_criteria_out_of_the_score_and_the_gate(tmp_path):
    write(tmp_path, "hello.py", "print('hi')\n")
    task = [
        {"type": "file_exists", "path": "hello.py"},
        {"type": "command_executed", "command_pattern": "python", "weight": 0},
    ]
    result = grade(task, make_ctx(tmp_path))
    assert (result.score, result.passed) == (1.0, True)
    assert result.criteria[1].passed is False and result.criteria[1].gating is False


def test_it_lets_gating_be_set_explicitly(tmp_path):
    task = [
        {"type": "file_exists", "path": "a.txt", "gating": False},
        {"type": "file_exists", "path": "b.txt", "weight": 0, "gating": True},
    ]
    write(tmp_path, "a.txt", "a")
    assert not grade(task, make_ctx(tmp_path)).passed
    write(tmp_path, "b.txt", "b")
    (tmp_path / "a.txt").unlink()
    result = grade(task, make_ctx(tmp_path))
    assert (result.passed, result.score) == (True, 0.0)


def test_it_applies_each_criterion_pass_threshold(tmp_path):
    write(tmp_path, "out.txt", "alpha beta")
    criterion = {"type": "file_contains", "path": "out.txt", "includes": ["alpha", "beta", "gamma"]}
    assert not grade([criterion], make_ctx(tmp_path)).passed  # 2/3 < 0.9 default
    assert grade([criterion | {"pass_threshold": 0.6}], make_ctx(tmp_path)).passed
    # (0.4 + 1.0 + 1.0) / 3 is 0.7999999999999999 in floating point: it must still meet 0.8.
    write(tmp_path, "out.txt", "a b")
    rounded = {
        "type": "file_check",
        "path": "out.txt",
        "includes": ["a", "b", "c", "d", "e"],
        "excludes": ["z"],
        "patterns": [{"pattern": "a b"}],
        "pass_threshold": 0.8,
    }
    assert grade([rounded], make_ctx(tmp_path)).criteria[0].passed


def test_it_reads_gating_none_as_the_default(tmp_path):
    # A spec model dumps every field, defaults included: `gating: None` means "weight > 0".
    task = [{"type": "file_exists", "path": "a", "weight": 0, "gating": None, "description": ""}]
    result = grade(task, make_ctx(tmp_path))
    assert (result.error, result.passed, result.criteria[0].gating) == (None, True, False)


def test_it_passes_an_all_informational_task_with_score_zero(tmp_path):
    result = grade([{"type": "file_exists", "path": "x", "weight": 0}], make_ctx(tmp_path))
    assert (result.passed, result.score) == (True, 0.0)


@pytest.mark.parametrize(
    ("criterion", "message"),
    [
        ({"type": "file_exists", "path": "a", "weight": -1}, "'weight' must be a number >= 0"),
        ({"type": "file_exists", "path": "a", "weight": float("nan")}, "'weight' must be a number >= 0"),
        ({"type": "file_exists", "path": "a", "pass_threshold": 1.5}, "'pass_threshold' must be a number in"),
        ({"type": "file_exists", "path": "a", "gating": "yes"}, "'gating' must be true or false"),
        ({"type": "file_exists", "path": "a", "suite_thresholds": [0.8]}, "'suite_thresholds' must map"),
        (
            {"type": "file_exists", "path": "a", "weight": 0, "suite_thresholds": {"mean": 1}},
            "a weight 0 \\(informational\\) criterion cannot set suite_thresholds",
        ),
        ({"type": "file_exsts", "path": "a"}, "unknown criterion type 'file_exsts'"),
    ],
)
def test_it_rejects_bad_common_fields_and_unknown_types(tmp_path, criterion, message):
    with pytest.raises(CriterionConfigError, match=message):
        check_params(criterion)
    result = grade([criterion], make_ctx(tmp_path))
    assert result.error and re.search(message, result.error) and not result.passed


def test_it_keeps_grading_after_a_crash_and_reports_the_error(tmp_path):
    write(tmp_path, "a.txt", "a")
    task = [
        {"type": "file_exists", "path": "a.txt"},
        {"type": "file_matches_regex", "path": "a.txt", "pattern": "(("},
        {"type": "file_exists", "path": "a.txt"},
    ]
    result = grade(task, make_ctx(tmp_path))
    assert [r.passed for r in result.criteria] == [True, False, True]
    assert result.error.startswith("criterion 2 (file_matches_regex): bad parameters")
    assert not result.passed
    json.dumps(asdict(result))  # everything a result holds can be stored as JSON


# ---------------------------------------------------------------- the one list of types


def test_every_type_of_the_spec_has_an_implementation_and_no_other_type_does():
    assert set(criteria.registry()) == set(ALL_CRITERION_TYPES)
    assert set(ALL_CRITERION_TYPES) - set(CRITERION_TYPES) == {"verifier"}  # graded in a container
    assert criteria.registry()["verifier"].default_pass_threshold == 1.0
    # Defaults come from the spec's models: the judge's threshold is coder-eval's 0.7.
    assert criteria.registry()["llm_judge"].default_pass_threshold == 0.7
    assert criteria.registry()["file_exists"].default_pass_threshold == 0.9


def test_only_the_judge_needs_a_model():
    judged = [name for name in CRITERION_TYPES if criteria.needs_model({"type": name})]
    assert judged == ["llm_judge", "agent_judge"]


# ---------------------------------------------------------------- dataset suite thresholds


def label_row(expected: str, observed: str) -> list[CriterionResult]:
    details = {"expected_label": expected, "observed_label": observed}
    score = 1.0 if expected == observed else 0.0
    return [CriterionResult(0, "classification_match", "", score, score == 1.0, 1, 0.9, True, details)]


def test_it_evaluates_classification_suite_thresholds():
    task = [LABELS | {"path": "r.txt", "expected_label": "x", "suite_thresholds": {"accuracy": 0.7}}]
    rows = [label_row("positive", "positive")] * 3 + [label_row("negative", "positive")]
    rollup = suite_rollup(task, rows)
    metrics = rollup.aggregates[0].metrics
    assert (
        metrics["accuracy"] == 0.75
        and metrics["recall.positive"] == 1.0
        and metrics["recall.negative"] == 0.0
    )
    assert metrics["precision.positive"] == 0.75 and metrics["mean"] == 0.75
    assert rollup.passed
    stricter = [task[0] | {"suite_thresholds": {"accuracy": 0.8, "f1.negative": 0.1}}]
    checks = suite_rollup(stricter, rows).aggregates[0].threshold_checks
    assert [(c.metric, c.passed) for c in checks] == [("accuracy", False), ("f1.negative", False)]


def test_it_excludes_errored_rows_and_fails_unknown_metrics():
    def row(score: float, error: str | None = None) -> list[CriterionResult]:
        return [CriterionResult(0, "file_exists", "", score, score >= 0.9, 1, 0.9, True, {}, error)]

    task = [{"type": "file_exists", "path": "a", "suite_thresholds": {"mean": 0.9}}]
    rows = [row(1.0), row(1.0), row(0.0, error="sandbox died"), None]
    aggregate = suite_rollup(task, rows).aggregates[0]
    assert (aggregate.rows_total, aggregate.rows_excluded, aggregate.metrics["mean"]) == (4, 2, 1.0)
    assert suite_passed(task, rows)
    assert suite_passed([task[0] | {"suite_thresholds": {"mean": 0.5}}], rows + [row(0.0)] * 2)  # equal
    assert not suite_passed(task, rows + [row(0.0)])  # mean 2/3
    assert not suite_passed([task[0] | {"suite_thresholds": {"accuracy": 0.5}}], rows)
    assert not suite_passed(task, [None, None])  # nothing measured cannot meet a threshold
    assert suite_passed([{"type": "file_exists", "path": "a"}], [row(0.0)])  # no thresholds
