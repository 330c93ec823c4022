"""Launching a run: resolve every task × variant × replicate × dataset row into Trial rows.

Used by the web, the command line and the tests. Everything is written in one transaction
and the first dispatch is enqueued only once it commits.
"""

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

import evalsite
from evalsite.versioning import code_version
from experiments_app.definitions import may_define_agents, privileged_agent
from experiments_app.models import Experiment, TaskVersion, Variant
from experiments_app.specs.resolve import (
    OverrideError,
    ResolveError,
    config_fingerprint,
    parse_overrides,
    resolve,
    trial_layers,
)
from runs_app import control
from runs_app.analysis import rollup
from runs_app.analysis.load import load
from runs_app.analysis.stats import planning
from runs_app.engine import hosts, suite_hooks
from runs_app.models import Run, Trial

ROW_PLACEHOLDER = re.compile(r"\$\{row\.([A-Za-z_][\w-]*)\}")
# coder-eval's fixed seed for `--sample N` (`task_loader._SMOKE_SAMPLE_SEED`): the same rows every run.
SAMPLE_ROWS_SEED = 0


class LaunchError(ValueError):
    """The run cannot start; `problems` says why, one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass
class LaunchOptions:
    overrides: list[str] = field(default_factory=list)  # path=value strings
    repeats: int | None = None
    max_parallel: int | None = None
    tags: list[str] | None = None  # replaces the experiment's include tags
    exclude_tags: list[str] | None = None
    include_skipped: bool = False
    task_slugs: list[str] | None = None  # only these tasks (e.g. the files given to evalrun)
    sample: int | None = None  # this many tasks, chosen with `seed`
    sample_rows: int | None = None  # coder-eval's --sample: this many rows of each dataset task
    sample_per_stratum: int | None = None  # dataset rows per stratum
    seed: int | None = None
    keep_artifacts: bool = False
    agent_type: str | None = None  # -T: for every variant
    model: str | None = None  # -m: for every variant
    any_code_version: bool = False  # let workers of other code versions take its trials
    variants: list[str] | None = None  # only these variants (e.g. leaving out one pre-flight refused)


def _in_random_unit_order(trials: list[Trial], seed: int) -> list[Trial]:
    """The trials with their units (task, dataset row) in a seeded random order: trials are sent
    in creation order (replicate by replicate), so the units a live run has finished are a random
    sample of its units, which its anytime-valid intervals assume (`inference.confidence_sequence`)."""
    units = list(dict.fromkeys((trial.task_version_id, trial.dataset_row_id) for trial in trials))
    random.Random(seed).shuffle(units)
    rank = {unit: index for index, unit in enumerate(units)}
    return sorted(trials, key=lambda trial: rank[(trial.task_version_id, trial.dataset_row_id)])


def launch_run(experiment: Experiment, *, user=None, options: LaunchOptions | None = None) -> Run:
    """Create a run with all its trials (queued) and dispatch it once committed."""
    options = options or LaunchOptions()
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(2**31)
    overrides = _override_layer(options)
    if privileged_agent(overrides.get("agent")) and not may_define_agents(user):
        raise LaunchError(
            [f"only staff and members of the {settings.AGENT_AUTHORS_GROUP!r} group may run a command "
             "agent or hand agents secrets through launch options"]
        )  # fmt: skip
    versions, variants, trials = _resolved_trials(experiment, options, seed)
    trials = _in_random_unit_order(trials, seed)
    config = _frozen_config(experiment, variants, versions, options, seed)
    boxed = sorted({t.task_version.task.slug for t in trials if hosts.runs_in_container(t.config)})
    if boxed:
        refused = sorted({why for t in trials if (why := hosts.image_refuses_agent(t.config))})
        if refused:
            raise LaunchError(refused)
        _ensure_container_workers(boxed)
        config["needs_containers"] = True  # its trials go to container workers (control.trial_queue_of)
    with transaction.atomic():
        run = Run.objects.create(
            experiment=experiment,
            config=config,
            suite_status=Run.Suite.PENDING if suite_hooks.has_suite(config) else Run.Suite.NONE,
            overrides=list(options.overrides),
            max_parallel=options.max_parallel or experiment.max_parallel,
            sample_seed=seed,
            keep_artifacts=options.keep_artifacts,
            code_version=code_version(),
            any_code_version=options.any_code_version,
            gates=list(experiment.gates),
            started_by=user,
        )
        for trial in trials:
            trial.run = run
        Trial.objects.bulk_create(trials, batch_size=500)
        run.fingerprint = _run_fingerprint(trials)
        run.save(update_fields=["fingerprint"])
        rollup.recount(run)
        transaction.on_commit(partial(control.enqueue_dispatch, run.pk))
    return run


def _ensure_container_workers(tasks: list[str]) -> None:
    """A run with container tasks starts only if a live worker runs containers: else its trials
    would wait for one (a container task never runs on the host). The LaunchError says why each
    live host cannot, and what to do."""
    if control.container_workers().exists():
        return
    named = ", ".join(tasks[:5]) + (f" and {len(tasks) - 5} more" if len(tasks) > 5 else "")
    reasons = {
        worker.hostname or worker.name: (worker.capabilities or {}).get("reason") or "it has not said"
        for worker in control.live_workers().order_by("hostname", "name")
    }
    if reasons:
        why = "no live worker runs containers (" + "; ".join(f"{h}: {r}" for h, r in reasons.items()) + ")"
    else:
        why = "no worker is alive"
    raise LaunchError(
        [f"{named} run in a container (sandbox.driver: docker) and {why}: start the container "
         "engine on a worker host (make containers) and restart its worker (docs/deploy.md, "
         "adding a container host), or leave these tasks out of the run"]
    )  # fmt: skip


def _resolved_trials(
    experiment: Experiment, options: LaunchOptions, seed: int
) -> tuple[list[TaskVersion], list[Variant], list[Trial]]:
    """The selected task versions, the variants, and every trial resolved (unsaved); a
    LaunchError lists every task × variant that cannot resolve."""
    overrides = _override_layer(options)
    versions = _selected_versions(experiment, options, seed)
    variants = launched_variants(experiment, options)
    if not variants:
        raise LaunchError([f"experiment {experiment.slug} has no variants"])
    if not versions:
        raise LaunchError([f"experiment {experiment.slug} selects no tasks (check its task sets and tags)"])
    trials, problems = [], []
    for version in versions:
        for variant in variants:
            try:
                trials += _trials_for(experiment, version, variant, overrides, options, seed, len(trials))
            except LaunchError:
                raise
            except (ResolveError, OverrideError, ValueError) as exc:
                problems.append(f"{version.task.slug} × {variant.slug}: {exc}")
    if problems:
        raise LaunchError(problems)
    return versions, variants, trials


def launched_variants(experiment: Experiment, options: LaunchOptions) -> list[Variant]:
    """The experiment's variants a launch runs: all of them, or those `options.variants` names
    (in the experiment's order); a name it does not have is a LaunchError."""
    variants = list(experiment.variants.order_by("position", "pk"))
    if options.variants is None:
        return variants
    known = {variant.slug for variant in variants}
    unknown = [name for name in options.variants if name not in known]
    if unknown:
        listed = ", ".join(sorted(known))
        raise LaunchError(
            [f"experiment {experiment.slug} has no variant {name!r} (its variants: {listed})"
             for name in unknown]
        )  # fmt: skip
    if not options.variants:
        raise LaunchError(["name at least one variant to launch"])
    return [variant for variant in variants if variant.slug in options.variants]


def preview_trials(experiment: Experiment, options: LaunchOptions | None = None) -> list[Trial]:
    """Every trial a launch with `options` would create, resolved and unsaved (`evalrun --plan`)."""
    options = options or LaunchOptions()
    seed = options.seed if options.seed is not None else 0
    return _resolved_trials(experiment, options, seed)[2]


def rerun_options(run: Run) -> LaunchOptions:
    """The options that launch the same tasks with the same settings as `run` did."""
    config = run.config or {}
    chosen = config.get("options") or {}
    experiment = config.get("experiment") or {}
    return LaunchOptions(
        overrides=list(run.overrides),
        repeats=chosen.get("repeats"),
        max_parallel=run.max_parallel,
        tags=experiment.get("include_tags"),
        exclude_tags=experiment.get("exclude_tags"),
        include_skipped=bool(chosen.get("include_skipped")),
        task_slugs=sorted(config.get("tasks") or {}) or None,
        sample_rows=chosen.get("sample_rows"),
        sample_per_stratum=chosen.get("sample_per_stratum"),
        seed=run.sample_seed,
        keep_artifacts=run.keep_artifacts,
        agent_type=chosen.get("agent_type"),
        model=chosen.get("model"),
        variants=chosen.get("variants"),
    )


def run_plan(experiment: Experiment, options: LaunchOptions | None = None) -> planning.Plan:
    """What a run of `experiment` with `options` could detect: its units (tasks × dataset rows,
    as a launch would select them), repeats and variants against the baseline (Holm over them),
    with the rate and variance of its latest finished run when there is one."""
    options = options or LaunchOptions()
    seed = options.seed if options.seed is not None else 0
    versions = _selected_versions(experiment, options, seed)
    units = sum(len(_dataset_rows(version, options, seed)) for version in versions)
    variants = launched_variants(experiment, options)
    repeats = options.repeats or min((v.effective_repeats() for v in variants), default=1)
    model = planning.ASSUMED
    pilot = experiment.runs.filter(status=Run.Status.FINISHED).order_by("-finished_at", "-pk").first()
    if pilot is not None:
        model = planning.pilot_model(load([pilot]), None, f"from run #{pilot.pk}") or model
    return planning.plan(units, repeats, model, compared=max(1, len(variants) - 1))


def _override_layer(options: LaunchOptions) -> dict:
    items = list(options.overrides)
    if options.agent_type:
        items.append(f"agent.type={options.agent_type}")
    if options.model:
        items.append(f"agent.model={options.model}")
    try:
        return parse_overrides(items)
    except OverrideError as exc:
        raise LaunchError([str(exc)]) from None


def _selected_versions(experiment: Experiment, options: LaunchOptions, seed: int) -> list[TaskVersion]:
    tasks = experiment.selected_tasks(include_skipped=options.include_skipped)
    if options.tags is not None or options.exclude_tags is not None:
        include = experiment.include_tags if options.tags is None else options.tags
        exclude = experiment.exclude_tags if options.exclude_tags is None else options.exclude_tags
        tasks = tasks.model.objects.filter(pk__in=tasks.values("pk")).with_tags(include, exclude)
    if options.task_slugs is not None:
        tasks = tasks.filter(slug__in=options.task_slugs)
    versions = list(
        TaskVersion.objects.filter(task__in=tasks, number=F("task__version"))
        .select_related("task", "bundle")
        .order_by("task__slug")
    )
    if options.sample is not None and options.sample < len(versions):
        versions = sorted(random.Random(seed).sample(versions, options.sample), key=lambda v: v.task.slug)
    return versions


def _task_layer(version: TaskVersion) -> dict:
    spec = dict(version.spec)
    if "initial_prompt_file" in spec:
        # The loader read the file at import; trials carry the text, not a path.
        spec.pop("initial_prompt_file")
        spec["initial_prompt"] = version.prompt
    return spec


def _trials_for(
    experiment: Experiment,
    version: TaskVersion,
    variant: Variant,
    overrides: dict,
    options: LaunchOptions,
    seed: int,
    so_far: int = 0,
) -> list[Trial]:
    layers = trial_layers(_task_layer(version), experiment.defaults, variant.layer(), overrides)
    resolved = resolve(layers)
    config = resolved.config
    repeats = options.repeats or overrides.get("repeats") or variant.effective_repeats()
    rows = _dataset_rows(version, options, seed)
    if so_far + repeats * len(rows) > settings.MAX_TRIALS_PER_RUN:
        raise LaunchError(
            [
                f"this run would have more than {settings.MAX_TRIALS_PER_RUN} trials "
                f"(repeats {repeats} × {len(rows)} dataset row(s) for {version.task.slug} × "
                f"{variant.slug} alone): lower repeats or sample tasks, or raise MAX_TRIALS_PER_RUN"
            ]
        )
    trials = []
    for row_id, row in rows:
        row_config = _substitute_row(config, row, version.task.slug, row_id) if row is not None else config
        fingerprint = trial_fingerprint(version.bundle_id, row_config)
        for replicate in range(repeats):
            trials.append(
                Trial(
                    task_version=version,
                    variant=variant,
                    replicate=replicate,
                    dataset_row_id=row_id,
                    dataset_row=row,
                    config=row_config,
                    lineage=resolved.lineage,
                    prompt=row_config.get("initial_prompt") or "",
                    config_fingerprint=fingerprint,
                )
            )
    return trials


def _dataset_rows(version: TaskVersion, options: LaunchOptions, seed: int) -> list[tuple[str, dict | None]]:
    """(row id, row) pairs; one (“”, None) pair for a task without a dataset."""
    dataset = version.spec.get("dataset")
    if not dataset:
        return [("", None)]
    id_field = dataset.get("id_field", "id")
    rows = sampled_rows(list(version.dataset_rows), dataset, options, seed)
    return [(str(row[id_field]), row) for row in rows]


def sampled_rows(rows: list[dict], dataset: dict, options: LaunchOptions, seed: int) -> list[dict]:
    """The dataset rows a launch runs, picked as coder-eval 0.12.16 picks them
    (`task_loader.expand_dataset`), so the same seed gives the same rows in both:

    1. `sample_rows` (coder-eval's `--sample N`) draws N rows uniformly with the fixed seed 0,
       whatever `sample_per_stratum` says (all rows when N is not below their count);
    2. else `sample_per_stratum` (the option, or the dataset's) keeps up to N rows per stratum:
       strata keyed by `str(row.get(stratify_field, ""))` and walked in first-seen order, one
       random.Random(sample_seed) drawing from each stratum larger than N in turn. Without a
       `sample_seed` the run's seed is used (coder-eval draws afresh), so a resume picks the same
       rows."""
    if options.sample_rows is not None:
        if options.sample_rows < len(rows):
            return random.Random(SAMPLE_ROWS_SEED).sample(rows, options.sample_rows)
        return rows
    per_stratum = options.sample_per_stratum or dataset.get("sample_per_stratum")
    if not per_stratum:
        return rows
    field = dataset.get("stratify_field") or "expected_skill"
    row_seed = dataset.get("sample_seed")
    rng = random.Random(seed if row_seed is None else row_seed)
    strata: dict[str, list[dict]] = {}
    for row in rows:
        strata.setdefault(str(row.get(field, "")), []).append(row)
    picked: list[dict] = []
    for members in strata.values():
        picked += members if len(members) <= per_stratum else rng.sample(members, per_stratum)
    return picked


def _substitute_row(config: dict, row: dict, task_slug: str, row_id: str) -> dict:
    """Replace `${row.field}` in the prompt and the criteria (their commands included), as
    coder-eval does (`task_loader.expand_dataset`): pre_run and post_run keep the text as written."""

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            return ROW_PLACEHOLDER.sub(lambda m: _row_value(row, m.group(1), task_slug, row_id), value)
        if isinstance(value, list):
            return [fill(item) for item in value]
        if isinstance(value, dict):
            return {key: fill(item) for key, item in value.items()}
        return value

    config = dict(config)
    for key in ("initial_prompt", "success_criteria"):
        if key in config:
            config[key] = fill(config[key])
    return config


def _row_value(row: dict, name: str, task_slug: str, row_id: str) -> str:
    if name not in row:
        raise ValueError(
            f"dataset row {row_id!r} of task {task_slug} has no field {name!r} (used as ${{row.{name}}})"
        )
    value = row[name]
    if isinstance(value, dict | list):
        # coder-eval refuses these too: a structure has no one right text form.
        raise ValueError(
            f"dataset row {row_id!r} of task {task_slug}: ${{row.{name}}} must be a scalar "
            f"(text, number, boolean or null), got a {type(value).__name__}"
        )
    return "" if value is None else str(value)  # coder-eval's str(): True -> "True", 2.0 -> "2.0"


def trial_fingerprint(bundle_digest: str, config: dict) -> str:
    """sha256 over the task bundle, the resolved config, its criteria and the evalsite version."""
    payload = {
        "bundle": bundle_digest,
        "config": config_fingerprint(config),
        "criteria": config_fingerprint({"criteria": config.get("success_criteria", [])}),
        "evalsite": evalsite.__version__,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _run_fingerprint(trials: list[Trial]) -> str:
    digest = hashlib.sha256()
    for fingerprint in sorted({t.config_fingerprint for t in trials}):
        digest.update(fingerprint.encode())
    return digest.hexdigest()


def _frozen_config(experiment, variants, versions, options: LaunchOptions, seed: int) -> dict:
    return {
        "experiment": {
            "slug": experiment.slug,
            "defaults": experiment.defaults,
            "repeats": experiment.repeats,
            "include_tags": options.tags if options.tags is not None else experiment.include_tags,
            "exclude_tags": options.exclude_tags
            if options.exclude_tags is not None
            else experiment.exclude_tags,
            "bundle": experiment.bundle_id,
            "yaml_path": experiment.yaml_path,
        },
        # A launch that leaves the baseline out compares with its first variant.
        "baseline": experiment.baseline.slug
        if experiment.baseline and experiment.baseline in variants
        else variants[0].slug,
        "variants": [
            {"slug": v.slug, "layer": v.layer(), "repeats": v.effective_repeats()} for v in variants
        ],
        "tasks": {v.task.slug: {"version": v.number, "digest": v.bundle_id} for v in versions},
        "overrides": list(options.overrides),
        "options": {
            "repeats": options.repeats,
            "sample": options.sample,
            "sample_rows": options.sample_rows,
            "sample_per_stratum": options.sample_per_stratum,
            "include_skipped": options.include_skipped,
            "agent_type": options.agent_type,
            "model": options.model,
            "variants": options.variants,
        },
        "seed": seed,
        "evalsite": evalsite.__version__,
        "launched_at": timezone.now().isoformat(),
    }


def current_criteria(trial: Trial, version: TaskVersion) -> list[dict]:
    """The success criteria `trial` would get from `version` of its task, with the layers its
    run froze (experiment defaults, its variant, the overrides) and its dataset row."""
    frozen = trial.run.config or {}
    variant_layer = next(
        (v["layer"] for v in frozen.get("variants", []) if v["slug"] == trial.variant.slug),
        trial.variant.layer(),
    )
    defaults = (frozen.get("experiment") or {}).get("defaults") or {}
    layers = trial_layers(
        _task_layer(version), defaults, variant_layer, _override_layer(rerun_options(trial.run))
    )
    config = resolve(layers).config
    if trial.dataset_row is not None:
        config = _substitute_row(config, trial.dataset_row, version.task.slug, trial.dataset_row_id)
    return config.get("success_criteria") or []
