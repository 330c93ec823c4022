"""Layered resolution of a trial's configuration, with per-field lineage.

Five layers, lowest precedence first (coder-eval's order):

    builtin -> experiment (its `defaults`) -> task -> variant -> override (`path=value`)

Merge rules, taken from coder-eval (`orchestration/config_merge.py`, `experiment.py`):

- Scalars and lists replace (`tags`, `success_criteria`, `agent.allowed_tools`, ...).
- Nested mappings merge key by key, recursively (`agent`, `run_limits`, `sandbox`,
  `agent.sdk_options`, ...). A layer that changes `agent.type` does NOT drop the agent
  options of earlier layers; the merged agent is validated as a whole afterwards.
- Setting one of `initial_prompt` / `initial_prompt_file` (or `agent.system_prompt` /
  `agent.system_prompt_file`) drops the other one set by an earlier layer.
- Append fields concatenate instead of replacing (see APPEND_FIELDS): `pre_run` in layer
  order; `post_run` in reverse (a later layer's commands run first, so experiment cleanup
  runs last); `sandbox.template_sources` with the task's own sources first (they are the
  base the experiment and variant overlays are copied onto), then the other layers in
  order; `prompt_mutations` in layer order.
- `repeats` is never taken from the task layer (coder-eval's tasks have no repeats).
- Prompt mutations are applied to `initial_prompt` at the end, unless a layer after the
  task (variant, override) replaced the prompt: then all of them are skipped.

Experiment defaults, variants and overrides may write `driver` and `template_sources` at
their top level (coder-eval's experiment format); they are moved under `sandbox` first.

Layer data is taken as written: pass YAML dicts (or `model_dump(exclude_unset=True)`),
never full dumps, because an explicit null replaces (`sandbox.python: null` means "no
venv"). Overrides are checked against `specs.TaskOverlay`, the merged result against
`specs.TaskSpec`. Plain dicts in, plain dicts out; no Django.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import re
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ValidationError

from experiments_app import specs
from experiments_app.specs.unbuilt import unbuilt_features
from experiments_app.specs.yaml_errors import load_yaml

Layer = tuple[str, dict]

LAYER_NAMES = ("builtin", "experiment", "task", "variant", "override")

# What coder-eval uses when no layer sets a value: its `experiments/default.yaml`
# (agent, run_limits) plus its model defaults (sandbox driver, one repeat).
BUILTIN_DEFAULTS: dict[str, Any] = {
    "repeats": 1,
    "agent": {
        "type": "claude-code",
        "permission_mode": "acceptEdits",
        "model": "claude-sonnet-4-6",
        "allowed_tools": ["Bash", "Read", "Write", "Edit", "Glob", "Grep", "Skill"],
    },
    "run_limits": {"max_turns": 20, "task_timeout": 600, "turn_timeout": 300},
    "sandbox": {"driver": "tempdir"},
}

# Append fields and their contribution order.
APPEND_FIELDS: dict[str, str] = {
    "pre_run": "forward",
    "post_run": "reverse",
    "sandbox.template_sources": "task_first",
    "prompt_mutations": "forward",
}

# Setting any member at a layer drops the other members set by earlier layers.
EXCLUSIVE_GROUPS = (
    ("initial_prompt", "initial_prompt_file"),
    ("agent.system_prompt", "agent.system_prompt_file"),
)

# Keys a layer carries that are not configuration (identity, or not a task-level knob).
IGNORED_KEYS = {
    "variant": ("variant_id", "description"),
    "task": ("repeats",),
}

# Fields that exist only in the resolved config, not in the task schema.
RUN_ONLY_FIELDS = ("repeats", "prompt_mutations")


class ResolveError(ValueError):
    """A layer or the merged configuration is not usable."""


class OverrideError(ValueError):
    """A `path=value` override is malformed, repeated, or does not fit the schema."""


@dataclass(frozen=True)
class Resolved:
    config: dict[str, Any]
    lineage: dict[str, str]


# --------------------------------------------------------------------------- paths


def _get(data: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _pop(data: Any, path: str) -> Any:
    *parents, last = path.split(".")
    for key in parents:
        data = data.get(key)
        if not isinstance(data, dict):
            return None
    return data.pop(last, None)


def _set(data: dict, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        if not isinstance(data.get(key), dict):
            data[key] = {}
        data = data[key]
    data[last] = value


def _forget(lineage: dict[str, str], path: str) -> None:
    """Drop the lineage of `path` and of everything under it."""
    for key in [k for k in lineage if k == path or k.startswith((path + ".", path + "["))]:
        del lineage[key]


# --------------------------------------------------------------------------- merge


def _normalize(name: str, data: dict) -> dict:
    """A deep copy of one layer's data in the task's shape."""
    data = copy.deepcopy(data or {})
    for key in IGNORED_KEYS.get(name, ()):
        data.pop(key, None)
    if name in ("experiment", "variant", "override"):
        sandbox = data.get("sandbox")
        sandbox = dict(sandbox) if isinstance(sandbox, dict) else {}
        driver = data.pop("driver", None)
        if driver is not None:
            sandbox["driver"] = driver
        top_sources = data.pop("template_sources", None) or []
        if top_sources:
            sandbox["template_sources"] = (sandbox.get("template_sources") or []) + top_sources
        if sandbox:
            data["sandbox"] = sandbox
    return data


def _merge(target: dict, patch: dict, layer: str, lineage: dict[str, str], prefix: str = "") -> None:
    """Deep-merge `patch` into `target`, recording `layer` for every leaf it sets."""
    for key, value in patch.items():
        path = prefix + str(key)
        current = target.get(key)
        if isinstance(value, dict):
            if not isinstance(current, dict):
                _forget(lineage, path)
                target[key] = current = {}
            if value:
                lineage.pop(path, None)  # no longer an empty leaf
            elif not current:
                lineage[path] = layer  # an explicit empty mapping is a leaf too
            _merge(current, value, layer, lineage, path + ".")
        else:
            _forget(lineage, path)
            target[key] = value
            lineage[path] = layer


def _drop_exclusive_siblings(config: dict, data: dict, lineage: dict[str, str]) -> None:
    for group in EXCLUSIVE_GROUPS:
        set_here = {member for member in group if _get(data, member) is not None}
        for member in group:
            if set_here and member not in set_here:
                _pop(config, member)
                _forget(lineage, member)


def _ordered(field: str, contributions: list[tuple[str, list]]) -> list[tuple[str, list]]:
    order = APPEND_FIELDS[field]
    if order == "reverse":
        return contributions[::-1]
    if order == "task_first":
        return sorted(contributions, key=lambda c: c[0] != "task")  # stable sort
    return contributions


def _check_layer_names(layers: list[Layer]) -> None:
    names = [name for name, _ in layers]
    unknown = [n for n in names if n not in LAYER_NAMES]
    if unknown:
        raise ResolveError(f"unknown layer {unknown[0]!r}; expected one of {', '.join(LAYER_NAMES)}")
    positions = [LAYER_NAMES.index(n) for n in names]
    if positions != sorted(set(positions)):
        raise ResolveError(f"layers must be given once each, in the order {' -> '.join(LAYER_NAMES)}")


def merge_layers(layers: list[Layer]) -> Resolved:
    """Merge the layers by coder-eval's rules; no validation, prompt mutations not applied."""
    _check_layer_names(layers)
    config: dict[str, Any] = {}
    lineage: dict[str, str] = {}
    appended: dict[str, list[tuple[str, list]]] = {field: [] for field in APPEND_FIELDS}
    for name, raw in layers:
        data = _normalize(name, raw)
        for field in APPEND_FIELDS:
            items = _pop(data, field)
            if items is None:
                continue
            if not isinstance(items, list):
                raise ResolveError(f"{field}: expected a list, got {type(items).__name__} (layer {name})")
            appended[field].append((name, items))
        _drop_exclusive_siblings(config, data, lineage)
        _merge(config, data, name, lineage)
    for field, contributions in appended.items():
        lineage.pop(field.rpartition(".")[0], None)  # its parent is not an empty leaf any more
        merged: list = []
        for name, items in _ordered(field, contributions):
            for item in items:
                lineage[f"{field}[{len(merged)}]"] = name
                merged.append(item)
        _set(config, field, merged)
    return Resolved(config=config, lineage=lineage)


# --------------------------------------------------------------------------- prompt


def apply_prompt_mutations(prompt: str, mutations: list[dict]) -> str:
    """Apply coder-eval prompt mutations in order, each to the previous one's result.

    prefix/suffix: `content`, `separator` (default a blank line); replace: `pattern`,
    `replacement`, `regex` (default false: literal text); template: `variables`, each
    `{name}` in the prompt replaced by its value. `rephrase` needs a model and is refused.
    """
    for number, mutation in enumerate(mutations):
        kind = mutation.get("type")
        try:
            if kind == "prefix":
                prompt = mutation["content"] + mutation.get("separator", "\n\n") + prompt
            elif kind == "suffix":
                prompt = prompt + mutation.get("separator", "\n\n") + mutation["content"]
            elif kind == "replace":
                pattern, replacement = mutation["pattern"], mutation["replacement"]
                if mutation.get("regex", False):
                    prompt = re.sub(pattern, replacement, prompt)
                else:
                    prompt = prompt.replace(pattern, replacement)
            elif kind == "template":
                for name, value in mutation["variables"].items():
                    prompt = prompt.replace("{" + str(name) + "}", str(value))
            else:
                raise ResolveError(
                    f"prompt_mutations[{number}]: unsupported type {kind!r}; "
                    "expected prefix, suffix, replace or template"
                )
        except KeyError as exc:
            raise ResolveError(f"prompt_mutations[{number}] ({kind}): missing {exc.args[0]!r}") from exc
        except re.error as exc:
            raise ResolveError(
                f"prompt_mutations[{number}]: bad regex {mutation['pattern']!r}: {exc}"
            ) from exc
    return prompt


def _apply_mutations(config: dict, lineage: dict[str, str]) -> None:
    """Mutate the task's prompt in place, following coder-eval's skip rule."""
    mutations = config.get("prompt_mutations") or []
    owner = lineage.get("initial_prompt") or lineage.get("initial_prompt_file")
    if owner in ("variant", "override"):
        # A replaced prompt is used as written: every mutation is skipped.
        config["prompt_mutations"] = []
        _forget(lineage, "prompt_mutations")
        return
    if not mutations:
        return
    prompt = config.get("initial_prompt")
    if prompt is None:
        if config.get("initial_prompt_file") is not None:
            raise ResolveError(
                "prompt_mutations need the prompt text: inline initial_prompt_file before resolving"
            )
        return  # no prompt at all (agent type none): nothing to mutate
    config["initial_prompt"] = apply_prompt_mutations(prompt, mutations)
    lineage["initial_prompt"] = lineage[f"prompt_mutations[{len(mutations) - 1}]"]


# --------------------------------------------------------------------------- overrides

_OVERRIDE_PATH = re.compile(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*")
# PyYAML reads these as booleans (YAML 1.1); coder-eval keeps them as text so that
# `agent.model=on` cannot silently become True. `true`/`false` still are booleans.
_YAML_BOOL_WORDS = {"y", "n", "yes", "no", "on", "off"}


def _override_value(item: str, text: str) -> Any:
    try:
        value = load_yaml(text)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or "parse error"
        raise OverrideError(f"override {item!r}: the value is not valid YAML ({problem})") from exc
    if isinstance(value, bool) and text.strip().lower() in _YAML_BOOL_WORDS:
        return text.strip()
    if isinstance(value, dict | list) and not text.strip().startswith(("{", "[")):
        # `echo a: b` is a shell command, not a mapping: only flow syntax ({...}, [...]) makes
        # a structured value, so text with a colon or a leading dash stays text.
        return text.strip()
    return value


def parse_overrides(items: list[str], *, validate: bool = True) -> dict[str, Any]:
    """Turn `path=value` strings into a nested patch for the override layer.

    The value is read as YAML (`5`, `0.5`, `true`, `[a, b]`, `{effort: high}`), except that
    text which YAML would read as a block mapping or list (`echo a: b`, `- x`) stays text, and a
    value the field refuses is retried as the plain text it was typed as; the path is
    split on dots. A path given twice, or two overlapping paths (`agent=...` and
    `agent.model=...`), is an error; so is a malformed item. With `validate`, each path and
    value is checked against the layer schema (see `check_override`).
    """
    patch: dict[str, Any] = {}
    seen: list[str] = []
    for item in items:
        path, equals, text = item.partition("=")
        path = path.strip()
        if not equals or not _OVERRIDE_PATH.fullmatch(path):
            raise OverrideError(
                f"override {item!r} is malformed: expected PATH=VALUE, e.g. run_limits.max_turns=5"
            )
        if path in seen:
            raise OverrideError(f"override path {path!r} is set twice; give each path once")
        clash = next((p for p in seen if p.startswith(path + ".") or path.startswith(p + ".")), None)
        if clash:
            first, second = sorted((clash, path), key=len)
            raise OverrideError(f"override paths {first!r} and {second!r} overlap; set each field once")
        seen.append(path)
        value = _override_value(item, text)
        if validate:
            value = _typed(path, value, text)
        _set(patch, path, value)
    return patch


# --------------------------------------------------------------------------- schema


def _nested(annotation: Any) -> tuple[list[type[BaseModel]], bool]:
    """The models a field's annotation may hold, and whether it is a free-form mapping."""
    if annotation is Any:
        return [], True
    if typing.get_origin(annotation) is Annotated:
        return _nested(typing.get_args(annotation)[0])
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        models: list[type[BaseModel]] = []
        free = False
        for arg in typing.get_args(annotation):
            arg_models, arg_free = _nested(arg)
            models += arg_models
            free = free or arg_free
        return models, free
    if origin is dict or annotation is dict:
        return [], True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation], False
    return [], False


def _typed(path: str, value: Any, text: str) -> Any:
    """The value as the field takes it: YAML's reading when the field accepts it, else the text
    as typed (a `str` field given `1.10` keeps "1.10"); the field's own error when neither fits."""
    try:
        check_override(path, value)
        return value
    except OverrideError:
        if isinstance(value, str) or text.strip() == "":
            raise
        try:
            check_override(path, text.strip())
        except OverrideError:
            pass
        else:
            return text.strip()
        raise


def check_override(path: str, value: Any) -> None:
    """Check one override path and value against the layer schema (`specs.TaskOverlay`).

    The path is walked field by field: the spec models keep unknown keys, but an override
    must name a real field, except under `agent` (whose unknown keys are agent options) and
    under free-form mappings (`sandbox.docker.env`). The value is then validated
    by the model itself, so field validators and constraints apply.
    """
    keys = path.split(".")
    patch: dict[str, Any] = {}
    _set(patch, path, value)
    # A coder-eval key evalsite lacks is named as such, also where it has no field to walk.
    if found := unbuilt_features(patch):
        raise OverrideError(f"override {path}: {found[0][1]}")
    models: list[type[BaseModel]] = [specs.TaskOverlay]
    for depth, key in enumerate(keys):
        field = _field(path, key, models)
        if field is None or depth == len(keys) - 1:
            break  # an agent option, or the target field itself
        models, free = _nested(field.annotation)
        if free:
            break
        if not models:
            parent = ".".join(keys[: depth + 1])
            raise OverrideError(f"override {path}: {parent} is a single value or a list, it has no fields")
    try:
        specs.TaskOverlay.model_validate(patch)
    except ValidationError as exc:
        messages = "; ".join(f"{where}: {msg}" for where, msg in _issues(exc))
        raise OverrideError(f"override {messages} (got {value!r})") from exc


def _field(path: str, key: str, models: list[type[BaseModel]]) -> Any:
    """The field `key` of one of `models` (None when it is an agent option)."""
    for model in models:
        if key in model.model_fields:
            return model.model_fields[key]
    if specs.AgentSpec in models:
        return None
    known = sorted({name for model in models for name in model.model_fields})
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    expected = ", ".join(known)
    raise OverrideError(f"override {path}: unknown field {key!r}{hint} (expected one of: {expected})")


def _issues(exc: ValidationError) -> list[tuple[str, str]]:
    """(path, message) for each error, a SpecError's field paths spelled out."""
    issues = []
    for err in exc.errors():
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, specs.SpecError):
            issues += [(_dotted((*err["loc"], *where)), msg) for where, msg in cause.issues]
        else:
            issues.append((_dotted(err["loc"]), err["msg"].removeprefix("Value error, ")))
    return issues


def _dotted(loc: tuple) -> str:
    """A pydantic error location as a lineage path: `pre_run[1].timeout`."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part not in specs.UNION_TAGS:  # pydantic's tagged-union step, not a YAML key
            path += f".{part}" if path else str(part)
    return path


def _credit(path: str, lineage: dict[str, str]) -> str:
    """Name the layer that set `path` (or its nearest ancestor), else the layers under it."""
    probe = path
    while probe:
        if probe in lineage:
            return f" (set by {lineage[probe]})"
        parent = re.sub(r"(\.[^.\[]+|\[\d+\])$", "", probe)
        probe = "" if parent == probe else parent
    prefixes = (path + ".", path + "[")
    below = sorted({layer for key, layer in lineage.items() if path and key.startswith(prefixes)})
    return f" (set by {', '.join(below)})" if below else ""


def validate_config(config: dict[str, Any], lineage: dict[str, str]) -> None:
    """Validate a merged config with the task schema; each error names the layer responsible."""
    problems = []
    repeats = config.get("repeats", 1)
    if type(repeats) is not int or repeats < 1:
        problems.append(f"repeats: expected an integer >= 1, got {repeats!r}{_credit('repeats', lineage)}")
    task = {key: value for key, value in config.items() if key not in RUN_ONLY_FIELDS}
    try:
        specs.TaskSpec.model_validate(task, context={"resolved": True})
    except ValidationError as exc:
        problems += [f"{where or 'task'}: {msg}{_credit(where, lineage)}" for where, msg in _issues(exc)]
    if problems:
        raise ResolveError("the resolved configuration is invalid: " + "; ".join(problems))


# --------------------------------------------------------------------------- resolve


def resolve(layers: list[Layer], *, validate: bool = True) -> Resolved:
    """Merge the layers, apply prompt mutations and (by default) validate the result.

    `config` is the merged task configuration plus `repeats` and `prompt_mutations` (the
    mutations already applied to `initial_prompt`). `lineage` maps every leaf path
    (`run_limits.max_turns`, `agent.allowed_tools`, `pre_run[1]`, ...) to the name of the
    layer that set it; append fields have one entry per element. A mutated
    `initial_prompt` is credited to the layer of the last mutation applied.
    """
    merged = merge_layers(layers)
    config, lineage = merged.config, merged.lineage
    _apply_mutations(config, lineage)
    if validate:
        validate_config(config, lineage)
    return Resolved(config=config, lineage=lineage)


def trial_layers(
    task: dict,
    experiment: dict | None = None,
    variant: dict | None = None,
    overrides: dict | None = None,
) -> list[Layer]:
    """The standard five layers for one trial (absent ones left out)."""
    layers: list[Layer] = [("builtin", BUILTIN_DEFAULTS)]
    if experiment:
        layers.append(("experiment", experiment))
    layers.append(("task", task))
    if variant:
        layers.append(("variant", variant))
    if overrides:
        layers.append(("override", overrides))
    return layers


def config_fingerprint(config: dict) -> str:
    """sha256 of the config as canonical JSON (sorted keys, no whitespace)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
