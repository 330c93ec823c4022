"""Import task and experiment YAML into the database: all or nothing.

The loader (loading.py) validates every file first; only when nothing is wrong
does one transaction write bundles, tasks, versions and set memberships.
"""

from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import transaction

from experiments_app.loading import LoadedTask, SpecIssue, load_experiment, load_tasks
from experiments_app.models import Bundle, Experiment, Task, TaskSet, TaskVersion, Variant

# Variant fields with their own columns; every other layer field lands in `overrides`.
VARIANT_COLUMNS = ("agent", "run_limits", "prompt_mutations", "repeats")


class ImportFailed(Exception):
    """Nothing was imported; `issues` lists every problem with file, line and field."""

    def __init__(self, issues: list[SpecIssue] | list[str]):
        self.issues = [str(issue) for issue in issues]
        super().__init__("\n".join(self.issues))


@dataclass
class TaskImportReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    skipped_files: list[str] = field(default_factory=list)

    @property
    def task_slugs(self) -> list[str]:
        return self.created + self.updated + self.unchanged

    def summary(self) -> str:
        return (
            f"{len(self.created)} created, {len(self.updated)} updated (new version), "
            f"{len(self.unchanged)} unchanged"
        )


def import_tasks(
    paths: list[Path], *, root: Path | None = None, task_set: str | None = None
) -> TaskImportReport:
    """Load every task under `paths` and store them, or raise ImportFailed and store nothing."""
    result = load_tasks([Path(p) for p in paths], root=root, max_bundle_bytes=settings.TASK_BUNDLE_MAX_BYTES)
    if result.errors:
        raise ImportFailed(result.errors)
    report = TaskImportReport(
        warnings=[str(w) for w in result.warnings], skipped_files=[str(p) for p in result.skipped]
    )
    with transaction.atomic():
        _store_tasks(result.tasks, report)
        if task_set:
            tasks_set, _ = TaskSet.objects.get_or_create(name=task_set)
            tasks_set.tasks.add(*Task.objects.filter(slug__in=report.task_slugs))
    return report


def _store_tasks(loaded: list[LoadedTask], report: TaskImportReport) -> None:
    """Write bundles, then new tasks, then new versions of changed tasks, in bulk."""
    existing = {task.slug: task for task in Task.objects.filter(slug__in=[t.task_id for t in loaded])}
    known_digests = set(
        Bundle.objects.filter(digest__in=[t.bundle.digest for t in loaded]).values_list("digest", flat=True)
    )
    new_bundles = {}
    for item in loaded:
        if item.bundle.digest not in known_digests:
            new_bundles[item.bundle.digest] = Bundle(
                digest=item.bundle.digest, data=item.bundle.blob, size=item.bundle.size
            )
    Bundle.objects.bulk_create(new_bundles.values(), batch_size=200)

    to_create, to_update = [], []
    for item in loaded:
        task = existing.get(item.task_id)
        if task is None:
            task = Task(slug=item.task_id, version=1)
            to_create.append((task, item))
            report.created.append(item.task_id)
        elif task.bundle_id != item.bundle.digest:
            task.version += 1
            to_update.append((task, item))
            report.updated.append(item.task_id)
        else:
            report.unchanged.append(item.task_id)
            continue
        _fill_task(task, item)

    Task.objects.bulk_create([task for task, _ in to_create], batch_size=200)
    update_fields = [
        "description", "prompt", "tags", "skip", "spec", "source_yaml", "source_path",
        "bundle", "version", "warnings",
    ]  # fmt: skip
    Task.objects.bulk_update([task for task, _ in to_update], update_fields, batch_size=200)
    TaskVersion.objects.bulk_create(
        [_version_of(task, item) for task, item in to_create + to_update], batch_size=200
    )


def _fill_task(task: Task, item: LoadedTask) -> None:
    spec = item.spec
    task.description = spec.description
    task.prompt = item.prompt
    task.tags = list(spec.tags)
    task.skip = spec.skip
    task.spec = spec.model_dump(mode="json", exclude_unset=True)
    task.source_yaml = item.source_yaml
    task.source_path = str(item.source_path)
    task.bundle_id = item.bundle.digest
    task.warnings = [str(w) for w in item.warnings]


def _version_of(task: Task, item: LoadedTask) -> TaskVersion:
    return TaskVersion(
        task=task,
        number=task.version,
        spec=task.spec,
        prompt=task.prompt,
        source_yaml=task.source_yaml,
        yaml_path=item.yaml_path_in_bundle,
        bundle_id=item.bundle.digest,
        dataset_rows=item.dataset_rows or [],
    )


@dataclass
class ExperimentImportReport:
    experiment: Experiment
    created: bool
    warnings: list[str] = field(default_factory=list)


def import_experiment(path: Path, *, root: Path | None = None) -> ExperimentImportReport:
    """Store one experiment YAML and its variants (replacing the variants it no longer lists)."""
    result = load_experiment(Path(path), root=root, max_bundle_bytes=settings.TASK_BUNDLE_MAX_BYTES)
    if result.errors or result.experiment is None:
        raise ImportFailed(result.errors)
    loaded = result.experiment
    spec = loaded.spec
    missing_sets = sorted(set(spec.task_sets) - set(TaskSet.objects.values_list("name", flat=True)))
    if missing_sets:
        raise ImportFailed(
            [f"{loaded.source_path}: task_sets: no task set named {name!r}" for name in missing_sets]
        )
    defaults = spec.defaults.model_dump(mode="json", exclude_unset=True)
    with transaction.atomic():
        Bundle.objects.get_or_create(
            digest=loaded.bundle.digest, defaults={"data": loaded.bundle.blob, "size": loaded.bundle.size}
        )
        experiment, created = Experiment.objects.update_or_create(
            slug=spec.experiment_id,
            defaults={
                "description": spec.description,
                "defaults": defaults,
                "include_tags": list(spec.tags),
                "exclude_tags": list(spec.exclude_tags),
                "repeats": defaults.get("repeats") or 1,
                "max_parallel": spec.max_parallel,
                "gates": [gate.model_dump(mode="json") for gate in spec.gates],
                "source_yaml": loaded.source_yaml,
                "yaml_path": loaded.yaml_path_in_bundle,
                "bundle_id": loaded.bundle.digest,
            },
        )
        experiment.task_sets.set(TaskSet.objects.filter(name__in=spec.task_sets))
        _store_variants(experiment, loaded)
    return ExperimentImportReport(experiment, created, [str(w) for w in result.warnings])


def _store_variants(experiment: Experiment, loaded) -> None:
    spec = loaded.spec
    wanted = [v.variant_id for v in spec.variants]
    stale = experiment.variants.exclude(slug__in=wanted)
    in_use = list(stale.filter(trials__isnull=False).distinct().values_list("slug", flat=True))
    if in_use:
        raise ImportFailed(
            [
                f"{loaded.source_path}: variants: variant {slug!r} has runs and cannot be removed; "
                "keep it in the YAML or import under a new experiment_id"
                for slug in in_use
            ]
        )
    stale.delete()
    for position, variant_spec in enumerate(spec.variants):
        data = variant_spec.model_dump(mode="json", exclude_unset=True)
        data.pop("variant_id")
        description = data.pop("description", "")
        if "initial_prompt_file" in data:
            # Stored as text so a run needs no file lookup; the file stays in the bundle.
            data.pop("initial_prompt_file")
            data["initial_prompt"] = loaded.variant_prompts[variant_spec.variant_id]
        columns = {name: data.pop(name) for name in VARIANT_COLUMNS if name in data}
        variant, _ = Variant.objects.update_or_create(
            experiment=experiment,
            slug=variant_spec.variant_id,
            defaults={
                "description": description,
                "position": position,
                "agent": columns.get("agent") or {},
                "run_limits": columns.get("run_limits") or {},
                "prompt_mutations": columns.get("prompt_mutations") or [],
                "repeats": columns.get("repeats"),
                "overrides": data,
            },
        )
        if variant.slug == spec.baseline:
            experiment.baseline = variant
    experiment.save(update_fields=["baseline"])
