"""reference_comparison: a workspace file against one file of the task's reference folder, as
coder-eval 0.12.16 scores it (`criteria/reference_comparison.py`, `scoring/`):

- `ast`: difflib's ratio over the AST node type names in `ast.walk` order;
- `token`: the same ratio over the token type names (a file that does not tokenize to its end
  keeps the tokens read so far);
- `complexity`: radon's metrics of the agent's file against the reference's, 0.5 cyclomatic +
  0.3 lines of code + 0.2 function count, each 1 - min(1, agent / (reference * 1.5)) (the
  function count: 1 - |agent - reference| / reference).

The agent's file missing, unreadable or not Python that parses is a failed check (score 0, the
problem in details); the reference file missing, empty or not parsing is the task's error.
Scoring runs in a child with a time limit (`bounded`): an agent's file of 16 MB makes the
sequence matching quadratic.
"""

from __future__ import annotations

import ast
import tokenize
from difflib import SequenceMatcher
from io import BytesIO
from pathlib import PurePosixPath

from radon.complexity import cc_visit
from radon.raw import analyze

from runs_app.engine.criteria.base import (
    CriterionConfigError,
    CriterionType,
    GradingContext,
    allow_only,
    bounded,
    opt_number,
    read_text,
    read_text_under,
    req_path,
    req_str,
)

METHODS = ("ast", "token", "complexity")


def check_reference_comparison(params: dict) -> None:
    what = "reference_comparison"
    allow_only(params, what, {"agent_file", "reference_file", "comparison_method", "similarity_threshold"})
    req_path(params, "agent_file", what)
    reference = req_str(params, "reference_file", what).strip().replace("\\", "/")
    if PurePosixPath(reference).is_absolute() or ".." in PurePosixPath(reference).parts:
        raise CriterionConfigError(
            f"{what}: 'reference_file' {reference!r} must stay inside the reference folder"
        )
    if params.get("comparison_method", "ast") not in METHODS:
        raise CriterionConfigError(f"{what}: 'comparison_method' must be one of {', '.join(METHODS)}")
    opt_number(params, "similarity_threshold", what, 0.8, 0.0, 1.0)


def node_types(code: str) -> list[str]:
    return [type(node).__name__ for node in ast.walk(ast.parse(code))]


def token_types(code: str) -> list[str]:
    names = []
    try:
        for token in tokenize.tokenize(BytesIO(code.encode()).readline):
            names.append(tokenize.tok_name[token.type])
    except tokenize.TokenError:  # incomplete code: what was read so far
        pass
    return names


def complexity_metrics(code: str) -> dict[str, int]:
    functions = cc_visit(code)
    return {
        "cyclomatic_complexity": sum(block.complexity for block in functions),
        "lines_of_code": analyze(code).loc,
        "function_count": len(functions),
    }


def complexity_score(agent: dict[str, int], reference: dict[str, int]) -> float:
    def relative(agent_value: int, reference_value: int) -> float:
        return max(0.0, 1.0 - min(1.0, agent_value / (max(reference_value, 1) * 1.5)))

    functions = reference["function_count"]
    function_score = max(0.0, 1.0 - abs(agent["function_count"] - functions) / max(functions, 1))
    return (
        0.5 * relative(agent["cyclomatic_complexity"], reference["cyclomatic_complexity"])
        + 0.3 * relative(agent["lines_of_code"], reference["lines_of_code"])
        + 0.2 * function_score
    )


def similarity(method: str, agent_code: str, reference_code: str) -> dict:
    """{"score": ...} or {"problem": ...}: what the agent's code made of the comparison."""
    try:
        if method == "ast":
            ratio = SequenceMatcher(None, node_types(agent_code), node_types(reference_code)).ratio()
            return {"score": ratio}
        if method == "token":
            ratio = SequenceMatcher(None, token_types(agent_code), token_types(reference_code)).ratio()
            return {"score": ratio}
        agent = complexity_metrics(agent_code)
        reference = complexity_metrics(reference_code)
        return {"score": complexity_score(agent, reference), "agent": agent, "reference": reference}
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return {"problem": f"the agent's file could not be compared: {type(exc).__name__}: {exc}"}


def _reference_code(ctx: GradingContext, name: str, method: str) -> str:
    if ctx.reference_dir is None:
        raise CriterionConfigError(
            "reference_comparison: the task has no reference folder (reference: block)"
        )
    code, problem = read_text_under(ctx.reference_dir, name)
    if code is None:
        raise CriterionConfigError(f"reference_comparison: reference_file {name!r}: {problem}")
    if not code:
        raise CriterionConfigError(f"reference_comparison: reference_file {name!r} is empty")
    if method != "token":
        try:
            compile(code, name, "exec", ast.PyCF_ONLY_AST)
        except (SyntaxError, ValueError) as exc:
            raise CriterionConfigError(
                f"reference_comparison: reference_file {name!r} is not Python: {exc}"
            ) from None
    return code


def evaluate_reference_comparison(params: dict, ctx: GradingContext) -> tuple[float, dict]:
    method = params.get("comparison_method", "ast")
    name = params["reference_file"].strip().replace("\\", "/")
    reference = _reference_code(ctx, name, method)
    details: dict = {
        "comparison_method": method,
        "agent_file": params["agent_file"],
        "reference_file": name,
        "similarity_threshold": params.get("similarity_threshold", 0.8),
    }
    agent_code, problem = read_text(ctx, params["agent_file"])
    if agent_code is None:
        return 0.0, details | {"problem": f"agent file not found or unreadable: {problem}"}
    result, slow = bounded(lambda: similarity(method, agent_code, reference))
    if slow:
        return 0.0, details | {"problem": f"comparing the files {slow}"}
    if "problem" in result:
        return 0.0, details | result
    return result["score"], details | {"similarity": round(result["score"], 6)} | {
        key: value for key, value in result.items() if key != "score"
    }


CRITERIA = [CriterionType("reference_comparison", check_reference_comparison, evaluate_reference_comparison)]
