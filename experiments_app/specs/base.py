"""What every spec model shares: the base model, the cross-field error, the regex check (no Django).

`task`, `experiment`, `criteria` and `gates` build on it.
"""

from __future__ import annotations

import re

# The regex parser behind `re` (private since 3.11; its public alias `sre_parse` is deprecated).
from re import _constants as sre_constants  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]

from pydantic import BaseModel, ConfigDict


class SpecError(ValueError):
    """A cross-field problem, with the path of each offending field (relative to the model)."""

    def __init__(self, *issues: tuple[tuple[str | int, ...], str]) -> None:
        super().__init__("; ".join(msg for _, msg in issues))
        self.issues = list(issues)


class SpecModel(BaseModel):
    """Base of every spec model: unknown keys are kept (and warned about by the loader)."""

    model_config = ConfigDict(extra="allow")


def has_row_var(text: str) -> bool:
    # Dataset rows are substituted into criteria later; such values cannot be checked now.
    return "${row." in text


def check_regex(pattern: str, flags: int = 0) -> str:
    if not has_row_var(pattern):
        try:
            re.compile(pattern, flags)
        except re.error as exc:
            raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None
        if _nested_quantifier(sre_parse.parse(pattern, flags)):
            raise ValueError(
                f"regular expression {pattern!r} repeats a group that itself ends in a repeat, e.g. "
                "(a+)+: it can take exponential time on the agent's output; rewrite it without the "
                "nested repeat (e.g. a+)"
            )
    return pattern


def check_workspace_path(path: str, what: str = "path") -> str:
    """A path inside the trial's workspace: relative, without '..' (row variables are checked
    once substituted)."""
    if has_row_var(path):
        return path
    norm = path.replace("\\", "/")
    if not norm or norm.startswith(("/", "~")) or re.match(r"^[A-Za-z]:/", norm):
        raise ValueError(f"{what} must be relative to the workspace, got {path!r}")
    if ".." in norm.split("/"):
        raise ValueError(f"{what} must stay inside the workspace (no '..'), got {path!r}")
    return path


_REPEATS = (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, sre_constants.POSSESSIVE_REPEAT)


def _nested_quantifier(items) -> bool:
    """An unbounded repeat whose body ends in another unbounded repeat: the classic catastrophic
    backtracking shape ((a+)+, (\\s*\\w+)*). Repeats followed by a literal, as in (\\d+,)*,
    cannot backtrack that way and are accepted."""
    for op, av in items:
        if op in _REPEATS:
            _, high, body = av
            if (high == sre_constants.MAXREPEAT or high > 1) and _ends_in_repeat(body):
                return True
            inner = [body]
        elif op == sre_constants.SUBPATTERN:
            inner = [av[-1]]
        elif op == sre_constants.BRANCH:
            inner = av[1]
        elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
            inner = [av[1]]
        else:
            inner = []
        if any(_nested_quantifier(part) for part in inner):
            return True
    return False


def _ends_in_repeat(items) -> bool:
    items = list(items)
    while items:
        op, av = items[-1]
        if op in _REPEATS:
            return av[1] == sre_constants.MAXREPEAT or av[1] > 1
        if op == sre_constants.SUBPATTERN:
            items = list(av[-1])
            continue
        if op == sre_constants.BRANCH:
            return any(_ends_in_repeat(branch) for branch in av[1])
        return False
    return False
