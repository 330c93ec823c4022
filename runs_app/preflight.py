"""Launch pre-flight: before any trial exists, whether the live workers can serve each variant
of a launch, and what to do when they cannot. The experiment page, the API and `evalrun` ask it
before they launch; a launch with problems needs a "launch anyway".

What a variant needs of the worker that runs its trials (`needs`) is matched against what each
live worker reported of itself in its heartbeat (`offers`): one row of NEEDS per kind of need,
so a new one (a capability a task asks for) is a row there and an entry in `offers`.

Besides the workers, the variant's own files: a command agent whose script its command would
miss (`specs.attachments`) fails every trial without an error to read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from evalsite.versioning import code_version
from experiments_app.definitions import files_beside_yaml
from experiments_app.models import Experiment
from experiments_app.specs.agent_kinds import DEFAULT_KIND, KINDS
from experiments_app.specs.attachments import script_problems
from experiments_app.specs.providers import PROVIDERS
from runs_app import control
from runs_app.engine import agents
from runs_app.launching import LaunchError, LaunchOptions, preview_trials
from runs_app.models import Run, Trial, Worker

OK, WARN, FAIL, UNCHECKED = "ok", "warn", "fail", "unchecked"


@dataclass(frozen=True)
class Need:
    """One thing a variant needs of its worker: `kind` is a row of NEEDS, `name` what of it."""

    kind: str  # "cli", "provider", "capability"
    name: str  # "claude-code", "anthropic", "containers"


@dataclass(frozen=True)
class NeedKind:
    check: str  # the column's name, in words
    what: Callable[[str], str]  # the need, in words
    fix: Callable[[str], str]  # what makes a worker offer it


def _cli_fix(kind: str) -> str:
    info = KINDS[kind]
    return (
        f"install the {info.cli} CLI on the worker hosts (`make agents` in the checkout, or set "
        f"{info.cli_variable} to its path), then restart their workers"
    )


def _provider_fix(name: str) -> str:
    row = PROVIDERS[name]
    token = f" (or {row.token_variable})" if row.token_variable else ""
    return (
        f"set {row.key_variable}{token} in the environment of the workers and restart them (the key stays "
        "on the worker: never stored, never in a sandbox)"
    )


NEEDS: dict[str, NeedKind] = {
    "cli": NeedKind("agent CLI", lambda kind: f"the {KINDS[kind].cli} CLI ({kind})", _cli_fix),
    "provider": NeedKind(
        "API key", lambda name: f"a key for {name} ({PROVIDERS[name].key_variable})", _provider_fix
    ),
    "capability": NeedKind(
        "capability",
        lambda name: f"a worker that runs {name}",
        lambda name: f"start a worker on a host that can run {name} (docs/deploy.md)",
    ),
}


def needs(agent: dict, sandbox: dict | None) -> list[Need]:
    """What one resolved trial config needs of its worker: a CLI kind's CLI (unless the variant
    names its own `binary`, found on the worker as it starts) and a key for each model API it
    calls; a container task, a worker that runs containers."""
    kind = agent.get("type") or DEFAULT_KIND
    found = []
    info = KINDS.get(kind)
    if info is not None and info.cli:
        if not agent.get("binary"):
            found.append(Need("cli", kind))
        found += [Need("provider", api) for api in agents.get_agent(kind).apis(agent) if api in PROVIDERS]
    if (sandbox or {}).get("driver") == "docker":
        found.append(Need("capability", "containers"))
    return found


def offers(worker: Worker) -> dict[str, set[str]]:
    """What a worker reported it can serve, by kind of need."""
    # {"containers": true, "engine": ...}: the capabilities are the keys set to true.
    capabilities = worker.capabilities or {}
    return {
        "cli": set(worker.agent_versions or {}),
        "provider": set(worker.providers or []),
        "capability": {name for name, value in capabilities.items() if value is True},
    }


@dataclass
class Row:
    variant: str
    check: str  # the kind of need in words ("agent CLI") or "files"
    need: str
    level: str  # OK, WARN, FAIL or UNCHECKED
    detail: str
    fix: str = ""

    @property
    def line(self) -> str:
        fix = f"; {self.fix}" if self.fix else ""
        return f"{self.variant}: {self.need}: {self.detail}{fix}"


@dataclass
class Preflight:
    rows: list[Row] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)  # the live workers that would take its trials
    notes: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # the launch itself would be refused

    @property
    def problems(self) -> list[Row]:
        """What would make trials error: each needs fixing, leaving its variant out, or a
        "launch anyway"."""
        return [row for row in self.rows if row.level in (WARN, FAIL)]

    def variants_with_problems(self) -> list[str]:
        return list(dict.fromkeys(row.variant for row in self.problems))

    def to_dict(self) -> dict:
        return {
            "ok": not self.problems and not self.refused,
            "workers": self.workers,
            "notes": self.notes,
            "refused": self.refused,
            "checks": [
                {
                    "variant": r.variant,
                    "check": r.check,
                    "need": r.need,
                    "level": r.level,
                    "detail": r.detail,
                    "fix": r.fix,
                }
                for r in self.rows
            ],  # fmt: skip
        }


def check(
    experiment: Experiment, options: LaunchOptions | None = None, trials: list[Trial] | None = None
) -> Preflight:
    """The pre-flight of launching `experiment` with `options` (`trials`: the launch's preview,
    when the caller has it)."""
    options = options or LaunchOptions()
    report = Preflight()
    if trials is None:
        try:
            trials = preview_trials(experiment, options)
        except LaunchError as exc:
            report.refused = exc.problems
            return report
    workers = _takers(options, report)
    files = files_beside_yaml(experiment)
    for variant, configs in _configs_by_variant(trials).items():
        wanted: dict[Need, None] = {}
        for agent, sandbox in configs:
            wanted.update(dict.fromkeys(needs(agent, sandbox)))
            report.rows += [
                Row(variant, "files", f"its {option}", FAIL, message, "edit the variant")
                for option, message in _script_problems(agent, files)
            ]
        report.rows += [_row(variant, need, workers) for need in wanted]
    return report


def _configs_by_variant(trials: list[Trial]) -> dict[str, list[tuple[dict, dict]]]:
    """Each variant's distinct (agent, sandbox) configs among the trials (tasks may set them)."""
    found: dict[str, dict[str, tuple[dict, dict]]] = {}
    for trial in trials:
        agent, sandbox = trial.config.get("agent") or {}, trial.config.get("sandbox") or {}
        key = json.dumps([agent, sandbox.get("driver")], sort_keys=True, default=str)
        found.setdefault(trial.variant.slug, {}).setdefault(key, (agent, sandbox))
    return {variant: list(configs.values()) for variant, configs in found.items()}


def _script_problems(agent: dict, files: list[str]) -> list[tuple[str, str]]:
    return script_problems(agent, files) if (agent.get("type") or DEFAULT_KIND) == "command" else []


def _takers(options: LaunchOptions, report: Preflight) -> list[Worker]:
    """The live workers that would take the launch's trials (its code version's, or any with
    `any_code_version`); a note when there are none."""
    would_be = Run(code_version=code_version(), any_code_version=options.any_code_version)
    alive = list(control.live_workers().order_by("hostname", "name"))
    takers = [worker for worker in alive if control.may_take(would_be, worker)]
    report.workers = [worker.name for worker in takers]
    if not alive:
        report.notes.append(
            "no worker is running, so nothing was checked against one: the run's trials wait until a "
            "worker starts (make worker)"
        )
    elif not takers:
        versions = ", ".join(sorted({worker.code_version or "?" for worker in alive}))
        report.notes.append(
            f"no live worker runs this code (version {would_be.code_version}; they run {versions}), so "
            "nothing was checked: restart the workers, or launch with any code version"
        )
    return takers


def _row(variant: str, need: Need, workers: list[Worker]) -> Row:
    kind = NEEDS[need.kind]
    what, fix = kind.what(need.name), kind.fix(need.name)
    if not workers:
        return Row(variant, kind.check, what, UNCHECKED, "no live worker to check")
    able = [worker for worker in workers if need.name in offers(worker)[need.kind]]
    if not able:
        names = ", ".join(_host(worker) for worker in workers)
        return Row(
            variant, kind.check, what, FAIL,
            f"no live worker has it ({names}): every trial of {variant} would end in error", fix,
        )  # fmt: skip
    if len(able) < len(workers):
        missing = ", ".join(_host(worker) for worker in workers if worker not in able)
        return Row(
            variant, kind.check, what, WARN,
            f"only {len(able)} of {len(workers)} live workers have it: trials sent to {missing} would end "
            "in error", fix,
        )  # fmt: skip
    if need.kind == "cli":
        return _versions_row(variant, kind.check, what, need.name, able)
    return Row(variant, kind.check, what, OK, f"on {_count(able)}")


def _versions_row(variant: str, check: str, what: str, kind: str, workers: list[Worker]) -> Row:
    """The CLI's version on each worker: one variant whose trials run different versions
    compares two agents under one name."""
    versions: dict[str, list[str]] = {}
    for worker in workers:
        versions.setdefault(worker.agent_versions[kind], []).append(_host(worker))
    if len(versions) == 1:
        return Row(variant, check, what, OK, f"{next(iter(versions))} on {_count(workers)}")
    spread = "; ".join(f"{version} on {', '.join(hosts)}" for version, hosts in sorted(versions.items()))
    return Row(
        variant, check, what, WARN,
        f"the workers run different versions ({spread}): its trials would run different agents",
        f"install one version of the {KINDS[kind].cli} CLI on every worker host, then restart the workers",
    )  # fmt: skip


def _host(worker: Worker) -> str:
    return worker.hostname or worker.name


def _count(workers: list[Worker]) -> str:
    return f"{len(workers)} live worker{'s' if len(workers) != 1 else ''}"
