"""Grading: coder-eval's success criteria, weights, thresholds and gating, in plain Python.

Use:
    check_params(criterion)          -> None or CriterionConfigError (the importer calls it too)
    grade(criteria, ctx)             -> GradeResult
    suite_rollup(criteria, rows)     -> SuiteRollup (dataset suite thresholds, end of run)

A criterion is a mapping as written in the task YAML, after the runner substituted
`${row.field}`. Common fields (coder-eval's): `type`, `description`, `weight` (>= 0, default
1; 0 = informational: left out of the score), `pass_threshold` (0..1, default 0.9; 0.7 for
`llm_judge`), `suite_thresholds` (dataset tasks). evalsite adds `gating` (default
`weight > 0`, which is coder-eval's rule: an informational criterion cannot fail a trial).

Rules (coder-eval's unless noted):
1. Each criterion scores in [0, 1] and passes when score >= pass_threshold.
2. The trial's score is the weight-averaged score; 0.0 when the weights sum to 0.
3. The trial passes when every gating criterion passes (so an all-informational task passes).
4. evalsite: a criterion that crashes (bad parameters, unknown type, a sandbox or judge
   failure, a bug of the grader) sets GradeResult.error: the trial is `error`, not `failed`.
   A check that merely does not hold (missing file, wrong exit code) is a failure, score 0.
5. evalsite: what the agent left can make a check fail, never crash: a link loop, a FIFO, socket
   or device, a file over MAX_FILE_BYTES, JSON nested too deeply, an unreadable mode, a search
   that does not finish in time each fail the check, its details saying what was found. The
   readers (`base.read_text`, `files.parse_json`, `base.search`...) decide this where they read
   the content; an exception that reaches `grade_one` is never the content's, so it is an error.
6. Paths are relative to the workspace; absolute paths and `..` are configuration errors, and
   a symlink leading outside the workspace fails the check.

The types are the spec's (`experiments_app.specs.criteria.CRITERION_TYPES`): each has its model
there and its implementation in one family module here (`files`, `commands`, `judge`); the
engine refuses to start when the two lists differ.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from experiments_app.specs.criteria import CRITERION_TYPES, MODEL_CRITERIA, default_pass_threshold
from runs_app.engine.criteria import commands, files, judge
from runs_app.engine.criteria.base import (
    CommandOutcome,
    CriterionConfigError,
    CriterionResult,
    CriterionType,
    GradingContext,
    clamp_score,
)
from runs_app.engine.criteria.commands import graded_calls
from runs_app.engine.criteria.suite import SuiteRollup, suite_passed, suite_rollup

__all__ = [
    "CommandOutcome",
    "CriterionConfigError",
    "CriterionResult",
    "CriterionType",
    "GradeResult",
    "GradingContext",
    "SuiteRollup",
    "check_params",
    "grade",
    "graded_calls",
    "needs_model",
    "registry",
    "suite_passed",
    "suite_rollup",
]

logger = logging.getLogger(__name__)

COMMON_FIELDS = {"type", "description", "weight", "pass_threshold", "gating", "suite_thresholds"}
# Scores like 0.1 + 0.2 + 0.6 must not miss a 0.9 threshold by a rounding error.
EPSILON = 1e-9
# Each family's types, with the spec's default threshold.
BUILTINS = {
    kind.name: dataclasses.replace(kind, default_pass_threshold=default_pass_threshold(kind.name))
    for kind in [*files.CRITERIA, *commands.CRITERIA, *judge.CRITERIA]
}
if set(BUILTINS) != set(CRITERION_TYPES):
    raise ImportError(
        f"criterion types without an implementation: {sorted(set(CRITERION_TYPES) - set(BUILTINS))}; "
        f"without a spec: {sorted(set(BUILTINS) - set(CRITERION_TYPES))}"
    )


@dataclass
class GradeResult:
    criteria: list[CriterionResult] = field(default_factory=list)
    score: float = 0.0
    passed: bool = False
    error: str | None = None


# ---------------------------------------------------------------- registry


def registry() -> dict[str, CriterionType]:
    """Every criterion type, by name."""
    return BUILTINS


def needs_model(criterion: Mapping) -> bool:
    """Whether grading this criterion asks a model (the judge's gateway and budget)."""
    return criterion.get("type") in MODEL_CRITERIA


# ---------------------------------------------------------------- parameters


def _number(criterion: Mapping, key: str, default: float, high: float | None) -> float:
    value = criterion.get(key, default)
    number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    bad = not number or value < 0
    if bad or (high is not None and value > high):
        bound = f"in [0, {high}]" if high is not None else ">= 0"
        raise CriterionConfigError(f"'{key}' must be a number {bound}, got {value!r}")
    return float(value)


def _check_common(criterion: Mapping) -> None:
    if not isinstance(criterion.get("description", ""), str):
        raise CriterionConfigError("'description' must be a string")
    _number(criterion, "weight", 1.0, None)
    _number(criterion, "pass_threshold", 0.9, 1.0)
    # None (as a spec model dumps it) means the default: gating when weight > 0.
    if criterion.get("gating") is not None and not isinstance(criterion["gating"], bool):
        raise CriterionConfigError("'gating' must be true or false")
    thresholds = criterion.get("suite_thresholds")
    if thresholds is not None and criterion.get("weight", 1.0) == 0:
        raise CriterionConfigError("a weight 0 (informational) criterion cannot set suite_thresholds")
    if thresholds is not None and not (
        isinstance(thresholds, dict)
        and all(
            isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
            for k, v in thresholds.items()
        )
    ):
        raise CriterionConfigError(
            "'suite_thresholds' must map metric names to minimum values, e.g. {mean: 0.8}"
        )


def _criterion_type(criterion: Mapping) -> CriterionType:
    if not isinstance(criterion, Mapping):
        raise CriterionConfigError(f"a criterion must be a mapping, got {type(criterion).__name__}")
    name = criterion.get("type")
    kinds = registry()
    if name not in kinds:
        raise CriterionConfigError(
            f"unknown criterion type {name!r}; known types: {', '.join(sorted(kinds))}"
        )
    return kinds[name]


def _params(criterion: Mapping) -> dict:
    return {key: value for key, value in criterion.items() if key not in COMMON_FIELDS}


def check_params(criterion: Mapping) -> None:
    """Raise CriterionConfigError, naming the field, when the criterion cannot be graded."""
    kind = _criterion_type(criterion)
    _check_common(criterion)
    try:
        kind.check_params(_params(criterion))
    except CriterionConfigError:
        raise
    # A check may report bad parameters with a plain ValueError or TypeError.
    except (ValueError, TypeError) as exc:
        raise CriterionConfigError(f"{kind.name}: {exc}") from exc


# ---------------------------------------------------------------- grading


def _jsonable(details: object) -> dict:
    """Details survive a JSON round trip (values it cannot encode become strings) and storage:
    a lone surrogate (a file name that is not UTF-8, a "\\udcff" in the agent's JSON) becomes
    its escape, since PostgreSQL refuses it."""
    if not isinstance(details, dict):
        details = {"value": details}
    return json.loads(json.dumps(details, default=str), object_hook=_storable, parse_constant=str)


def _storable(mapping: dict) -> dict:
    return {_text(key): _text(value) for key, value in mapping.items()}


def _text(value: object) -> object:
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, list):
        return [_text(item) for item in value]
    return value


def _lenient(value: object, default: float) -> float:
    """A usable non-negative number, or the default (the criterion's error says what is wrong)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return default
    return float(value)


def _blank_result(index: int, criterion: object) -> CriterionResult:
    """Result fields read leniently, so even a malformed criterion yields a result row."""
    spec = criterion if isinstance(criterion, Mapping) else {}
    name = spec.get("type")
    kind = registry().get(name) if isinstance(name, str) else None
    weight = _lenient(spec.get("weight"), 1.0)
    threshold = _lenient(spec.get("pass_threshold"), kind.default_pass_threshold if kind else 0.9)
    gating = spec.get("gating", weight > 0)
    return CriterionResult(
        index=index,
        type=str(name),
        description=str(spec.get("description", "")),
        score=0.0,
        passed=False,
        weight=weight,
        pass_threshold=threshold,
        gating=gating if isinstance(gating, bool) else weight > 0,
    )


def grade_one(index: int, criterion: Mapping, ctx: GradingContext) -> CriterionResult:
    result = _blank_result(index, criterion)
    try:
        check_params(criterion)
        kind = registry()[criterion["type"]]
        score, details = kind.evaluate(_params(criterion), ctx)
        result.score = clamp_score(score, f"criterion type {kind.name!r}")
        result.details = _jsonable(details)
    except CriterionConfigError as exc:
        result.error = f"bad parameters: {exc}"
    except Exception as exc:
        logger.warning("criterion %d (%s) crashed", index, result.type, exc_info=True)
        result.error = str(exc) if isinstance(exc, judge.JudgeError) else f"{type(exc).__name__}: {exc}"
        # A judge that failed keeps what it answered (its raw replies, capped) for review.
        result.details = _jsonable(getattr(exc, "details", None) or {})
    if result.error is None:
        result.passed = result.score + EPSILON >= result.pass_threshold
    return result


def weighted_score(results: list[CriterionResult]) -> float:
    total = sum(r.weight for r in results)
    return sum(r.score * r.weight for r in results) / total if total > 0 else 0.0


def grade(criteria: list[dict], ctx: GradingContext) -> GradeResult:
    """Grade every criterion (all of them, even after one crashed, so the page shows each)."""
    results = [grade_one(index, criterion, ctx) for index, criterion in enumerate(criteria)]
    errors = [f"criterion {r.index + 1} ({r.type}): {r.error}" for r in results if r.error]
    return GradeResult(
        criteria=results,
        score=weighted_score(results),
        passed=not errors and all(r.passed for r in results if r.gating),
        error="; ".join(errors) or None,
    )
