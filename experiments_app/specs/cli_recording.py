"""coder-eval's `sandbox.record_cli` and the argv patterns of `cli_called` (no Django).

`record_cli` lists executables to shadow with a generated recording shim: the harness writes one
shim per tool into `cli_mocks/` of the workspace, first on the agent's PATH; each call is
answered from the entry (or the first of its `responses` whose `when` matches) and appended to
`cli_mocks/calls.jsonl`, which a `cli_called` criterion reads. Nothing real runs.

The pattern models lower to the plain dict `argv_match` reads (`match_spec`), so the rule that
picks a response and the criterion that grades the call read one argv the same way. Field names,
defaults and refusals are coder-eval 0.12.16's (`models/cli_match.py`, `models/sandbox.py`).
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from experiments_app.specs.argv_match import is_number, select_rule
from experiments_app.specs.base import SpecError, SpecModel

RECORD_CLI_DIR = "cli_mocks"
RECORD_CLI_LOG_NAME = "calls.jsonl"
RECORD_CLI_LOG = f"{RECORD_CLI_DIR}/{RECORD_CLI_LOG_NAME}"
# The matcher a shim with response rules loads, written beside it.
SIDECAR_MODULE = "argv_match.py"
# Shadowing these would break the shim's own interpreter or the shells the harness runs.
RESERVED_TOOLS = frozenset(
    {"python", "python3", "py", "env", "sh", "bash", "zsh", "cmd", "node", "uv", "git"}
)
PREDICATES = ("equals", "contains", "matches_regex", "any_of")


class FlagMatch(SpecModel):
    """One flag's predicate: exactly one of equals / contains / matches_regex / any_of / absent /
    present. A bare scalar in YAML means `equals`."""

    equals: str | None = None
    contains: str | None = None
    matches_regex: str | None = None
    any_of: list[str] | None = Field(default=None, min_length=1)
    absent: bool = False
    present: bool = False
    aliases: list[str] = Field(default_factory=list)
    flags: int = 0

    @model_validator(mode="before")
    @classmethod
    def _scalar_means_equals(cls, value: Any) -> Any:
        return {"equals": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_predicate(self) -> FlagMatch:
        chosen = [name for name in PREDICATES if getattr(self, name) is not None]
        chosen += [name for name in ("absent", "present") if getattr(self, name)]
        if len(chosen) != 1:
            raise ValueError(
                "a flag predicate needs exactly one of equals / contains / matches_regex / any_of / "
                f"absent / present, got {sorted(chosen) or 'none'}"
            )
        if self.flags and self.matches_regex is None:
            raise ValueError(f"flags (regex flags) applies only to matches_regex, not to {chosen[0]}")
        if self.matches_regex is not None:
            try:
                re.compile(self.matches_regex, self.flags)
            except (re.error, ValueError) as exc:
                raise ValueError(
                    f"matches_regex {self.matches_regex!r} is not a valid regex: {exc}"
                ) from None
        return self

    def lowered(self) -> dict[str, Any]:
        return {
            "equals": self.equals, "contains": self.contains, "matches_regex": self.matches_regex,
            "any_of": self.any_of, "absent": self.absent, "present": self.present,
            "aliases": list(self.aliases), "flags": self.flags,
        }  # fmt: skip


def verb_spellings(verb: str | None, verb_any_of: list[str] | None) -> list[list[str]]:
    """Each accepted verb as its tokens; [] when the pattern has no verb."""
    if verb is not None:
        return [verb.split()]
    return [spelling.split() for spelling in verb_any_of or []]


def verb_problems(verb: str | None, verb_any_of: list[str] | None, label: str) -> list[str]:
    """What makes a verb declaration mean something other than it seems (coder-eval's checks)."""
    if verb is not None and verb_any_of is not None:
        return [f"{label} takes verb or verb_any_of, not both"]
    if verb_any_of is not None and not verb_any_of:
        return [f"{label} verb_any_of must not be empty: drop it to match any verb"]
    spellings = verb_spellings(verb, verb_any_of)
    if any(not tokens for tokens in spellings):
        return [f"{label} verb must not be blank: a blank verb matches every invocation"]
    for token in (token for tokens in spellings for token in tokens):
        if token.startswith("-") and token != "-" and not is_number(token.lstrip("-")):
            name = token.lstrip("-").split("=")[0]
            return [
                f"{label} verb token {token!r} looks like a flag, and a verb matches only the non-flag "
                f"arguments: put it in flags instead, e.g. flags: {{{name}: <value>}}"
            ]
    for first, second in itertools.combinations(spellings, 2):
        if first == second:
            return [f"{label} verb_any_of lists {' '.join(first)!r} twice"]
        shorter, longer = sorted((first, second), key=len)
        if longer[: len(shorter)] == shorter:
            return [
                f"{label} verb_any_of entry {' '.join(shorter)!r} is a prefix of {' '.join(longer)!r}, "
                "so it already accepts every call the longer one does: keep only the verbs you mean"
            ]
    return []


def facet_problems(
    positional: list[str] | None, flags: dict[str, FlagMatch] | None, ignore_flags: list[str], label: str
) -> list[str]:
    """An empty positional list, a flag name claimed twice, a predicate on an ignored flag."""
    if positional is not None and not positional:
        return [f"{label} positional must not be empty: list the arguments you expect, or drop it"]
    owner: dict[str, str] = {}
    for key, predicate in (flags or {}).items():
        if key in predicate.aliases:
            return [f"{label} flag {key!r} lists itself in aliases"]
        for name in (key, *predicate.aliases):
            if owner.setdefault(name, key) != key:
                return [f"{label} flag name {name!r} is claimed by both {owner[name]!r} and {key!r}"]
    shadowed = sorted(set(owner) & set(ignore_flags))
    if shadowed:
        return [
            f"{label} flag predicate(s) {', '.join(map(repr, shadowed))} are also in ignore_flags, which "
            "drops them before matching: remove them from ignore_flags, or drop the predicate"
        ]
    return []


def lowered_spec(
    verb: str | None,
    verb_any_of: list[str] | None,
    positional: list[str] | None,
    flags: dict[str, FlagMatch] | None,
    value_flags: list[str],
    ignore_flags: list[str],
) -> dict[str, Any]:
    """A pattern as `argv_match` reads it (JSON: the shim carries it as a literal)."""
    return {
        "verb_spellings": verb_spellings(verb, verb_any_of),
        "positional": list(positional) if positional is not None else None,
        "flags": {name: predicate.lowered() for name, predicate in flags.items()} if flags else None,
        "value_flags": list(value_flags),
        "ignore_flags": list(ignore_flags),
    }


class CliMatch(SpecModel):
    """The `when:` of a response rule: facets ANDed, as cli_called reads them (but no flag is
    ignored by default: a rule dispatches, it does not grade)."""

    verb: str | None = None
    verb_any_of: list[str] | None = None
    positional: list[str] | None = None
    flags: dict[str, FlagMatch] | None = None
    value_flags: list[str] = Field(default_factory=lambda: ["output"])
    ignore_flags: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _mapping(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError(f'`when` must be a mapping, not a bare string: use {{verb: "{value}"}}')
        return value

    @model_validator(mode="after")
    def _pattern(self) -> CliMatch:
        label = "record_cli response `when`"
        problems = verb_problems(self.verb, self.verb_any_of, label)
        problems += facet_problems(self.positional, self.flags, self.ignore_flags, label)
        if not (self.verb or self.verb_any_of or self.positional or self.flags):
            problems.append(
                f"{label} needs at least one of verb / verb_any_of / positional / flags: a rule that "
                "matches everything is the tool's default answer (the entry's exit_code / stdout / stderr)"
            )
        if problems:
            raise ValueError(problems[0])
        return self

    @property
    def match_spec(self) -> dict[str, Any]:
        return lowered_spec(
            self.verb, self.verb_any_of, self.positional, self.flags, self.value_flags, self.ignore_flags
        )


class CliResponse(SpecModel):
    when: CliMatch
    exit_code: int = Field(default=0, ge=0, le=255)
    stdout: str = ""
    stderr: str = ""


class RecordedCli(SpecModel):
    """One executable to shadow. Every call gets `exit_code` (1 by default: an undescribed call
    looks like a failing tool), `stdout` and `stderr`, unless a response rule matches first."""

    tool: str = Field(pattern=r"^[A-Za-z0-9._+-]+$")
    exit_code: int = Field(default=1, ge=0, le=255)
    stdout: str = ""
    stderr: str = ""
    responses: list[CliResponse] = Field(default_factory=list)

    @field_validator("tool")
    @classmethod
    def _bare_name(cls, value: str) -> str:
        folded = value.lower()
        if value in (".", ".."):
            raise ValueError(f"record_cli tool {value!r} must be a bare executable name")
        if folded.removesuffix(".exe") in RESERVED_TOOLS:
            raise ValueError(
                f"record_cli tool {value!r} is reserved: shadowing it breaks the harness itself "
                f"(reserved: {', '.join(sorted(RESERVED_TOOLS))})"
            )
        if folded == RECORD_CLI_LOG_NAME:
            raise ValueError(f"record_cli tool {value!r} would overwrite the log cli_called reads")
        if folded == SIDECAR_MODULE:
            raise ValueError(f"record_cli tool {value!r} collides with the matcher written beside the shims")
        if folded.endswith((".cmd", ".bat")):
            raise ValueError(f"record_cli tool {value!r}: declare the bare name")
        return value

    @model_validator(mode="after")
    def _rules_reachable(self) -> RecordedCli:
        """A rule an earlier one always claims could never answer (first match wins)."""
        specs = [response.when.match_spec for response in self.responses]
        for later, spec in enumerate(specs):
            for earlier, prior in enumerate(specs[:later]):
                if prior == spec:
                    reason = "is an exact duplicate of"
                elif _verb_only_prefix(prior, spec):
                    reason = "is already claimed by the more general"
                else:
                    continue
                raise SpecError(
                    (
                        ("responses", later, "when"),
                        f"record_cli tool {self.tool!r}: responses[{later}] {reason} responses[{earlier}], "
                        "so it can never answer (the first matching rule wins): put the specific rule first",
                    )
                )
        # A rule that raised inside the shim would make every call get the fallback answer.
        rules = [{"when": spec, "exit": 0, "stdout": "", "stderr": ""} for spec in specs]
        probes = [
            [],
            *([*verb, *(spec["positional"] or [])] for spec in specs for verb in spec["verb_spellings"]),
        ]
        try:
            for argv in probes if rules else []:
                select_rule(rules, argv)
        except Exception as exc:
            raise ValueError(
                f"record_cli tool {self.tool!r}: a response rule cannot be evaluated ({type(exc).__name__}: "
                f"{exc}): fix its `when:` pattern"
            ) from None
        return self


def _verb_only_prefix(prior: dict, spec: dict) -> bool:
    return bool(
        prior["positional"] is None
        and prior["flags"] is None
        and spec["flags"] is None
        and prior["value_flags"] == spec["value_flags"]
        and prior["ignore_flags"] == spec["ignore_flags"]
        and spec["verb_spellings"]
        and all(
            any(tokens[: len(prefix)] == prefix for prefix in prior["verb_spellings"])
            for tokens in spec["verb_spellings"]
        )
    )


def duplicate_tools(entries: list[RecordedCli]) -> list[tuple[tuple[str | int, ...], str]]:
    """Two entries writing one shim (coder-eval refuses them when it sets the sandbox up)."""
    seen: set[str] = set()
    issues: list[tuple[tuple[str | int, ...], str]] = []
    for index, entry in enumerate(entries):
        if entry.tool in seen:
            issues.append(((index, "tool"), f"record_cli lists the tool {entry.tool!r} twice"))
        seen.add(entry.tool)
    return issues
