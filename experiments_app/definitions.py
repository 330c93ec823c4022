"""The one write path for tasks and experiments: import, export, save from the form, duplicate,
the ad-hoc experiment of `evalrun`, and the experiment and tasks of an imported coder-eval run.

Imports are all or nothing: the loader (`specs.loading`) validates every file first; only when
nothing is wrong does one transaction write bundles, tasks, versions and set memberships.
A TaskVersion is only ever made by `Task.add_version`, so a task's `version` is its newest one.
"""

import io
import json
import tempfile
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml
from django.conf import settings
from django.db import transaction
from django.utils.text import slugify

from experiments_app.models import Bundle, Experiment, Task, TaskSet, TaskVersion, Variant
from experiments_app.specs import ExperimentSpec
from experiments_app.specs.bundles import (
    UnsafeBundle,
    check_member_name,
    make_bundle,
    read_bundle,
    write_bundle_files,
)
from experiments_app.specs.loading import LoadedTask, SpecIssue, load_experiment, load_tasks

# Variant fields with their own columns; every other layer field lands in `overrides`.
VARIANT_COLUMNS = ("agent", "run_limits", "prompt_mutations", "repeats")


class NotAllowed(Exception):
    """The user may not make this change (the message says who may)."""


def may_define_agents(user) -> bool:
    """Who may define a `command` agent or name secrets for an agent: what runs on the workers,
    and what they hand to it. Staff, the members of AGENT_AUTHORS_GROUP, and the command line
    (user None: the machine's operator)."""
    if user is None or user.is_staff:
        return True
    return user.groups.filter(name=settings.AGENT_AUTHORS_GROUP).exists()


def privileged_agent(agent: dict | None) -> bool:
    agent = agent or {}
    return agent.get("type") == "command" or "command" in agent or bool(agent.get("secrets"))


def _check_agent_changes(spec: ExperimentSpec, experiment: Experiment | None, user) -> None:
    if may_define_agents(user):
        return
    stored = {v.slug: v.agent for v in experiment.variants.all()} if experiment else {}
    stored_defaults = (experiment.defaults.get("agent") if experiment else None) or {}
    changed = []
    defaults = (spec.defaults.model_dump(mode="json", exclude_unset=True).get("agent")) or {}
    if privileged_agent(defaults) and defaults != stored_defaults:
        changed.append("defaults")
    for variant in spec.variants:
        agent = variant.model_dump(mode="json", exclude_unset=True).get("agent") or {}
        if privileged_agent(agent) and agent != stored.get(variant.variant_id):
            changed.append(variant.variant_id)
    if changed:
        raise NotAllowed(
            f"only staff and members of the {settings.AGENT_AUTHORS_GROUP!r} group may define a command "
            f"agent or name agent secrets ({', '.join(changed)}): ask one of them, or keep the agents "
            "as they were"
        )


class ImportFailed(Exception):
    """Nothing was imported; `issues` lists every problem with file, line and field."""

    def __init__(self, issues: list[SpecIssue] | list[str]):
        self.issues = [str(issue) for issue in issues]
        super().__init__("\n".join(self.issues))


# --- tasks ------------------------------------------------------------------------------------


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
    paths: list[Path], *, root: Path | None = None, task_set: str | None = None, lenient: bool = False
) -> TaskImportReport:
    """Load every task under `paths` and store them, or raise ImportFailed and store nothing.
    Unknown keys are errors unless `lenient` (then warnings in the report)."""
    result = load_tasks(
        [Path(p) for p in paths], root=root, max_bundle_bytes=settings.TASK_BUNDLE_MAX_BYTES, lenient=lenient
    )
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

    created, updated, versions = [], [], []
    for item in loaded:
        task = existing.get(item.task_id)
        if task is None:
            task = Task(slug=item.task_id)
            created.append(task)
            report.created.append(item.task_id)
        elif task.bundle_id != item.bundle.digest or task.skip != item.spec.skip:
            # Same files but another `skip`: a task first known from a run record (stored
            # skipped) becomes the runnable task its YAML describes.
            updated.append(task)
            report.updated.append(item.task_id)
        else:
            report.unchanged.append(item.task_id)
            continue
        versions.append(_add_loaded_version(task, item))

    Task.objects.bulk_create(created, batch_size=200)
    Task.objects.bulk_update(updated, Task.VERSIONED_FIELDS, batch_size=200)
    TaskVersion.objects.bulk_create(versions, batch_size=200)


def _add_loaded_version(task: Task, item: LoadedTask) -> TaskVersion:
    spec = item.spec
    return task.add_version(
        spec=spec.model_dump(mode="json", exclude_unset=True),
        prompt=item.prompt,
        source_yaml=item.source_yaml,
        source_path=str(item.source_path),
        yaml_path=item.yaml_path_in_bundle,
        bundle_id=item.bundle.digest,
        dataset_rows=item.dataset_rows or [],
        description=spec.description,
        tags=list(spec.tags),
        skip=spec.skip,
        warnings=[str(w) for w in item.warnings],
    )


def store_recorded_task(
    slug: str, *, spec: dict, source_yaml: str, yaml_name: str, prompt: str, description: str,
    tags: list[str], source_path: str, warnings: list[str],
) -> Task:  # fmt: skip
    """A task known only from another tool's run record (its YAML, none of its files). Marked
    skip, so experiments selecting "all tasks" never launch the incomplete bundle."""
    blob = make_bundle({yaml_name: source_yaml.encode()})
    Bundle.objects.get_or_create(digest=blob.digest, defaults={"data": blob.blob, "size": blob.size})
    task = Task(slug=slug)
    version = task.add_version(
        spec=spec, prompt=prompt, source_yaml=source_yaml, source_path=source_path, yaml_path=yaml_name,
        bundle_id=blob.digest, description=description, tags=tags, skip=True, warnings=warnings,
    )  # fmt: skip
    task.save()
    version.task = task
    version.save()
    return task


def task_files(task: Task) -> dict[str, bytes]:
    """The task's bundle (its YAML and every file it references) under `<task_id>/`."""
    files = read_bundle(bytes(task.bundle.data))
    return {f"{task.slug}/{name}": content for name, content in files.items()}


def export_tasks(tasks, dest: Path) -> list[Path]:
    """Write each task to `dest/<task_id>/`, laid out so that re-importing gives the same
    digests; returns the YAML paths written."""
    written = []
    for task in tasks.select_related("bundle"):
        write_bundle_files(task_files(task), dest)
        written.append(dest / task.slug / task.current_version().yaml_path)
    return written


def export_tasks_zip(tasks) -> bytes:
    """The same layout as export_tasks, as a zip archive (for the admin's download)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for task in tasks.select_related("bundle"):
            for name, content in sorted(task_files(task).items()):
                archive.writestr(name, content)
    return buffer.getvalue()


# --- experiments ----------------------------------------------------------------------------------


@dataclass
class ExperimentImportReport:
    experiment: Experiment
    created: bool
    warnings: list[str] = field(default_factory=list)


def import_experiment(
    path: Path,
    *,
    root: Path | None = None,
    lenient: bool = False,
    user=None,
    replace: bool = True,
    name: str | None = None,
) -> ExperimentImportReport:
    """Store one experiment YAML and its variants (replacing the variants it no longer lists).
    From the site (`user` given), a command agent or agent secrets need the right to define them;
    without `replace`, an experiment of the same ID is left as it is and the import refused.
    `name` (an exported zip's) is the name shown instead of the ID."""
    result = load_experiment(
        Path(path), root=root, max_bundle_bytes=settings.TASK_BUNDLE_MAX_BYTES, lenient=lenient
    )
    if result.errors or result.experiment is None:
        raise ImportFailed(result.errors)
    loaded = result.experiment
    spec = loaded.spec
    missing_sets = sorted(set(spec.task_sets) - set(TaskSet.objects.values_list("name", flat=True)))
    if missing_sets:
        raise ImportFailed(
            [f"{loaded.source_path}: task_sets: no task set named {name!r}" for name in missing_sets]
        )
    existing = Experiment.objects.filter(slug=spec.experiment_id).first()
    if existing is not None and not replace:
        raise ImportFailed(
            [f"{loaded.source_path}: experiment_id: an experiment {spec.experiment_id!r} exists already: "
             "import it as a replacement, or change its experiment_id"]
        )  # fmt: skip
    if user is not None:
        try:
            _check_agent_changes(spec, existing, user)
        except NotAllowed as refusal:
            raise ImportFailed([f"{loaded.source_path}: {refusal}"]) from None
    columns = {
        **_experiment_fields(spec),
        **({"name": name} if name is not None else {}),
        "source_yaml": loaded.source_yaml,
        "yaml_path": loaded.yaml_path_in_bundle,
        "bundle_id": loaded.bundle.digest,
    }
    with transaction.atomic():
        Bundle.objects.get_or_create(
            digest=loaded.bundle.digest, defaults={"data": loaded.bundle.blob, "size": loaded.bundle.size}
        )
        experiment, created = Experiment.objects.update_or_create(
            slug=spec.experiment_id, defaults=columns, create_defaults={**columns, "created_by": user}
        )
        experiment.task_sets.set(TaskSet.objects.filter(name__in=spec.task_sets))
        _store_variants(experiment, loaded)
    return ExperimentImportReport(experiment, created, [str(w) for w in result.warnings])


def _experiment_fields(spec: ExperimentSpec) -> dict[str, Any]:
    """The experiment's columns from a validated spec (YAML import and the form alike)."""
    defaults = spec.defaults.model_dump(mode="json", exclude_unset=True)
    return {
        "description": spec.description,
        "defaults": defaults,
        "include_tags": list(spec.tags),
        "exclude_tags": list(spec.exclude_tags),
        "repeats": defaults.get("repeats") or 1,
        "max_parallel": spec.max_parallel,
        "gates": [gate.model_dump(mode="json") for gate in spec.gates],
    }


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


def save_experiment(
    spec: ExperimentSpec,
    *,
    name: str,
    experiment: Experiment | None = None,
    user=None,
    attachments: dict[str, bytes] | None = None,
) -> Experiment:
    """Store a spec validated by the experiment form the way `import_experiment` stores a file:
    its bundle is what importing its YAML with its files gives (`_store_bundle`).
    `attachments` (file name -> content: an agent's script) join the experiment's files, beside
    its YAML, where the variants' paths point. Raises NotAllowed when `user` defines a command
    agent or agent secrets without the right, ImportFailed when its files cannot be bundled."""
    _check_agent_changes(spec, experiment, user)
    fields = {"name": name, **_experiment_fields(spec)}
    base = attachment_base(experiment)
    files = {
        **bundled_files(experiment),
        **{(f"{base}/{k}" if base else k): v for k, v in (attachments or {}).items()},
    }
    with transaction.atomic():
        if experiment is None:
            experiment = Experiment.objects.create(
                slug=spec.experiment_id, created_by=user, yaml_path="experiment.yaml", **fields
            )
        else:
            for key, value in fields.items():
                setattr(experiment, key, value)
            experiment.save(update_fields=[*fields, "updated_at"])
        experiment.task_sets.set(TaskSet.objects.filter(name__in=spec.task_sets))
        loaded = SimpleNamespace(spec=spec, variant_prompts={}, source_path="the experiment form")
        _store_variants(experiment, loaded)
        _store_bundle(experiment, files)
    return experiment


def bundled_files(experiment: Experiment | None) -> dict[str, bytes]:
    """The files of an experiment's bundle, by their path in it."""
    if experiment is None or not experiment.bundle_id:
        return {}
    return read_bundle(bytes(experiment.bundle.data))


def attachment_base(experiment: Experiment | None) -> str:
    """Where in the bundle attached files go: beside the experiment's YAML."""
    path = experiment.yaml_path if experiment is not None else ""
    return path.rsplit("/", 1)[0] if "/" in path else ""


def files_beside_yaml(experiment: Experiment | None) -> list[str]:
    """The names of the experiment's files that sit beside its YAML (where attachments go):
    what a variant's `script` usually names."""
    base = attachment_base(experiment)
    prefix = f"{base}/" if base else ""
    return sorted(
        name[len(prefix) :]
        for name in bundled_files(experiment)
        if name.startswith(prefix) and "/" not in name[len(prefix) :] and name != experiment.yaml_path
    )


def _store_bundle(experiment: Experiment, files: dict[str, bytes]) -> None:
    """Store the experiment's YAML as it now stands, and its bundle as importing that YAML with
    `files` beside it gives: the files its variants name, nothing else. So a download of it (YAML
    and files in one zip) imports back to the same digest."""
    experiment.source_yaml = experiment_yaml(experiment)
    experiment.yaml_path = experiment.yaml_path or "experiment.yaml"
    files = {**files, experiment.yaml_path: experiment.source_yaml.encode()}
    loaded = load_bundled(files, experiment.yaml_path)
    Bundle.objects.get_or_create(
        digest=loaded.bundle.digest, defaults={"data": loaded.bundle.blob, "size": loaded.bundle.size}
    )
    experiment.bundle_id = loaded.bundle.digest
    experiment.save(update_fields=["source_yaml", "yaml_path", "bundle"])


def load_bundled(files: dict[str, bytes], yaml_path: str):
    """Load an experiment from its files (path in the bundle -> content) as an import of a folder
    holding them would: the loaded experiment, or ImportFailed naming the files as given."""
    with tempfile.TemporaryDirectory(prefix="evalsite-experiment-") as tmp:
        root = Path(tmp)
        write_bundle_files(files, root)
        result = load_experiment(root / yaml_path, root=root, max_bundle_bytes=settings.TASK_BUNDLE_MAX_BYTES)
        if result.errors or result.experiment is None:
            raise ImportFailed([str(issue).replace(f"{root}/", "") for issue in result.errors])
        return result.experiment


def experiment_spec_data(experiment: Experiment) -> dict:
    """The experiment as YAML data that `import_experiment` turns back into the same experiment."""
    data: dict[str, Any] = {"experiment_id": experiment.slug}
    if experiment.description:
        data["description"] = experiment.description
    task_sets = [task_set.name for task_set in experiment.task_sets.order_by("name")]
    if task_sets:
        data["task_sets"] = task_sets
    data["tags"] = list(experiment.include_tags)
    if experiment.exclude_tags:
        data["exclude_tags"] = list(experiment.exclude_tags)
    data["max_parallel"] = experiment.max_parallel
    if experiment.baseline_id:
        data["baseline"] = experiment.baseline.slug
    if experiment.gates:
        data["gates"] = experiment.gates
    data["defaults"] = {**experiment.defaults, "repeats": experiment.repeats}
    data["variants"] = [_variant_spec_data(v) for v in experiment.variants.order_by("position", "pk")]
    return data


def _variant_spec_data(variant: Variant) -> dict:
    data: dict[str, Any] = {"variant_id": variant.slug}
    if variant.description:
        data["description"] = variant.description
    for key in ("agent", "run_limits", "prompt_mutations"):
        if getattr(variant, key):
            data[key] = getattr(variant, key)
    if variant.repeats is not None:
        data["repeats"] = variant.repeats
    data.update(variant.overrides)
    return data


def experiment_yaml(experiment: Experiment) -> str:
    # A comment: the YAML format has no name field (a newline would end the comment early).
    header = f"# {' '.join(experiment.name.split())}\n" if experiment.name else ""
    return header + yaml.safe_dump(
        experiment_spec_data(experiment), sort_keys=False, allow_unicode=True, default_flow_style=False
    )


def duplicate_experiment(experiment: Experiment, user=None) -> Experiment:
    """A copy under a free `<id>-copy[-N]` ID, with the same variants, task sets and files."""
    slug = f"{experiment.slug}-copy"
    taken = set(Experiment.objects.filter(slug__startswith=slug).values_list("slug", flat=True))
    number = 2
    while slug in taken:
        slug = f"{experiment.slug}-copy-{number}"
        number += 1
    variants = list(experiment.variants.order_by("position", "pk"))
    task_sets = list(experiment.task_sets.all())
    baseline_slug = experiment.baseline.slug if experiment.baseline_id else None
    with transaction.atomic():
        copy = Experiment.objects.get(pk=experiment.pk)
        copy.pk, copy.slug, copy.baseline, copy.created_by = None, slug, None, user
        copy.name = f"{experiment.name} (copy)" if experiment.name else ""
        copy.save()
        copy.task_sets.set(task_sets)
        for variant in variants:
            variant.pk, variant.experiment = None, copy
            variant.save()
            if variant.slug == baseline_slug:
                copy.baseline = variant
        copy.save(update_fields=["baseline"])
        _store_bundle(copy, bundled_files(experiment))
    return copy


def adhoc_experiment(agent_type: str | None, model: str | None) -> Experiment:
    """`evalrun`'s experiment for -T/-m without an experiment file: one per (type, model), with
    that single variant, so repeated ad-hoc runs of an agent land together and compare over time."""
    name = slugify("-".join(filter(None, [agent_type, model]))) or "default"
    agent = {key: value for key, value in (("type", agent_type), ("model", model)) if value}
    with transaction.atomic():
        experiment, _ = Experiment.objects.get_or_create(
            slug=f"evalrun-{name}", defaults={"description": f"Ad-hoc evalrun runs of agent {name}"}
        )
        variant, _ = Variant.objects.get_or_create(
            experiment=experiment, slug=name, defaults={"agent": agent}
        )
        if experiment.baseline_id != variant.pk:
            experiment.baseline = variant
            experiment.save(update_fields=["baseline"])
    return experiment


def recorded_experiment(slug: str, *, description: str, repeats: int, user=None) -> tuple[Experiment, bool]:
    """The experiment an imported run belongs to: `slug`'s, or a new one made for imports."""
    experiment = Experiment.objects.filter(slug=slug).first()
    if experiment is not None:
        return experiment, False
    experiment = Experiment.objects.create(
        slug=slug, description=description, repeats=repeats, created_by=user
    )
    return experiment, True


def add_recorded_variants(
    experiment: Experiment, agents: dict[str, dict], baseline: str | None
) -> dict[str, Variant]:
    """Add the variants (slug -> agent) an imported run used that the experiment lacks, after
    its others; `baseline` becomes the baseline when the experiment has none. Returns every
    variant by slug."""
    existing = {v.slug: v for v in experiment.variants.all()}
    position = max((v.position for v in existing.values()), default=-1) + 1
    for slug, agent in agents.items():
        if slug not in existing:
            existing[slug] = Variant.objects.create(
                experiment=experiment, slug=slug, position=position, agent=agent
            )
            position += 1
    if baseline is not None and experiment.baseline_id is None:
        experiment.baseline = existing[baseline]
        experiment.save(update_fields=["baseline"])
    return existing


# --- experiment bundles: the experiment and its files in one zip ---------------------------

# The zip's table of contents: which of its files is the experiment's YAML, its name, and the
# digest its bundle had when it was made (an import says if its files changed since).
MANIFEST = "evalsite-experiment.json"
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # every entry's: the same experiment gives the same bytes


def experiment_zip(experiment: Experiment) -> bytes:
    """The experiment's YAML as it stands and every file it names, laid out as in its bundle, with
    the manifest: importing the zip (site, API or `import_experiment`) gives the same experiment
    with the same bundle digest."""
    yaml_path = experiment.yaml_path or "experiment.yaml"
    text = experiment.source_yaml or experiment_yaml(experiment)
    loaded = load_bundled({**bundled_files(experiment), yaml_path: text.encode()}, yaml_path)
    manifest = {
        "format": 1,
        "experiment_id": experiment.slug,
        "name": experiment.name,
        "experiment": loaded.yaml_path_in_bundle,
        "digest": loaded.bundle.digest,
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in [
            *sorted(loaded.files.items()),
            (MANIFEST, json.dumps(manifest, indent=1).encode()),
        ]:
            info = zipfile.ZipInfo(name, ZIP_DATE)
            info.external_attr = (0o755 if content.startswith(b"#!") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, content)
    return buffer.getvalue()


def import_experiment_upload(upload, *, user=None, replace: bool = False) -> ExperimentImportReport:
    """Import an uploaded experiment: a zip made by `experiment_zip` (or any zip holding one
    experiment YAML and the files it names), or a lone YAML file. All or nothing: unpacked into
    a private folder with every entry checked (no path leaves it, no link, a size cap), loaded and
    checked as `import_experiment` checks a folder, stored in one transaction."""
    name = Path(upload.name or "upload").name
    if upload.size > settings.TASK_BUNDLE_MAX_BYTES:
        raise ImportFailed([f"{name}: the upload is larger than {settings.TASK_BUNDLE_MAX_BYTES} bytes"])
    with tempfile.TemporaryDirectory(prefix="evalsite-upload-") as tmp:
        root = Path(tmp)
        if name.endswith(".zip"):
            _unzip(upload, root, name, settings.TASK_BUNDLE_MAX_BYTES)
            manifest = _manifest(root, name)
            yaml_path = manifest.get("experiment") or _only_yaml(root, name)
        elif name.endswith((".yaml", ".yml")):
            (root / name).write_bytes(upload.read())
            manifest, yaml_path = {}, name
        else:
            raise ImportFailed(
                [f"{name}: expected an experiment's .zip (its YAML and files) or a .yaml file"]
            )
        try:
            report = import_experiment(
                root / yaml_path, root=root, user=user, replace=replace, name=manifest.get("name")
            )
        except ImportFailed as exc:
            raise ImportFailed([issue.replace(f"{root}/", "") for issue in exc.issues]) from None
    if manifest.get("digest") and manifest["digest"] != report.experiment.bundle_id:
        report.warnings.append(
            f"{name}: its files differ from those it was exported with (bundle "
            f"{report.experiment.bundle_id[:12]}, exported as {str(manifest['digest'])[:12]})"
        )
    return report


def _manifest(root: Path, name: str) -> dict:
    path = root / MANIFEST
    if not path.is_file():
        return {}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ImportFailed([f"{name}: {MANIFEST}: not valid JSON ({exc})"]) from None
    yaml_path = manifest.get("experiment") if isinstance(manifest, dict) else None
    if not isinstance(yaml_path, str) or not _is_member(root, yaml_path):
        raise ImportFailed(
            [f"{name}: {MANIFEST}: experiment: name the experiment's YAML file inside the zip"]
        )
    if not isinstance(manifest.get("name", ""), str):
        raise ImportFailed([f"{name}: {MANIFEST}: name: expected text"])
    return manifest


def _is_member(root: Path, relative: str) -> bool:
    try:
        check_member_name(relative)
    except UnsafeBundle:
        return False
    return (root / relative).is_file()


def _only_yaml(root: Path, name: str) -> str:
    """The zip's one experiment YAML (a file with an experiment_id at its top)."""
    found = [
        path.relative_to(root).as_posix()
        for path in sorted(root.rglob("*"))
        if path.suffix in (".yaml", ".yml") and path.is_file() and _names_an_experiment(path)
    ]
    if len(found) != 1:
        what = (
            "no experiment YAML" if not found else f"{len(found)} experiment YAMLs ({', '.join(found[:5])})"
        )
        raise ImportFailed([f"{name}: {what}: a zip holds one experiment (and the files it names)"])
    return found[0]


def _names_an_experiment(path: Path) -> bool:
    with path.open("rb") as handle:
        head = handle.read(64 * 1024)
    return b"experiment_id" in head


# --- uploads (the admin and the task-set page) ------------------------------------------------


MAX_ZIP_MEMBERS = 10_000


def import_upload(upload, task_set: str | None):
    """Unpack an uploaded YAML or zip into a private folder and import it as one root. A zip may
    hold task YAMLs and Harbor task folders; one whose top holds task.toml is one Harbor task,
    named (as its folder would be) by the zip's name."""
    max_bytes = settings.TASK_BUNDLE_MAX_BYTES * 10
    if upload.size > max_bytes:
        raise ImportFailed([f"{upload.name}: the upload is larger than {max_bytes} bytes"])
    with tempfile.TemporaryDirectory(prefix="evalsite-upload-") as tmp:
        root = Path(tmp, "upload")
        root.mkdir()
        name = Path(upload.name).name
        if name.endswith(".zip"):
            _unzip(upload, root, name, max_bytes)
            if (root / "task.toml").is_file():
                Path(tmp, "harbor").mkdir()
                root = root.rename(Path(tmp, "harbor", name.removesuffix(".zip"))).parent
        elif name.endswith((".yaml", ".yml")):
            (root / name).write_bytes(upload.read())
        else:
            raise ImportFailed(
                [f"{name}: expected a .yaml/.yml task file, or a .zip of task folders (YAML or Harbor)"]
            )
        try:
            return import_tasks([root], root=root, task_set=task_set)
        except ImportFailed as exc:
            # Show paths as the uploader knows them, not our temporary folder.
            raise ImportFailed([issue.replace(f"{root}/", "") for issue in exc.issues]) from None


def _unzip(upload, root: Path, name: str, max_bytes: int) -> None:
    """Unpack member by member, counting the bytes actually inflated: a zip's declared sizes
    may lie (a zip bomb, or a forged header), so they bound nothing."""
    try:
        with zipfile.ZipFile(upload) as archive:
            members = archive.infolist()
            if len(members) > MAX_ZIP_MEMBERS:
                raise ImportFailed([f"{name}: more than {MAX_ZIP_MEMBERS} files"])
            written = 0
            for info in members:
                target = (root / info.filename).resolve()
                if not target.is_relative_to(root.resolve()) or info.filename.startswith("/"):
                    raise ImportFailed([f"{name}: {info.filename}: path leaves the archive's folder"])
                if (info.external_attr >> 16) & 0o170000 == 0o120000:
                    raise ImportFailed([f"{name}: {info.filename}: symbolic links are not accepted"])
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(info) as source, target.open("wb") as sink:
                    while chunk := source.read(1 << 16):
                        written += len(chunk)
                        if written > max_bytes:
                            raise ImportFailed([f"{name}: unpacks to more than {max_bytes} bytes"])
                        sink.write(chunk)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, ValueError) as exc:
        # A forged or damaged archive (bad CRC, sizes that do not match, unknown compression,
        # encryption) is the uploader's problem, reported as such, never a server error.
        raise ImportFailed([f"{name}: not a valid zip archive ({exc})"]) from None
