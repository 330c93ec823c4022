"""Criteria that read the finished workspace: file_exists, file_contains, file_matches_regex,
file_check, json_check and classification_match (coder-eval's names, parameters and scoring).

A missing or unreadable file is a failed check (score 0), never an error: an agent that did
nothing must fail, not crash the grader.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Callable
from typing import Any

import jmespath

from runs_app.engine.criteria.base import (
    CriterionConfigError,
    CriterionType,
    GradingContext,
    allow_only,
    bounded,
    cap,
    check_regex,
    check_rel_path,
    glob_matches,
    graded_path,
    is_glob,
    is_templated,
    kind_of,
    literal_exists,
    opt_bool,
    opt_int,
    opt_str,
    printable,
    read_text,
    req_path,
    req_str,
    search,
    str_list,
    workspace_path,
)

# Deeper JSON makes the parser, JMESPath or jsonschema recurse past Python's limit (jsonschema
# first, near 150 levels); real answers nest a few levels.
MAX_JSON_DEPTH = 64


# ---------------------------------------------------------------- file_exists


def check_file_exists(params: dict) -> None:
    allow_only(params, "file_exists", {"path"})
    req_path(params, "path", "file_exists")


def evaluate_file_exists(params: dict, ctx: GradingContext) -> tuple[float, dict]:
    """Binary: a regular file or a folder is there (links followed inside the workspace). A path
    with glob characters that does not exist as written passes when it matches at least one file
    (coder-eval's `Sandbox.file_exists`; a folder does not match). A FIFO, socket or device is not
    something an agent makes as an answer: it fails, saying what it is."""
    rel = params["path"]
    if is_glob(rel) and not literal_exists(ctx, rel):
        matches, problem = glob_matches(ctx, rel)
        if problem is not None:
            return 0.0, {"path": rel, "problem": problem}
        shown = [printable(match) for match in matches[:20]]
        return (1.0 if matches else 0.0), {"path": rel, "matches": shown, "match_count": len(matches)}
    path, problem = workspace_path(ctx, rel)
    if path is None:
        return 0.0, {"path": rel, "problem": problem}
    mode = path.stat().st_mode
    if not _file_or_folder(mode):
        return 0.0, {"path": rel, "problem": f"'{rel}' is {kind_of(mode)}, not a file or folder"}
    return 1.0, {"path": rel, "exists": True}


def _file_or_folder(mode: int) -> bool:
    return stat.S_ISREG(mode) or stat.S_ISDIR(mode)


# ---------------------------------------------------------------- file_contains


def check_file_contains(params: dict) -> None:
    allow_only(params, "file_contains", {"path", "includes", "excludes"})
    req_path(params, "path", "file_contains")
    str_list(params, "includes", "file_contains", required=True)
    str_list(params, "excludes", "file_contains")


def _includes_score(content: str, includes: list[str]) -> tuple[float, dict]:
    missing = [s for s in includes if s not in content]
    found = len(includes) - len(missing)
    return found / len(includes), {"includes_found": f"{found}/{len(includes)}", "missing": missing}


def _excludes_score(content: str, excludes: list[str]) -> tuple[float, dict]:
    present = [s for s in excludes if s in content]
    absent = len(excludes) - len(present)
    return absent / len(excludes), {"excludes_absent": f"{absent}/{len(excludes)}", "present": present}


def _content_scores(content: str, params: dict) -> tuple[list[float], dict]:
    """Scores of the active categories (includes, excludes): only non-empty lists count."""
    scores, details = [], {}
    for key, scorer in (("includes", _includes_score), ("excludes", _excludes_score)):
        if params.get(key):
            score, part = scorer(content, params[key])
            scores.append(score)
            details.update(part)
    return scores, details


def evaluate_file_contains(params: dict, ctx: GradingContext) -> tuple[float, dict]:
    """Fractional: the mean of the includes-found and excludes-absent fractions."""
    content, problem = read_text(ctx, params["path"])
    if content is None:
        return 0.0, {"path": params["path"], "problem": problem}
    scores, details = _content_scores(content, params)
    return (sum(scores) / len(scores) if scores else 1.0), {**graded_path(ctx, params["path"]), **details}


# ---------------------------------------------------------------- file_matches_regex


def _check_flags(params: dict, what: str) -> int:
    flags = opt_int(params, "flags", what, 0)
    check_regex(req_str(params, "pattern", what), flags, what)
    opt_bool(params, "must_match", what, True)
    return flags


def check_file_matches_regex(params: dict) -> None:
    allow_only(params, "file_matches_regex", {"path", "pattern", "must_match", "flags"})
    req_path(params, "path", "file_matches_regex")
    _check_flags(params, "file_matches_regex")


def _pattern_verdict(content: str, spec: dict) -> tuple[bool, dict]:
    must_match = spec.get("must_match", True)
    found, problem = search(spec["pattern"], content, spec.get("flags", 0))
    details = {"pattern": spec["pattern"], "must_match": must_match, "matched": found}
    if problem:  # not known to match nor known not to: the check fails either way
        return False, details | {"problem": problem}
    return (found is not None) == must_match, details


def evaluate_file_matches_regex(params: dict, ctx: GradingContext) -> tuple[float, dict]:
    """Binary: the pattern is found (or, with `must_match: false`, absent) anywhere in the file."""
    content, problem = read_text(ctx, params["path"])
    if content is None:
        return 0.0, {"path": params["path"], "pattern": params["pattern"], "problem": problem}
    ok, details = _pattern_verdict(content, params)
    return (1.0 if ok else 0.0), {**graded_path(ctx, params["path"]), **details}


# ---------------------------------------------------------------- file_check


def check_file_check(params: dict) -> None:
    allow_only(params, "file_check", {"path", "includes", "excludes", "patterns"})
    req_path(params, "path", "file_check")
    str_list(params, "includes", "file_check")
    str_list(params, "excludes", "file_check")
    patterns = params.get("patterns", [])
    if not isinstance(patterns, list):
        raise CriterionConfigError("file_check: 'patterns' must be a list of {pattern, must_match, flags}")
    for number, spec in enumerate(patterns, start=1):
        what = f"file_check: patterns[{number}]"
        if not isinstance(spec, dict):
            raise CriterionConfigError(f"{what} must be a mapping with a 'pattern' key")
        allow_only(spec, what, {"pattern", "must_match", "flags"})
        _check_flags(spec, what)


def evaluate_file_check(params: dict, ctx: GradingContext) -> tuple[float, dict]:
    """Existence, then the mean of the active includes / excludes / patterns fractions."""
    content, problem = read_text(ctx, params["path"])
    if content is None:
        return 0.0, {"path": params["path"], "problem": problem}
    scores, details = _content_scores(content, params)
    if params.get("patterns"):
        verdicts = [_pattern_verdict(content, spec) for spec in params["patterns"]]
        scores.append(sum(ok for ok, _ in verdicts) / len(verdicts))
        details["patterns"] = [part | {"passed": ok} for ok, part in verdicts]
    score = sum(scores) / len(scores) if scores else 1.0
    return score, {**graded_path(ctx, params["path"]), **details}


# ---------------------------------------------------------------- json_check

JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    # bool is an int in Python but never a JSON number.
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}

OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "equals": lambda actual, expected: actual == expected,
    "not_equals": lambda actual, expected: actual != expected,
    "contains": lambda actual, expected: expected in actual,
    "gt": lambda actual, expected: actual > expected,
    "gte": lambda actual, expected: actual >= expected,
    "lt": lambda actual, expected: actual < expected,
    "lte": lambda actual, expected: actual <= expected,
    "type": lambda actual, expected: JSON_TYPES[expected](actual),
    "regex": lambda actual, expected: _regex_holds(actual, expected),
    "exists": lambda actual, _: actual is not None,
}


def _check_assertion(spec: Any, number: int) -> None:
    what = f"json_check: assertions[{number}]"
    if not isinstance(spec, dict):
        raise CriterionConfigError(f"{what} must be a mapping with 'expression', 'operator', 'expected'")
    allow_only(spec, what, {"expression", "operator", "expected"})
    expression = req_str(spec, "expression", what)
    if not is_templated(expression):
        try:
            jmespath.compile(expression)
        except jmespath.exceptions.JMESPathError as exc:
            raise CriterionConfigError(f"{what}: invalid JMESPath {expression!r}: {exc}") from exc
    operator = spec.get("operator", "equals")
    if operator not in OPERATORS:
        raise CriterionConfigError(
            f"{what}: operator must be one of {', '.join(OPERATORS)}, got {operator!r}"
        )
    # Like coder-eval, a present `expected: null` is a real expectation; only `exists` may omit it.
    if operator != "exists" and "expected" not in spec:
        raise CriterionConfigError(f"{what}: 'expected' is required when operator is '{operator}'")
    expected = spec.get("expected")
    if operator == "type" and expected not in JSON_TYPES:
        raise CriterionConfigError(f"{what}: type must be one of {', '.join(JSON_TYPES)}, got {expected!r}")
    if operator == "regex":
        if not isinstance(expected, str):
            raise CriterionConfigError(f"{what}: regex 'expected' must be a string")
        check_regex(expected, 0, what)


def check_json_check(params: dict) -> None:
    allow_only(params, "json_check", {"path", "json_schema", "assertions"})
    req_path(params, "path", "json_check")
    schema = opt_str(params, "json_schema", "json_check")
    if schema is not None:
        check_rel_path(schema, "json_check: 'json_schema'")
    assertions = params.get("assertions", [])
    if not isinstance(assertions, list):
        raise CriterionConfigError("json_check: 'assertions' must be a list")
    for number, spec in enumerate(assertions, start=1):
        _check_assertion(spec, number)


def _regex_holds(actual: Any, pattern: str) -> bool:
    if not isinstance(actual, str):
        raise TypeError(f"regex needs a string, got {type(actual).__name__}")
    found, problem = search(pattern, actual)
    if problem:
        raise TimeoutError(problem)
    return found is not None


def parse_json(text: str, rel: str) -> tuple[Any, str | None]:
    """The agent's JSON, or (None, why it cannot be checked): not JSON (an integer of over 4300
    digits included), or nested deeper than MAX_JSON_DEPTH, where the parser, JMESPath and
    jsonschema would recurse past Python's limit."""
    try:
        data = json.loads(text)
    except RecursionError:
        return None, f"'{rel}' nests arrays or objects too deeply to parse (over {MAX_JSON_DEPTH} levels)"
    except ValueError as exc:
        return None, f"'{rel}' is invalid JSON: {cap(str(exc), 300)}"
    if _nested_deeper(data, MAX_JSON_DEPTH):
        return None, f"'{rel}' nests arrays or objects over {MAX_JSON_DEPTH} levels deep"
    return data, None


def _nested_deeper(data: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` levels (without recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _schema_score(ctx: GradingContext, schema_rel: str, data: Any) -> tuple[float, str]:
    text, problem = read_text(ctx, schema_rel)
    if text is None:
        return 0.0, f"schema file {problem}"
    schema, problem = parse_json(text, schema_rel)
    if problem:
        return 0.0, f"schema file {problem}"
    # The schema file is in the workspace too: its `pattern`s and `$ref`s are the agent's to write.
    verdict, problem = bounded(lambda: _schema_verdict(schema, data))
    if problem:
        return 0.0, f"validation {problem}"
    return (1.0, "valid") if verdict is None else (0.0, verdict)


def _schema_verdict(schema: Any, data: Any) -> str | None:
    """Why `data` does not satisfy `schema`, or None when it does."""
    # Imported here so the rest of grading works where jsonschema is not installed.
    import jsonschema
    import referencing.exceptions

    try:
        jsonschema.validate(instance=data, schema=schema)
    except jsonschema.ValidationError as exc:
        return f"invalid: {cap(exc.message, 500)}"
    except jsonschema.SchemaError as exc:
        return f"malformed schema: {cap(exc.message, 500)}"
    except referencing.exceptions.Unresolvable as exc:
        return f"malformed schema: a $ref leads nowhere: {cap(str(exc), 300)}"
    except RecursionError:
        return "malformed schema: its $refs lead round in a circle"
    return None


def _assertion_verdict(spec: dict, data: Any) -> tuple[bool, dict]:
    operator = spec.get("operator", "equals")
    part = {"expression": spec["expression"], "operator": operator, "expected": spec.get("expected")}
    try:
        actual = jmespath.search(spec["expression"], data)
        ok = bool(OPERATORS[operator](actual, spec.get("expected")))
    # A type mismatch (e.g. `gt` on a string) fails this assertion only, as in coder-eval.
    except Exception as exc:
        return False, part | {"problem": f"{type(exc).__name__}: {exc}"}
    return ok, part | {"actual": cap(json.dumps(actual, default=str), 500), "passed": ok}


def evaluate_json_check(params: dict, ctx: GradingContext) -> tuple[float, dict]:
    """File parses as JSON, then the mean of the schema score and the assertions' pass fraction.

    A failing schema skips the assertions and scores 0, as in coder-eval.
    """
    rel = params["path"]
    text, problem = read_text(ctx, rel)
    if text is None:
        return 0.0, {"path": rel, "problem": problem}
    data, problem = parse_json(text, rel)
    if problem:
        return 0.0, {"path": rel, "problem": problem}
    scores: list[float] = []
    details: dict[str, Any] = dict(graded_path(ctx, rel))
    if params.get("json_schema"):
        schema_score, details["schema"] = _schema_score(ctx, params["json_schema"], data)
        if schema_score == 0.0:
            return 0.0, details | {"assertions": "skipped (schema failed)"}
        scores.append(schema_score)
    if params.get("assertions"):
        verdicts = [_assertion_verdict(spec, data) for spec in params["assertions"]]
        scores.append(sum(ok for ok, _ in verdicts) / len(verdicts))
        details["assertions"] = [part for _, part in verdicts]
    return (sum(scores) / len(scores) if scores else 1.0), details


# ---------------------------------------------------------------- classification_match

NO_LABEL = "(none)"
OTHER_LABEL = "(other)"


def check_classification_match(params: dict) -> None:
    what = "classification_match"
    allow_only(params, what, {"path", "expected_label", "allowed_labels", "case_sensitive"})
    if params.get("path") is not None:
        req_path(params, "path", what)
    req_str(params, "expected_label", what)
    if not str_list(params, "allowed_labels", what, required=True):
        raise CriterionConfigError(f"{what}: 'allowed_labels' needs at least one label")
    opt_bool(params, "case_sensitive", what, False)


def _canonical(value: str, params: dict) -> str:
    """The label as spelled in `allowed_labels` when it matches up to case (unless case-sensitive)."""
    value = value.strip()
    if params.get("case_sensitive", False):
        return value
    return {label.lower(): label for label in params["allowed_labels"]}.get(value.lower(), value)


def evaluate_classification_match(params: dict, ctx: GradingContext) -> tuple[float, dict]:
    """Binary: the label the agent wrote to `path` (or, without `path`, its final answer) equals
    `expected_label`. Unknown content is observed as '(other)', nothing as '(none)'; the
    labels stay in details so the suite rollup can compute accuracy, precision, recall, F1.
    """
    path = params.get("path")
    raw, problem = read_text(ctx, path) if path else (ctx.final_text, None)
    content = (raw or "").strip()
    observed = _canonical(content, params) if content else NO_LABEL
    if observed not in {*params["allowed_labels"], NO_LABEL}:
        observed = OTHER_LABEL
    expected = _canonical(params["expected_label"], params)
    details = {
        "observed_label": observed,
        "expected_label": expected,
        "source": path or "final_text",
        "raw": cap(content, 200),
    }
    if problem:
        details["problem"] = problem
    return (1.0 if observed == expected else 0.0), details


CRITERIA = [
    CriterionType("file_exists", check_file_exists, evaluate_file_exists),
    CriterionType("file_contains", check_file_contains, evaluate_file_contains),
    CriterionType("file_matches_regex", check_file_matches_regex, evaluate_file_matches_regex),
    CriterionType("file_check", check_file_check, evaluate_file_check),
    CriterionType("json_check", check_json_check, evaluate_json_check),
    CriterionType("classification_match", check_classification_match, evaluate_classification_match),
]
