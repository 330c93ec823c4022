"""What every spec model shares: the base model, the cross-field error, the regex check (no Django).

`task`, `experiment`, `criteria` and `gates` build on it.
"""

from __future__ import annotations

import re

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
    return pattern
