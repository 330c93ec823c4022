"""coder-eval features evalsite does not run yet: refused by name, never accepted and ignored (no Django).

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
    (("sandbox", "docker"), "a container for the sandbox", "use the namespace sandbox (driver: tempdir)"),
    (
        ("sandbox", "limits", "max_cpus"),
        "a CPU cap, enforced by coder-eval only under driver: docker",
        "remove it (memory, processes and disk are capped; CPU is not)",
    ),
]


def unbuilt_features(data: Any) -> list[tuple[Loc, str]]:
    """(path, message) for each key of `data` that names a coder-eval feature evalsite lacks."""
    if not isinstance(data, dict):
        return []
    found = []
    for path, what, instead in _UNBUILT:
        value = _get(data, path)
        if _set(value):
            found.append(
                (
                    path,
                    f"coder-eval's {'.'.join(map(str, path))} ({what}) is not built in evalsite: {instead}",
                )
            )
    # A task sets sandbox.driver; an experiment layer may set `driver` at its top level.
    for loc in (("sandbox", "driver"), ("driver",)):
        if _get(data, loc) == "docker":
            found.append(
                (
                    loc,
                    "driver: docker asks for a container, and evalsite runs no container runtime: "
                    "use driver: tempdir (the namespace sandbox)",
                )
            )
    return found


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
