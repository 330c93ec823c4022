"""A trial's run identity: what ran it, one fingerprint per component (lux's run identity), so a
comparison of two runs names exactly what changed between them.

`trial_components(config, kind_name, agent_config, box)` returns, stored on the trial as
`Trial.components`:

    {"agent":       {"value": "claude-code 2.1.197 (Claude Code)", "fingerprint": "3f2a..."},
     "answerer":    {"value": "persona claude-haiku-4-5", ...},         # simulated conversations
     "grader":      {"value": "criteria 9c1e0b7a4d21; judge anthropic/claude-sonnet-4-6", ...},
     "environment": {"value": {"sandbox": "bubblewrap 0.8.0", "system": "Debian GNU/Linux 12",
                               "env.python": "<requirement set digest>"}, ...}}

- agent: the kind and the version its CLI reports (`--version`, asked once per binary per
  process); a plugin kind's package version;
- answerer: who plays the user, and the model of one that calls a model;
- grader: a digest of the grading code (the criterion specs and implementations) and, when a
  criterion asks a model, the judge's provider and model;
- environment: a mapping of component to digest or version. The namespace sandbox fills
  `sandbox`, `system` and the task's `env.python` / `env.node` environments; a container
  driver adds the image it ran (`image`: its digest), and any other driver its own keys.

A fingerprint is the first 12 hex digits of the sha256 of the value's canonical JSON.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from experiments_app.specs.agent_kinds import KINDS, PREAMBLE_OPTION, plugin_entry_points
from runs_app.engine.agents.base import find_cli

BASE = Path(__file__).resolve().parents[2]
GRADER_SOURCES = (
    "experiments_app/specs/criteria.py",
    "experiments_app/specs/cli_recording.py",
    "experiments_app/specs/argv_match.py",
    "runs_app/engine/criteria",
)


def fingerprint(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


def component(value: Any) -> dict[str, Any]:
    return {"value": value, "fingerprint": fingerprint(value)}


def trial_components(
    config: Mapping[str, Any], kind_name: str, agent_config: Mapping[str, Any], environment: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    """The trial's components (see the module docstring); `environment` is its driver's."""
    found = {"agent": component(agent_identity(kind_name, agent_config))}
    simulation = config.get("simulation") or {}
    if simulation.get("enabled"):
        found["answerer"] = component(answerer_identity(simulation))
    found["grader"] = component(grader_identity(config.get("success_criteria") or []))
    found["environment"] = component(dict(sorted(environment.items())))
    return found


def agent_identity(kind_name: str, agent_config: Mapping[str, Any]) -> str:
    # What the agent is sent differs without coder-eval's working-directory line: another agent
    # as far as a comparison goes (the default leaves earlier runs' fingerprints as they were).
    bare = "; bare prompt" if agent_config.get(PREAMBLE_OPTION, True) is False else ""
    return _agent_version(kind_name, agent_config) + bare


def _agent_version(kind_name: str, agent_config: Mapping[str, Any]) -> str:
    info = KINDS.get(kind_name)
    if info is None:  # a plugin kind: its package's version
        entry = plugin_entry_points().get(kind_name)
        package = entry.dist.name if entry is not None and entry.dist is not None else kind_name
        return f"{kind_name} {_package_version(package)}"
    if not info.cli:
        return kind_name
    binary, _ = find_cli(info.name, info.cli, agent_config, info.cli_variable)
    return f"{kind_name} {cli_version(binary, info.version_args) if binary else 'not installed'}"


def cli_version(binary: str, args: tuple[str, ...]) -> str:
    real = os.path.realpath(binary)
    try:
        stat = os.stat(real)
    except OSError:
        return "unknown"
    return _asked_version(real, stat.st_size, stat.st_mtime_ns, args)


@functools.cache
def _asked_version(real: str, size: int, mtime: int, args: tuple[str, ...]) -> str:
    """A CLI's `--version` line, asked once per binary (path, size, modification time)."""
    try:
        done = subprocess.run(
            [real, *args], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = (done.stdout.strip() or done.stderr.strip()).splitlines()
    return lines[0][:120] if done.returncode == 0 and lines else "unknown"


def _package_version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


def answerer_identity(simulation: Mapping[str, Any]) -> str:
    name = simulation.get("answerer") or ("scripted" if simulation.get("answers") else "persona")
    if name == "scripted":
        return "scripted"
    if name == "persona":
        provider = os.environ.get("EVALSITE_ANSWERER_PROVIDER") or "anthropic"
        model = simulation.get("model") or os.environ.get("EVALSITE_ANSWERER_MODEL") or "default"
        return f"persona {provider}/{model}"
    entry = _answerer_entry(name)
    return f"{name} {_package_version(entry) if entry else 'unknown'}"


def _answerer_entry(name: str) -> str | None:
    from importlib.metadata import entry_points

    for entry in entry_points(group="evalsite.answerers"):
        if entry.name == name and entry.dist is not None:
            return entry.dist.name
    return None


def grader_identity(criteria: list[Mapping[str, Any]]) -> str:
    parts = [f"criteria {grader_digest()}"]
    models = sorted(
        {
            f"{os.environ.get('EVALSITE_JUDGE_PROVIDER') or 'anthropic'}/{_judge_model(criterion)}"
            for criterion in criteria
            if criterion.get("type") in ("llm_judge", "agent_judge") and criterion.get("enabled", True)
        }
    )
    return "; ".join(parts + [f"judge {model}" for model in models])


def _judge_model(criterion: Mapping[str, Any]) -> str:
    agent = criterion["agent"] if isinstance(criterion.get("agent"), dict) else {}
    return str(
        criterion.get("model") or agent.get("model") or os.environ.get("EVALSITE_JUDGE_MODEL") or "default"
    )


@functools.cache
def grader_digest() -> str:
    """A digest of the code that grades: the criterion specs and their implementations."""
    digest = hashlib.sha256()
    for source in GRADER_SOURCES:
        path = BASE / source
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            digest.update(str(file.relative_to(BASE)).encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


@functools.cache
def sandbox_environment(bwrap: str) -> dict[str, str]:
    """The namespace sandbox's own components: its bubblewrap and the system it shows read-only."""
    return {
        "sandbox": f"bubblewrap {_asked_version(bwrap, 0, 0, ('--version',)).split()[-1]}",
        "system": _system(),
    }


def _system() -> str:
    try:
        release = dict(
            line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line
        )
        return release.get("PRETTY_NAME", "").strip('"') or platform.platform()
    except OSError:
        return platform.platform()
