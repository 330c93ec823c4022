"""Criteria about commands: run_command (runs one in the sandbox), and those reading the agent's
recorded tool calls: command_executed, commands_efficiency and skill_triggered. Parameters and
scoring follow coder-eval 0.12.16.
"""

from __future__ import annotations

import json
import math
import re
import shlex

from runs_app.engine.criteria.base import (
    CriterionConfigError,
    CriterionType,
    GradingContext,
    allow_only,
    cap,
    check_regex,
    opt_bool,
    opt_int,
    opt_number,
    opt_str,
    req_str,
    search,
)

STDOUT_MATCHES = ("exact", "contains", "regex")
# coder-eval bounds the text a command_pattern searches, against catastrophic backtracking.
MAX_SEARCH_CHARS = 2000
MAX_COMMAND_TIMEOUT = 24 * 3600

# ---------------------------------------------------------------- run_command


def check_run_command(params: dict) -> None:
    what = "run_command"
    allow_only(
        params,
        what,
        # read_only: coder-eval's, false only (the spec refuses true by name).
        {
            "command",
            "timeout",
            "expected_exit_code",
            "expected_stdout",
            "stdout_match",
            "score_from_stdout",
            "read_only",
        },
    )
    req_str(params, "command", what)
    opt_number(params, "timeout", what, 30, 0.001, MAX_COMMAND_TIMEOUT)
    opt_int(params, "expected_exit_code", what, 0, minimum=-255)
    expected = opt_str(params, "expected_stdout", what)
    mode = params.get("stdout_match", "exact")
    if mode not in STDOUT_MATCHES:
        raise CriterionConfigError(f"{what}: 'stdout_match' must be one of {', '.join(STDOUT_MATCHES)}")
    if opt_bool(params, "score_from_stdout", what, False) and expected is not None:
        raise CriterionConfigError(
            f"{what}: 'score_from_stdout' and 'expected_stdout' are mutually exclusive; use "
            "score_from_stdout for a 0..1 score on stdout's first line, or expected_stdout to match text"
        )
    if mode == "regex" and expected is not None:
        check_regex(expected, 0, f"{what}: 'expected_stdout'")


def stdout_matches(actual: str, expected: str, mode: str) -> tuple[bool, str | None]:
    """exact/contains compare stripped text; a regex keeps its authored whitespace (coder-eval).
    With a problem when a regex search on the output did not finish (the check fails)."""
    if mode == "exact":
        return actual.strip() == expected.strip(), None
    if mode == "contains":
        return expected.strip() in actual.strip(), None
    found, problem = search(expected, actual)
    return found is not None, problem


def _parse_score_line(stdout: str) -> tuple[float | None, str | None]:
    """The 0..1 score on stdout's first line (clamped), or (None, why it is not one)."""
    lines = stdout.splitlines()
    first = lines[0].strip() if lines else ""
    if not first:
        return None, "no score: stdout is empty"
    try:
        raw = float(first)
    except ValueError:
        return None, f"could not parse a score from the first line {cap(first, 200)!r}"
    if not math.isfinite(raw):
        return None, f"invalid score {first!r}"
    return min(1.0, max(0.0, raw)), None


def evaluate_run_command(params: dict, ctx: GradingContext) -> tuple[float, dict]:
    """Binary on exit code and optional stdout match, or continuous with `score_from_stdout`.

    A timeout, a wrong exit code or an unparsable score line are failed checks (score 0), as
    in coder-eval; only the sandbox failing to run the command at all is an error.
    """
    if ctx.run_command is None:
        raise RuntimeError("run_command needs a sandbox command runner, and the grading context has none")
    expected_exit = params.get("expected_exit_code", 0)
    outcome = ctx.run_command(params["command"], float(params.get("timeout", 30)))
    details = {
        "command": params["command"],
        "exit_code": outcome.exit_code,
        "expected_exit_code": expected_exit,
        "timed_out": outcome.timed_out,
        "stdout": cap(outcome.stdout),
        "stderr": cap(outcome.stderr),
    }
    exit_ok = outcome.exit_code == expected_exit and not outcome.timed_out
    if params.get("score_from_stdout"):
        if not exit_ok:
            return 0.0, details
        score, problem = _parse_score_line(outcome.stdout)
        return (score or 0.0), details | ({"problem": problem} if problem else {"score": score})
    expected = params.get("expected_stdout")
    if expected is None:
        return (1.0 if exit_ok else 0.0), details
    mode = params.get("stdout_match", "exact")
    stdout_ok, problem = stdout_matches(outcome.stdout, expected, mode)
    details |= {"expected_stdout": cap(expected, 500), "stdout_match": mode, "stdout_ok": stdout_ok}
    if problem:
        details["problem"] = problem
    return (1.0 if exit_ok and stdout_ok else 0.0), details


# ---------------------------------------------------------------- command_executed


def check_command_executed(params: dict) -> None:
    what = "command_executed"
    allow_only(
        params,
        what,
        {
            "tool_name", "command_pattern", "exclude_pattern", "min_count", "max_count",
            "require_success", "stop_early",
        },
    )  # fmt: skip
    opt_str(params, "tool_name", what)
    for key in ("command_pattern", "exclude_pattern"):
        pattern = opt_str(params, key, what)
        if pattern is not None:
            check_regex(pattern, re.DOTALL, f"{what}: '{key}'")
    min_count = opt_int(params, "min_count", what, 1)
    max_count = opt_int(params, "max_count", what, None)
    if max_count is not None and max_count < min_count:
        raise CriterionConfigError(f"{what}: max_count ({max_count}) must be >= min_count ({min_count})")
    opt_bool(params, "require_success", what, False)
    check_stop_early(params, what)


def _unwrap_shell(command: str) -> str | None:
    """`bash -lc "python x.py"` as the logical command `python x.py`, quotes resolved.

    Agents (Codex especially) wrap commands in a shell; authors write patterns against the
    command itself. None when the text does not tokenize (an unbalanced quote).
    """
    try:
        tokens = shlex.split(command)
    except ValueError:
        return None
    shell = len(tokens) == 3 and tokens[0].rsplit("/", 1)[-1].endswith("sh")
    if shell and tokens[1].startswith("-") and "c" in tokens[1][1:]:
        try:
            tokens = shlex.split(tokens[2])
        except ValueError:
            return None
    return " ".join(tokens)


def _haystacks(call: dict) -> tuple[list[str], str]:
    """The texts a pattern is matched against, and a short label for details."""
    name = call.get("name", "")
    tool_input = call.get("input") or {}
    command = tool_input.get("command") if isinstance(tool_input, dict) else None
    if isinstance(command, list) and all(isinstance(part, str) for part in command):
        command = shlex.join(command)
    if isinstance(command, str) and command:
        window = command[:MAX_SEARCH_CHARS]
        normalized = _unwrap_shell(window)
        texts = [window] + ([normalized] if normalized and normalized != window else [])
        return texts, cap(command, 300)
    try:
        blob = json.dumps(tool_input, default=str, sort_keys=True)
    except RecursionError:  # the agent's input nests past Python's limit: nothing a pattern reads
        blob = "(input nested too deeply to show)"
    return [blob[:MAX_SEARCH_CHARS]], f"{name}({cap(blob, 120)})"


def graded_calls(calls: list[dict]) -> list[dict]:
    """An agent's tool calls as criteria read them: `is_error` False only for a call whose result
    said success (a call still pending, or never answered, did not succeed)."""
    return [
        {**call, "is_error": call.get("status") != "success"} if "status" in call else call for call in calls
    ]


def matching_calls(params: dict, calls: list[dict]) -> list[str]:
    pattern = params.get("command_pattern")
    exclude = params.get("exclude_pattern")
    matched = []
    for call in calls:
        if params.get("tool_name") is not None and call.get("name") != params["tool_name"]:
            continue
        # Only a call known to have succeeded counts (coder-eval counts result_status == success).
        if params.get("require_success") and call.get("is_error") is not False:
            continue
        texts, label = _haystacks(call)
        if pattern is not None and not any(re.search(pattern, t, re.DOTALL) for t in texts):
            continue
        if exclude is not None and any(re.search(exclude, t, re.DOTALL) for t in texts):
            continue
        matched.append(label)
    return matched


def evaluate_command_executed(params: dict, ctx: GradingContext) -> tuple[float, dict]:
    """Without max_count: min(1, matches / min_count) (1.0 when min_count is 0).
    With max_count: binary, min_count <= matches <= max_count ("must NOT run": 0 and 0).
    """
    matched = matching_calls(params, ctx.tool_calls)
    count, min_count, max_count = len(matched), params.get("min_count", 1), params.get("max_count")
    if max_count is None:
        score = 1.0 if min_count == 0 else min(1.0, count / min_count)
    else:
        score = 1.0 if min_count <= count <= max_count else 0.0
    details = {
        "match_count": count,
        "min_count": min_count,
        "max_count": max_count,
        "tool_calls_seen": len(ctx.tool_calls),
        "examples": matched[:5],
    }
    return score, details


def check_stop_early(params: dict, what: str) -> None:
    policy = params.get("stop_early")
    if policy is None:
        return
    if not isinstance(policy, dict):
        raise CriterionConfigError(f"{what}: 'stop_early' must be a mapping")
    allow_only(policy, f"{what}.stop_early", {"on_pass", "decide_within"})
    if policy.get("on_pass", "continue") not in ("stop", "continue"):
        raise CriterionConfigError(f"{what}: 'stop_early.on_pass' must be stop or continue")
    opt_int(policy, "decide_within", f"{what}.stop_early", None, minimum=1)


# ---------------------------------------------------------------- commands_efficiency


def commands_efficiency(actual: int, expected: int) -> float:
    """coder-eval's efficiency: expected / max(actual, expected); 0.0 when nothing ran."""
    if expected < 1:
        raise ValueError(f"expected commands must be >= 1, got {expected}")
    return 0.0 if actual == 0 else expected / max(actual, expected)


def check_commands_efficiency(params: dict) -> None:
    what = "commands_efficiency"
    allow_only(params, what, {"expected_commands"})
    if params.get("expected_commands") is None:
        raise CriterionConfigError(f"{what}: 'expected_commands' is required (an integer >= 1)")
    opt_int(params, "expected_commands", what, None, minimum=1)


def evaluate_commands_efficiency(params: dict, ctx: GradingContext) -> tuple[float, dict]:
    actual, expected = len(ctx.tool_calls), params["expected_commands"]
    score = commands_efficiency(actual, expected)
    return score, {
        "commands": actual,
        "expected_commands": expected,
        "over_budget": max(0, actual - expected),
    }


# ---------------------------------------------------------------- skill_triggered

# A skill's files read off disk (an agent without a Skill tool): `skills/<name>/` in any string
# parameter, either separator, overlapping matches allowed (`skills/skills/x/`).
SKILL_PATH = re.compile(r"(?=skills[\\/]+([A-Za-z0-9][A-Za-z0-9_-]*)[\\/]+)")


def check_skill_triggered(params: dict) -> None:
    what = "skill_triggered"
    allow_only(params, what, {"expected_skill", "skill_name", "stop_early"})
    if not isinstance(params.get("expected_skill"), str):
        raise CriterionConfigError(
            f"{what}: 'expected_skill' is required: a skill name, or '' for a negative row"
        )
    req_str(params, "skill_name", what)
    check_stop_early(params, what)


def engaged_skills(calls: list[dict]) -> set[str]:
    """Every skill the calls engaged: a `Skill` call's `skill` (its namespace dropped), and the
    `skills/<name>/` paths in any top-level string parameter."""
    names: set[str] = set()
    for call in calls:
        tool_input = call["input"] if isinstance(call.get("input"), dict) else {}
        skill = tool_input.get("skill")
        if call.get("name") == "Skill" and isinstance(skill, str) and skill:
            names.add(skill.split(":")[-1])
        for value in tool_input.values():
            if isinstance(value, str):
                names.update(SKILL_PATH.findall(value))
    return names


def evaluate_skill_triggered(params: dict, ctx: GradingContext) -> tuple[float, dict]:
    triggered = params["skill_name"] in engaged_skills(ctx.tool_calls)
    expected = params["expected_skill"] == params["skill_name"]
    observed_label, expected_label = ("yes" if triggered else "no"), ("yes" if expected else "no")
    details = {
        "skill_name": params["skill_name"],
        "observed_label": observed_label,
        "expected_label": expected_label,
    }
    return (1.0 if triggered == expected else 0.0), details


CRITERIA = [
    CriterionType("run_command", check_run_command, evaluate_run_command),
    CriterionType("command_executed", check_command_executed, evaluate_command_executed),
    CriterionType("commands_efficiency", check_commands_efficiency, evaluate_commands_efficiency),
    CriterionType("skill_triggered", check_skill_triggered, evaluate_skill_triggered),
]
