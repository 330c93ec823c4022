"""coder-eval features evalsite does not run, or refuses: named, never accepted and ignored (no Django).

`unbuilt_features(data)` reads a raw task, experiment defaults or variant layer (a dict, as written)
and names every such key with the path that holds it; the loader turns each into an error at its
line, and `-D` overrides are checked the same way.
"""

from __future__ import annotations

from typing import Any

from experiments_app.specs.base import SpecError

Loc = tuple[str | int, ...]

# (path, what it is in coder-eval, what to do instead)
_UNBUILT: list[tuple[Loc, str, str]] = [
    (
        ("checker_context",),
        "the judge's API route: a backend, model and litellm parameters chosen by the task",
        "the judges' endpoint and key are the worker's (EVALSITE_JUDGE_PROVIDER, EVALSITE_JUDGE_MODEL, "
        "docs/criteria.md); name a judge model with the criterion's `model`, and remove checker_context",
    ),
]

# Criterion keys: (criterion type, key, what it is in coder-eval, what to do instead).
_UNBUILT_CRITERION_KEYS: list[tuple[str, str, str, str]] = [
    (
        "run_command",
        "read_only",
        "also run the check after an agent crash or turn timeout, recorded but never scored",
        "evalsite grades no trial whose agent crashed or timed out on a turn (it is an error): remove "
        "read_only (or set it to false)",
    ),
    (
        "llm_judge",
        "max_transcript_chars",
        "a cap on the judge transcript coder-eval writes beside task.json",
        "evalsite keeps no llm_judge transcript (its verdict, rationale and findings are kept, capped): "
        "remove max_transcript_chars",
    ),
]

# Keys evalsite refuses by design: (path, what it is in coder-eval, why and what to do instead).
_REFUSED: list[tuple[Loc, str, str]] = [
    (
        ("sandbox", "docker", "env_passthrough"),
        "the worker's environment variables forwarded into the container",
        "no variable of the worker enters a sandbox (the model is reached through the gateway, which "
        "adds the key): set fixed values with sandbox.docker.env",
    ),
    (
        ("sandbox", "docker", "env_passthrough_extra"),
        "more of the worker's environment variables forwarded into the container",
        "no variable of the worker enters a sandbox: set fixed values with sandbox.docker.env",
    ),
    (
        ("sandbox", "docker", "extra_mounts"),
        "folders of the worker's disk mounted into the container",
        "a trial sees only its task's files, on any worker: COPY them in the Dockerfile (its folder "
        "is the build context) or place them with template_sources",
    ),
]


def unbuilt_features(data: Any) -> list[tuple[Loc, str]]:
    """(path, message) for each key of `data` that names a coder-eval feature evalsite lacks or
    refuses."""
    if not isinstance(data, dict):
        return []
    found = []
    for path, what, instead in _UNBUILT:
        if _set(_get(data, path)):
            name = ".".join(map(str, path))
            found.append((path, f"coder-eval's {name} ({what}) is not built in evalsite: {instead}"))
    for path, what, why in _REFUSED:
        if _set(_get(data, path)):
            found.append((path, f"coder-eval's {'.'.join(map(str, path))} ({what}) is refused: {why}"))
    found += _unbuilt_criterion_keys(data)
    # A task sets sandbox.driver; an experiment layer may set `driver` at its top level.
    docker = "docker" in (_get(data, ("sandbox", "driver")), _get(data, ("driver",)))
    if _set(_get(data, ("sandbox", "limits", "max_cpus"))) and not docker:
        found.append(
            (
                ("sandbox", "limits", "max_cpus"),
                "coder-eval's sandbox.limits.max_cpus (a CPU cap, enforced by coder-eval only under "
                "driver: docker) is not built for the namespace sandbox: remove it (memory, processes "
                "and disk are capped; CPU is not), or set driver: docker beside it",
            )
        )
    return found


def _unbuilt_criterion_keys(data: dict) -> list[tuple[Loc, str]]:
    criteria = data.get("success_criteria")
    found: list[tuple[Loc, str]] = []
    for index, criterion in enumerate(criteria if isinstance(criteria, list) else []):
        if not isinstance(criterion, dict):
            continue
        for kind, key, what, instead in _UNBUILT_CRITERION_KEYS:
            if criterion.get("type") == kind and _set(criterion.get(key)):
                found.append(
                    (
                        ("success_criteria", index, key),
                        f"coder-eval's {kind} key {key} ({what}) is not built in evalsite: {instead}",
                    )
                )
    return found


def unbuilt_names() -> list[str]:
    """Every key this module refuses as not built, as the docs' table names it (its test reads both)."""
    return [
        *(".".join(map(str, path)) for path, _, _ in _UNBUILT),
        *(f"{kind}.{key}" for kind, key, _, _ in _UNBUILT_CRITERION_KEYS),
        "sandbox.limits.max_cpus",
    ]


def refuse_unbuilt(data: Any) -> Any:
    """A `mode="before"` validator body: `data` unchanged, or a SpecError naming every such key."""
    found = unbuilt_features(data)
    if found:
        raise SpecError(*found)
    return data


def _get(data: dict, path: Loc) -> Any:
    value: Any = data
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _set(value: Any) -> bool:
    """Whether a value asks for the feature: present, and not an explicit off or empty."""
    return not (value is None or value is False or value in ([], {}, ""))
