"""YAML files read with their nodes, and every problem as a `SpecIssue` at its line (no Django).

`parse_yaml` keeps the node tree next to the data, so a pydantic error location, a cross-field
`SpecError` or an unknown key can be traced back to the line that holds it (`Doc.issue`), with a
hint for a likely typo. `loading` uses it for task and experiment files.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ValidationError

from experiments_app.specs import ALL_CRITERION_TYPES, UNION_TAGS, AgentSpec, SpecError
from experiments_app.specs.gates import gate_keys

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml is ~10x faster when present

Loc = tuple[str | int, ...]

# coder-eval criterion types that cannot exist here (they call a vendor's service): named as
# such, not as typos.
UNBUILT_CRITERIA = {
    "system_one_judge": "UiPath's System One judge",
    "uipath_eval": "UiPath evaluations",
}

# Hostile-input bounds: a task file is a few hundred nodes, a few levels deep. Aliases are
# counted expanded, so an alias bomb ("billion laughs", 423 bytes) is refused before it is built.
MAX_NODES = 100_000
MAX_DEPTH = 40
# A YAML file or text box is refused past this size before it is parsed (a task file is a few KB;
# big data goes in the files it names).
MAX_YAML_BYTES = 2 * 1024 * 1024


class YamlRefused(yaml.YAMLError):
    """YAML evalsite will not read: too large, too deep, an alias bomb or loop, a value its type
    cannot hold. `line` is 1-based (None: the whole text)."""

    def __init__(self, problem: str, line: int | None = None) -> None:
        super().__init__(problem)
        self.problem, self.line = problem, line

    def __str__(self) -> str:
        return self.problem if self.line is None else f"line {self.line}: {self.problem}"


def load_yaml(text: str) -> Any:
    """The one way evalsite reads YAML it is given (files, text boxes, overrides, imports):
    `check_yaml` first, then libyaml builds the nodes, whose expansion is bounded, then the
    values. Every refusal is a `yaml.YAMLError` (a `YamlRefused`, or a syntax error with its
    mark); nothing else escapes, so a caller reports one error and its process lives on."""
    refused = check_yaml(text)
    if refused:
        raise YamlRefused(refused[1], refused[0])
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if problem := _too_big(node):
            raise YamlRefused(problem[1], problem[0])
        return construct(loader, node)
    finally:
        loader.dispose()


def check_yaml(text: str) -> tuple[int | None, str] | None:
    """(line, problem) when the text is too large or nests deeper than MAX_DEPTH, found before
    any node is built: building them recurses once per level, and PyYAML's C composer overflows
    the C stack on ~100,000 nested `[` (a segfault: the web process or the import command gone),
    its pure-Python one on ~500 (RecursionError). libyaml's parser keeps its own stack: its
    events are counted here and the parse stops at the first level too deep."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_YAML_BYTES:
        return None, f"the YAML is {size:,} bytes, more than the {MAX_YAML_BYTES:,} evalsite reads"
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    line = event.start_mark.line + 1 if event.start_mark else None
                    return line, f"the YAML is nested more than {MAX_DEPTH} levels deep"
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        return None  # a syntax error: reported by the load that follows, with its mark
    return None


def construct(loader: Any, node: yaml.Node | None) -> Any:
    """The values of a checked node tree. A loop of aliases (`&a [*a]`) and a value its tag
    cannot hold (`2024-02-30`, `!!int x`: PyYAML raises ValueError and the like) are refused
    at their line."""
    if node is None:
        return None
    if loop := _alias_loop(node):
        raise YamlRefused("an alias refers to a value that contains it (a loop)", loop)
    try:
        return loader.construct_document(node)
    except yaml.YAMLError:
        raise
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        raise YamlRefused(f"a value cannot be read as its type: {exc}", _failing_line(loader, node)) from None


def _failing_line(loader: Any, node: yaml.Node) -> int | None:
    """The line of the first value whose construction fails (after a failure: each tried alone)."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, yaml.ScalarNode):
            try:
                loader.construct_object(current, deep=True)
            except Exception:
                return current.start_mark.line + 1
        stack.extend(reversed(_children(current)))
    return None


def _alias_loop(node: yaml.Node) -> int | None:
    """The line of a node that contains itself through an alias, if any (depth-first, no
    recursion: the depth is bounded already, the walk is not)."""
    done: set[int] = set()
    path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(node, False)]
    while stack:
        current, leaving = stack.pop()
        if leaving:
            path.discard(id(current))
            done.add(id(current))
            continue
        if id(current) in path:
            return current.start_mark.line + 1
        if id(current) in done:
            continue
        path.add(id(current))
        stack.append((current, True))
        stack.extend((kid, False) for kid in _children(current))
    return None


@dataclass(frozen=True)
class SpecIssue:
    file: str
    line: int | None
    field: str
    message: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


@dataclass(frozen=True)
class Root:
    """The folder being imported: messages name files under it, and no file may leave it."""

    display: Path  # as the caller wrote it, for messages
    abs: str
    real: str

    @classmethod
    def of(cls, path: Path) -> Root:
        return cls(path, os.path.abspath(path), os.path.realpath(path))

    def shown(self, abs_path: str) -> str:
        """How a file is named in messages: under the root as the caller wrote it."""
        return str(self.display / os.path.relpath(abs_path, self.abs))


def inside(parent: str, child: str) -> bool:
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


# --- YAML parsing and line lookup ------------------------------------------------------------


@dataclass
class Doc:
    shown: str
    abs: str
    root: Root
    raw: bytes
    text: str
    node: yaml.Node | None
    data: Any

    def issue(self, loc: Loc, message: str, severity: str = "error") -> SpecIssue:
        line, path, _ = locate(self.node, loc)
        return SpecIssue(self.shown, line, field_name(path), message, severity)  # type: ignore[arg-type]


def parse_yaml(path: Path, root: Root) -> tuple[Doc | None, SpecIssue | None]:
    abs_path = os.path.abspath(path)
    shown = root.shown(abs_path) if inside(root.abs, abs_path) else str(path)
    if not inside(root.real, os.path.realpath(path)):
        return None, SpecIssue(shown, None, "", "is a symlink whose target leaves the folder being imported")
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, SpecIssue(shown, None, "", f"cannot read the file: {exc}")
    if refused := check_yaml(text):
        return None, SpecIssue(shown, refused[0], "", refused[1])
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        too_big = _too_big(node)
        if too_big:
            return None, SpecIssue(shown, too_big[0], "", too_big[1])
        duplicate = _duplicate_key(node)
        if duplicate:
            return None, SpecIssue(shown, duplicate[0], "", f"duplicate key {duplicate[1]!r} in a mapping")
        data = construct(loader, node)
    except YamlRefused as exc:
        return None, SpecIssue(shown, exc.line, "", exc.problem)
    except yaml.MarkedYAMLError as exc:
        return None, _syntax_issue(shown, exc)
    except yaml.YAMLError as exc:
        return None, SpecIssue(shown, None, "", f"invalid YAML: {exc}")
    finally:
        loader.dispose()
    return Doc(shown, abs_path, root, raw, text, node, data), None


def _syntax_issue(shown: str, exc: yaml.MarkedYAMLError) -> SpecIssue:
    mark, start = exc.problem_mark or exc.context_mark, exc.context_mark
    detail = " ".join(str(part) for part in (exc.context, exc.problem) if part)
    if mark and start and start.line != mark.line:
        # An unclosed bracket is noticed lines later; say where the construct began.
        detail += f" (the construct began on line {start.line + 1})"
    return SpecIssue(shown, mark.line + 1 if mark else None, "", f"invalid YAML: {detail}")


def _too_big(node: yaml.Node | None) -> tuple[int, str] | None:
    """(line, problem) when the document, its aliases expanded, exceeds MAX_NODES or MAX_DEPTH.

    Sizes and depths are memoised per node, so an alias to a large subtree costs one lookup:
    the walk is linear in the file, however large its expansion would be."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    order, stack, seen = [], [node] if node is not None else [], set()
    while stack:  # post-order without recursion: children before parents
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        order.append(current)
        stack.extend(_children(current))
    for current in reversed(order):
        kids = _children(current)
        size[id(current)] = 1 + sum(size.get(id(kid), 1) for kid in kids)
        depth[id(current)] = 1 + max((depth.get(id(kid), 1) for kid in kids), default=0)
        if size[id(current)] > MAX_NODES:
            return current.start_mark.line + 1, (
                f"the YAML expands to more than {MAX_NODES} values (aliases counted as copies): "
                "refused as an alias bomb"
            )
        if depth[id(current)] > MAX_DEPTH:
            return current.start_mark.line + 1, f"the YAML is nested more than {MAX_DEPTH} levels deep"
    return None


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _duplicate_key(node: yaml.Node | None) -> tuple[int, str] | None:
    """PyYAML silently keeps the last of two equal keys; a typo-duplicate would hide a field."""
    stack = [node] if node is not None else []
    visited: set[int] = set()
    while stack:
        current = stack.pop()
        if id(current) in visited:
            continue  # an alias: its node was checked where it was anchored
        visited.add(id(current))
        if isinstance(current, yaml.MappingNode):
            seen = set()
            for key, value in current.value:
                if isinstance(key, yaml.ScalarNode) and key.value != "<<":
                    if key.value in seen:
                        return key.start_mark.line + 1, key.value
                    seen.add(key.value)
                stack.append(value)
        elif isinstance(current, yaml.SequenceNode):
            stack.extend(current.value)
    return None


def locate(node: yaml.Node | None, loc: Loc) -> tuple[int | None, list[str | int], yaml.Node | None]:
    """Follow an error location through the YAML nodes: (line, field path, deepest node).

    Parts that are union tags (pydantic adds the criterion type to locations) are skipped;
    a part missing from the YAML (a required field) stays in the path, at its parent's line.
    """
    line = node.start_mark.line + 1 if node is not None else None
    path: list[str | int] = []
    matching = True
    for part in loc:
        child = None
        if matching and isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    child, line = value, key.start_mark.line + 1
        elif (
            matching
            and isinstance(node, yaml.SequenceNode)
            and isinstance(part, int)
            and part < len(node.value)
        ):
            child = node.value[part]
            line = child.start_mark.line + 1
        if child is not None:
            node = child
            path.append(part)
        elif part not in UNION_TAGS:
            path.append(part)
            matching = False
    return line, path, node


def field_name(path: list[str | int] | Loc) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# --- validation errors -> issues ---------------------------------------------------------------


def validation_issues(doc: Doc, exc: ValidationError, prefix: Loc = ()) -> list[SpecIssue]:
    issues = []
    for err in exc.errors():
        loc = (*prefix, *err["loc"])
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, SpecError):
            issues += [doc.issue((*loc, *sub), msg) for sub, msg in cause.issues]
        else:
            issues.append(_pydantic_issue(doc, loc, err))
    return issues


def _pydantic_issue(doc: Doc, loc: Loc, err: Any) -> SpecIssue:
    line, path, node = locate(doc.node, loc)
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "missing":
        message = "required field is missing" + _typo_hint(str(path[-1]) if path else "", node)
    elif kind == "union_tag_invalid":
        tag, expected = ctx.get("tag"), ctx.get("expected_tags")
        if _union_name(path) == "criterion" and tag in UNBUILT_CRITERIA:
            what = UNBUILT_CRITERIA[tag]
            message = f"coder-eval's {tag!r} criterion ({what}) is not built in evalsite; built: {expected}"
        else:
            message = f"unknown {_union_name(path)} type {tag!r}; expected one of: {expected}"
    elif kind == "union_tag_not_found":
        message = f"missing 'type'; expected one of: {', '.join(_union_tags(path))}"
    elif kind == "too_short":
        message = f"expected at least {ctx.get('min_length')} item(s), got {ctx.get('actual_length')}"
    elif kind == "value_error":
        message = str(ctx.get("error", err["msg"]))
    elif kind == "extra_forbidden":
        message = extra_key_message(doc.data, loc)
    else:
        message = err["msg"].replace("Input should be", "expected", 1) + f", got {_short(err.get('input'))}"
    return SpecIssue(doc.shown, line, field_name(path), message)


def _typo_hint(name: str, node: yaml.Node | None) -> str:
    if not isinstance(node, yaml.MappingNode):
        return ""
    keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
    close = difflib.get_close_matches(name, keys, n=1, cutoff=0.75)
    return f" (is {close[0]!r} a typo of {name!r}?)" if close else ""


def _union_name(path: list[str | int]) -> str:
    names = [p for p in path if isinstance(p, str)]
    last = names[-1] if names else ""
    return {
        "success_criteria": "criterion",
        "template_sources": "template source",
        "prompt_mutations": "prompt mutation",
    }.get(last, last)


def _union_tags(path: list[str | int]) -> tuple[str, ...]:
    return {
        "criterion": ALL_CRITERION_TYPES,
        "template source": ("template_dir", "starter_files", "repo"),
        "prompt mutation": ("prefix", "suffix", "replace", "template"),
    }.get(_union_name(path), ())


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unknown_keys(model: BaseModel, loc: Loc = ()) -> Iterator[tuple[Loc, list[str]]]:
    """(location, known field names) of every kept unknown key; agent options are not unknown."""
    if model.model_extra and not isinstance(model, AgentSpec):
        for key in model.model_extra:
            yield (*loc, key), list(type(model).model_fields)
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            yield from _unknown_keys(value, (*loc, name))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    yield from _unknown_keys(item, (*loc, name, i))


def unknown_key_message(key: str, known: list[str]) -> str:
    """The one message for a key nothing reads, with the likely intended key."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown key {key!r}{hint} (known here: {', '.join(sorted(known))})"


def extra_key_message(data: Any, loc: Loc) -> str:
    """A key a strict model (a gate) refuses, at `loc` of `data`, said as an unknown key anywhere
    else is (pydantic's own words: "Extra inputs are not permitted")."""
    known = gate_keys(value_at(data, loc[:-1])) if loc[:1] == ("gates",) else []
    return unknown_key_message(str(loc[-1]), known)


def value_at(data: Any, loc: Loc) -> Any:
    """The value at `loc` in plain YAML data (None when there is none)."""
    for key in loc:
        found = isinstance(data, dict) and key in data
        found = found or (isinstance(data, list) and isinstance(key, int) and 0 <= key < len(data))
        if not found:
            return None
        data = data[key]
    return data


def unknown_key_problems(model: BaseModel) -> list[tuple[Loc, str]]:
    """(location, message) of every unknown key of a validated model (for input that is not a
    YAML file: the experiment form), with the same "did you mean" as the importer's errors."""
    return [(loc, unknown_key_message(str(loc[-1]), known)) for loc, known in _unknown_keys(model)]


def unknown_key_warnings(
    doc: Doc, model: BaseModel, lenient: bool = False, prefix: Loc = ()
) -> list[SpecIssue]:
    """Every unknown key: an error naming the likely intended key, or with `lenient` a warning."""
    issues = []
    for loc, known in _unknown_keys(model, prefix):
        if lenient:
            close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.75)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            issues.append(doc.issue(loc, f"unknown key, kept but not used by evalsite{hint}", "warning"))
        else:
            issues.append(doc.issue(loc, unknown_key_message(str(loc[-1]), known)))
    return issues
