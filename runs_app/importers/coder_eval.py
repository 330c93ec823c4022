"""Import a coder-eval run directory as a read-only historical Run, so old results sit beside
new ones on the comparison page.

The layout and field names follow coder-eval's report schema (docs/REPORT_SCHEMA.md and
`coder_eval/models/results.py`: RunSummary, EvaluationResult, CriterionResult, TokenUsage):

    DIR/run.json                                  RunSummary (run_id, start/end time, ...)
    DIR/experiment.json                           ExperimentResult (experiment_id, variant_ids), optional
    DIR/<variant>/variant.json                    VariantAggregate, optional (not needed)
    DIR/<variant>/<task_id>/<NN>/task.json        EvaluationResult, one per replicate NN

Steps: 1. read and check every file (all problems reported at once, each naming its file);
2. in one transaction: find or create the experiment, its variants and each task's version,
then write the run, its trials, criterion results and a short transcript per trial.
"""

import hashlib
import json
import math
import posixpath
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify
from pydantic import ValidationError

import evalsite
from experiments_app.definitions import add_recorded_variants, recorded_experiment, store_recorded_task
from experiments_app.models import Experiment, Task, TaskVersion, Variant
from experiments_app.specs import TaskSpec
from experiments_app.specs.task import TASK_ID_RE
from experiments_app.specs.yaml_errors import load_yaml
from runs_app.analysis import atif, rollup
from runs_app.engine.suites import evaluate_suites
from runs_app.launching import trial_fingerprint
from runs_app.models import CriterionResult, Run, Trial, TrialEvent

# coder-eval FinalStatus -> (evalsite status, what stopped the agent). coder-eval counts
# BUILD_FAILED as an error and leaves NOT_GRADED out of its pass rate: both are `error` here,
# which evalsite never counts as a fail either.
STATUSES: dict[str, tuple[str, str]] = {
    "SUCCESS": (Trial.Status.PASSED, ""),
    "FAILURE": (Trial.Status.FAILED, ""),
    "TIMEOUT": (Trial.Status.FAILED, "timeout"),
    "MAX_TURNS_EXHAUSTED": (Trial.Status.FAILED, "turns"),
    "TOKEN_BUDGET_EXCEEDED": (Trial.Status.FAILED, "tokens"),
    "COST_BUDGET_EXCEEDED": (Trial.Status.FAILED, "usd"),
    "ERROR": (Trial.Status.ERROR, ""),
    "BUILD_FAILED": (Trial.Status.ERROR, ""),
    "NOT_GRADED": (Trial.Status.ERROR, ""),
}
MAX_EVENTS_PER_TRIAL = 2000
MAX_TEXT = 1_000_000  # characters kept of agent output / logs per trial
# Keys of a CriterionResult that have their own column; the rest go to `details`.
CRITERION_COLUMNS = {"criterion_type", "description", "score", "details", "error", "pass_threshold", "gating"}


class CoderEvalImportError(ValueError):
    """Nothing was imported; `problems` names each file and what is wrong with it."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass
class RecordedTrial:
    path: Path  # its task.json
    variant: str
    task_id: str  # task slug
    row_id: str  # dataset row ("suite_id/row_id" task ids), else ""
    replicate: int
    data: dict[str, Any]
    # The sibling trajectory.json (`coder-eval run --format harbor`, evalsite's export), when present.
    trajectory: atif.Trajectory | None = None


@dataclass
class RecordedRun:
    directory: Path
    run: dict[str, Any]
    experiment: dict[str, Any]
    trials: list[RecordedTrial] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return str(self.run["run_id"])

    def variant_slugs(self) -> list[str]:
        """In experiment.json's order, then any other variant met in the trials."""
        listed = [str(v) for v in self.experiment.get("variant_ids") or []]
        seen = [t.variant for t in self.trials]
        return [v for v in listed if v in seen] + sorted(set(seen) - set(listed))


# --------------------------------------------------------------------------- reading


def read_run_directory(directory: Path) -> RecordedRun:
    """Read and check a coder-eval run directory; raise CoderEvalImportError listing every problem."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CoderEvalImportError([f"{directory}: not a directory"])
    problems: list[str] = []
    run = _read_json(directory / "run.json", problems, required=True)
    if run is not None:
        problems += _run_problems(directory / "run.json", run)
    experiment = _read_json(directory / "experiment.json", problems) or {}
    trials = []
    for path in sorted(directory.glob("*/**/task.json")):
        trial = _read_trial(directory, path, problems)
        if trial is not None:
            trials.append(trial)
    if not trials and not problems:
        problems.append(f"{directory}: no trial results found (expected <variant>/<task_id>/<NN>/task.json)")
    if problems:
        raise CoderEvalImportError(problems)
    return RecordedRun(directory=directory, run=run, experiment=experiment, trials=trials)


def _read_json(path: Path, problems: list[str], required: bool = False) -> dict | None:
    if not path.is_file():
        if required:
            problems.append(f"{path}: missing; a coder-eval run directory has a run.json (RunSummary)")
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        problems.append(f"{path}:{exc.lineno}:{exc.colno}: malformed JSON: {exc.msg}")
        return None
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"{path}: cannot be read: {exc}")
        return None
    except RecursionError:
        problems.append(f"{path}: the JSON is nested too deeply to be a coder-eval record")
        return None
    if not isinstance(data, dict):
        problems.append(f"{path}: expected a JSON object, got {type(data).__name__}")
        return None
    return data


def _run_problems(path: Path, run: dict) -> list[str]:
    problems = []
    if not isinstance(run.get("run_id"), str) or not run["run_id"].strip():
        problems.append(f"{path}: run_id: missing or not a string")
    for name in ("start_time", "end_time"):
        if run.get(name) is not None and _datetime(run[name]) is None:
            problems.append(f"{path}: {name}: not an ISO-8601 time: {run[name]!r}")
    return problems


def _read_trial(directory: Path, path: Path, problems: list[str]) -> RecordedTrial | None:
    data = _read_json(path, problems)
    if data is None:
        return None
    parts = path.relative_to(directory).parts  # variant, task folder(s)..., NN, task.json
    here = len(problems)
    task_id = data.get("task_id")
    if not isinstance(task_id, str) or not task_id:
        problems.append(f"{path}: task_id: missing or not a string")
    if data.get("final_status") not in STATUSES:
        problems.append(
            f"{path}: final_status: {data.get('final_status')!r} is not a coder-eval FinalStatus "
            f"({', '.join(STATUSES)})"
        )
    if not isinstance(data.get("success_criteria_results", []), list):
        problems.append(f"{path}: success_criteria_results: expected a list")
    for name in ("started_at", "completed_at"):
        if data.get(name) is not None and _datetime(data[name]) is None:
            problems.append(f"{path}: {name}: not an ISO-8601 time: {data[name]!r}")
    if len(problems) > here:
        return None
    slug, _, row_id = task_id.partition("/")  # dataset rows: "suite_id/row_id"
    if not TASK_ID_RE.match(slug) or len(slug) > 200:
        problems.append(f"{path}: task_id: {task_id!r} cannot be an evalsite task slug")
        return None
    variant = str(data.get("variant_id") or parts[0])
    if slugify(variant) != variant.lower() or len(variant) > 200:
        problems.append(f"{path}: variant_id: {variant!r} cannot be an evalsite variant slug")
        return None
    replicate = int(parts[-2]) if parts[-2].isdigit() else int(data.get("replicate_index") or 0)
    trajectory = None
    sibling = path.with_name("trajectory.json")
    if sibling.is_file():
        try:
            trajectory = atif.read_trajectory(sibling.read_bytes(), str(sibling))
        except atif.AtifError as exc:
            problems.extend(exc.problems)
            return None
    return RecordedTrial(path, variant, slug, row_id, replicate, data, trajectory)


def _datetime(value: Any) -> datetime | None:
    """An aware datetime from coder-eval's ISO text (naive times are the server's local time)."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return timezone.make_aware(parsed) if timezone.is_naive(parsed) else parsed


# --------------------------------------------------------------------------- storing


@dataclass
class ImportReport:
    run: Run
    created_experiment: bool
    created_tasks: list[str]
    warnings: list[str]


def import_coder_eval_run(directory: Path, *, user=None, experiment_slug: str | None = None) -> ImportReport:
    """Import the run in `directory` (all or nothing); see the module docstring."""
    recorded = read_run_directory(directory)
    slug = experiment_slug or _experiment_slug(recorded)
    with transaction.atomic():
        experiment, created = _experiment_for(recorded, slug, user)
        _refuse_duplicate(recorded, experiment)
        variants = _variants_for(recorded, experiment, created)
        versions, created_tasks, warnings = _task_versions_for(recorded)
        run = _create_run(recorded, experiment, variants, versions, user)
        _create_trials(recorded, run, variants, versions)
        rollup.recount(run)
        # A dataset run's suite thresholds (in the recorded criteria) judged over its rows.
        run.suite_results = evaluate_suites(run)
        run.save(update_fields=["suite_results"])
    return ImportReport(run, created, created_tasks, warnings)


def _experiment_slug(recorded: RecordedRun) -> str:
    experiment_id = recorded.experiment.get("experiment_id")
    if isinstance(experiment_id, str) and slugify(experiment_id) == experiment_id.lower() and experiment_id:
        return experiment_id[:200]
    return ("coder-eval-" + slugify(recorded.run_id))[:200]


def _experiment_for(recorded: RecordedRun, slug: str, user) -> tuple[Experiment, bool]:
    description = recorded.experiment.get("description") or f"Imported from coder-eval run {recorded.run_id}"
    repeats = max(t.replicate for t in recorded.trials) + 1
    return recorded_experiment(slug, description=str(description), repeats=repeats, user=user)


def _refuse_duplicate(recorded: RecordedRun, experiment: Experiment) -> None:
    key = [recorded.run_id, recorded.run.get("start_time")]
    for run in experiment.runs.filter(historical=True).only("pk", "config"):
        source = run.config.get("coder_eval") or {}
        if [source.get("run_id"), source.get("start_time")] == key:
            problem = f"coder-eval run {recorded.run_id} was imported already, as run {run.pk}"
            raise CoderEvalImportError([f"{recorded.directory}: {problem}"])


def _variants_for(recorded: RecordedRun, experiment: Experiment, created: bool) -> dict[str, Variant]:
    """The experiment's variants by slug; missing ones are added only to an experiment that
    imports made (adding an arm to a real experiment would change its next launches)."""
    existing = set(experiment.variants.values_list("slug", flat=True))
    wanted = recorded.variant_slugs()
    missing = [slug for slug in wanted if slug not in existing]
    imported_only = created or (
        not experiment.source_yaml and not experiment.runs.filter(historical=False).exists()
    )
    if missing and not imported_only:
        raise CoderEvalImportError(
            [
                f"{recorded.directory}: experiment {experiment.slug!r} has no variant(s) "
                f"{', '.join(map(repr, missing))} that this run used; add them to the experiment, "
                "or import into another experiment with --experiment SLUG"
            ]
        )
    agents = {slug: _agent_of(next(t for t in recorded.trials if t.variant == slug).data) for slug in missing}
    return add_recorded_variants(experiment, agents, baseline=wanted[0] if imported_only else None)


def _agent_of(data: dict) -> dict:
    config = data.get("agent_config") if isinstance(data.get("agent_config"), dict) else {}
    agent = {
        "type": config.get("type") or data.get("agent_type"),
        "model": config.get("model") or data.get("model_used"),
    }
    return {key: value for key, value in agent.items() if value}


def _task_versions_for(recorded: RecordedRun) -> tuple[dict[str, TaskVersion], list[str], list[str]]:
    """Each task's current version in evalsite; tasks evalsite lacks are created from the
    definition coder-eval recorded (task_config.source_yaml)."""
    slugs = sorted({t.task_id for t in recorded.trials})
    existing = {task.slug: task for task in Task.objects.filter(slug__in=slugs)}
    versions, created, warnings = {}, [], []
    for slug in slugs:
        task = existing.get(slug)
        if task is None:
            first = next(t for t in recorded.trials if t.task_id == slug)
            task, warning = _create_task(slug, first, recorded.run_id)
            created.append(slug)
            warnings.append(warning)
        versions[slug] = task.current_version()
    return versions, created, warnings


def _create_task(slug: str, trial: RecordedTrial, run_id: str) -> tuple[Task, str]:
    record = trial.data.get("task_config") if isinstance(trial.data.get("task_config"), dict) else {}
    source_yaml = record.get("source_yaml") if isinstance(record.get("source_yaml"), str) else ""
    description = str(trial.data.get("task_description") or "")
    if not source_yaml:
        # task_config is optional in EvaluationResult: keep what the result itself says.
        source_yaml = yaml.safe_dump({"task_id": slug, "description": description}, sort_keys=False)
    spec, problem = _spec_of(source_yaml)
    yaml_name = posixpath.basename(str(record.get("source_file") or ""))
    if not re.fullmatch(r"[\w.-]+\.ya?ml", yaml_name):
        yaml_name = f"{slug}.yaml"
    warning = (
        f"task {slug}: created from the definition coder-eval run {run_id} recorded; marked skip, as "
        "its template files were not recorded: import its YAML to run it"
    )
    resolved = record.get("resolved") if isinstance(record.get("resolved"), dict) else {}
    prompt = spec.get("initial_prompt") or resolved.get("initial_prompt") or ""
    task = store_recorded_task(
        slug,
        spec=spec,
        source_yaml=source_yaml,
        yaml_name=yaml_name,
        prompt=str(prompt),
        description=str(spec.get("description") or description),
        tags=[str(tag) for tag in spec.get("tags") or [] if isinstance(tag, str | int)],
        source_path=str(record.get("source_file") or ""),
        warnings=[warning] + ([problem] if problem else []),
    )
    return task, warning


def _spec_of(source_yaml: str) -> tuple[dict, str]:
    """The validated spec, or the raw mapping and why it does not validate in evalsite."""
    try:
        data = load_yaml(source_yaml)
    except yaml.YAMLError as exc:
        return {}, f"recorded task YAML does not parse: {exc}"
    if not isinstance(data, dict):
        return {}, "recorded task YAML is not a mapping"
    try:
        return TaskSpec.model_validate(data).model_dump(mode="json", exclude_unset=True), ""
    except (ValidationError, ValueError) as exc:
        return json.loads(json.dumps(data, default=str)), f"recorded task is not a valid evalsite task: {exc}"


def _create_run(recorded: RecordedRun, experiment, variants, versions, user) -> Run:
    started = _datetime(recorded.run.get("start_time"))
    finished = _datetime(recorded.run.get("end_time"))
    slugs = recorded.variant_slugs()
    baseline = experiment.baseline.slug if experiment.baseline else ""
    baseline = baseline if baseline in slugs else slugs[0]
    run = Run.objects.create(
        experiment=experiment,
        status=Run.Status.FINISHED,
        historical=True,
        config=_frozen_config(recorded, experiment, [variants[s] for s in slugs], versions, baseline),
        max_parallel=max(1, int(recorded.run.get("max_parallel") or 1)),
        started_by=user,
        started_at=started,
        finished_at=finished,
    )
    if started:
        # Listed among the runs at the time it ran, not the time it was imported.
        Run.objects.filter(pk=run.pk).update(created_at=started)
    return run


def _frozen_config(
    recorded: RecordedRun, experiment, variants: list[Variant], versions, baseline: str
) -> dict:
    run = recorded.run
    return {
        "experiment": {"slug": experiment.slug, "defaults": {}, "repeats": experiment.repeats},
        "baseline": baseline,
        "variants": [
            {"slug": v.slug, "layer": v.layer(), "repeats": v.effective_repeats()} for v in variants
        ],
        "tasks": {slug: {"version": v.number, "digest": v.bundle_id} for slug, v in versions.items()},
        "overrides": [],
        "options": {},
        "seed": None,
        "evalsite": evalsite.__version__,
        "launched_at": run.get("start_time"),
        "coder_eval": {
            "run_id": recorded.run_id,
            "directory": recorded.directory.name,
            "experiment_id": recorded.experiment.get("experiment_id"),
            "start_time": run.get("start_time"),
            "end_time": run.get("end_time"),
            "framework_version": run.get("framework_version"),
            "environment_info": run.get("environment_info") or {},
            "skipped_tasks": run.get("skipped_tasks") or [],
        },
    }


def _create_trials(recorded: RecordedRun, run: Run, variants, versions) -> None:
    trials = [_trial(recorded, t, run, variants[t.variant], versions[t.task_id]) for t in recorded.trials]
    Trial.objects.bulk_create(trials, batch_size=500)
    results, events = [], []
    for trial, record in zip(trials, recorded.trials, strict=True):
        results += _criterion_results(trial, record.data)
        events += _events(trial, record, recorded.directory)
    CriterionResult.objects.bulk_create(results, batch_size=500)
    TrialEvent.objects.bulk_create(events, batch_size=1000)
    digest = hashlib.sha256()
    for fingerprint in sorted({t.config_fingerprint for t in trials}):
        digest.update(fingerprint.encode())
    run.fingerprint = digest.hexdigest()
    run.save(update_fields=["fingerprint"])


def _trial(recorded: RecordedRun, record: RecordedTrial, run: Run, variant: Variant, version) -> Trial:
    data = record.data
    status, stopped_by = STATUSES[data["final_status"]]
    task_config = data.get("task_config") if isinstance(data.get("task_config"), dict) else {}
    config = task_config.get("resolved") if isinstance(task_config.get("resolved"), dict) else {}
    iterations = _iterations(data)
    first_input = iterations[0].get("user_input") if iterations else ""
    agent_seconds = sum(_number(i.get("duration_seconds"), 0.0) for i in iterations) if iterations else None
    turns = data.get("total_assistant_turns", sum(_count(i.get("assistant_turn_count")) for i in iterations))
    usage = data.get("total_token_usage") if isinstance(data.get("total_token_usage"), dict) else {}
    return Trial(
        run=run,
        task_version=version,
        variant=variant,
        replicate=record.replicate,
        dataset_row_id=record.row_id,
        status=status,
        config=config,
        lineage=_lineage(task_config.get("lineage")),
        prompt=str(config.get("initial_prompt") or first_input or ""),
        config_fingerprint=trial_fingerprint(version.bundle_id, config),
        score=_number(data.get("weighted_score"), None),
        started_at=_datetime(data.get("started_at")),
        finished_at=_datetime(data.get("completed_at")),
        setup_seconds=_seconds(data.get("setup_ms")),
        grading_seconds=_seconds(data.get("grading_ms")),
        agent_seconds=agent_seconds,
        duration_seconds=_number(data.get("duration_seconds"), None),
        # TokenUsage: uncached_input_tokens is the input bucket (legacy files: input_tokens).
        input_tokens=_count(usage.get("uncached_input_tokens", usage.get("input_tokens"))),
        output_tokens=_count(usage.get("output_tokens")),
        cache_read_tokens=_count(usage.get("cache_read_input_tokens")),
        cache_creation_tokens=_count(usage.get("cache_creation_input_tokens")),
        cost_usd=_number(usage.get("total_cost_usd"), 0.0),
        turns=_count(turns),
        error_category=data["final_status"].lower() if status == Trial.Status.ERROR else "",
        error_message=str(data.get("error_message") or "")[:MAX_TEXT],
        timed_out=stopped_by == "timeout",
        budget_exceeded=stopped_by if stopped_by in ("tokens", "usd", "turns") else "",
        agent_stdout="\n".join(str(i.get("agent_output") or "") for i in iterations)[:MAX_TEXT],
        agent_stderr=str(data.get("error_log_tail") or "")[:MAX_TEXT],
        trajectory={"atif": atif.dump(record.trajectory)} if record.trajectory is not None else None,
    )


def _iterations(data: dict) -> list[dict]:
    # EvaluationResult.iterations also reads the legacy key `turns`.
    items = data.get("iterations", data.get("turns")) or []
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def _lineage(lineage: Any) -> dict[str, str]:
    if not isinstance(lineage, dict):
        return {}
    return {
        str(path): str(entry.get("source", "")) for path, entry in lineage.items() if isinstance(entry, dict)
    }


def _criterion_results(trial: Trial, data: dict) -> list[CriterionResult]:
    criteria = (((data.get("task_config") or {}).get("resolved") or {}).get("success_criteria")) or []
    results = []
    for index, item in enumerate(data.get("success_criteria_results") or []):
        if not isinstance(item, dict):
            continue
        score = min(1.0, max(0.0, _number(item.get("score"), 0.0)))
        threshold = _number(item.get("pass_threshold"), 0.9)
        gating = item.get("gating") is not False
        evaluated = item.get("evaluation_status", "evaluated") == "evaluated"
        criterion = criteria[index] if index < len(criteria) and isinstance(criteria[index], dict) else {}
        details = {key: value for key, value in item.items() if key not in CRITERION_COLUMNS}
        if item.get("details") is not None:
            details["text"] = item["details"]
        results.append(
            CriterionResult(
                trial=trial,
                index=index,
                type=str(item.get("criterion_type") or "unknown")[:50],
                description=str(item.get("description") or ""),
                score=score,
                passed=evaluated and score >= threshold,
                weight=_number(criterion.get("weight"), 1.0 if gating else 0.0),
                pass_threshold=threshold,
                gating=gating,
                details=details,
                error=str(item.get("error") or ""),
            )
        )
    return results


def _events(trial: Trial, record: RecordedTrial, directory: Path) -> list[TrialEvent]:
    """A short transcript: where the result came from, each tool call, each turn's output."""
    at = trial.started_at or trial.finished_at or timezone.now()
    source = record.path.relative_to(directory).as_posix()
    items = [("system", at, {"text": f"imported from coder-eval run {directory.name}: {source}"})]
    if record.trajectory is not None:  # the full transcript: its steps rather than the commands
        items[0][2]["text"] += " and its trajectory.json"
        items += [(kind, at, data) for kind, data in atif.step_events_of(record.trajectory)]
        return _numbered(trial, items)
    for iteration in _iterations(record.data):
        when = _datetime(iteration.get("timestamp")) or at
        for command in iteration.get("commands") or []:
            if isinstance(command, dict):
                items += _tool_events(command, _datetime(command.get("timestamp")) or when)
        if iteration.get("agent_output"):
            items.append(("output", when, {"text": str(iteration["agent_output"])[:MAX_TEXT]}))
    return _numbered(trial, items)


def _numbered(trial: Trial, items: list[tuple[str, datetime, dict]]) -> list[TrialEvent]:
    return [
        TrialEvent(trial=trial, seq=seq, at=when, kind=kind, data=data)
        for seq, (kind, when, data) in enumerate(items[:MAX_EVENTS_PER_TRIAL], start=1)
    ]


def _tool_events(command: dict, at: datetime) -> list[tuple[str, datetime, dict]]:
    """A CommandTelemetry record as a tool call and its result."""
    call_id = str(command.get("tool_id") or "")
    call = {
        "id": call_id,
        "name": str(command.get("tool_name") or ""),
        "input": command.get("parameters") or {},
    }
    result = {"id": call_id, "status": command.get("result_status"), "output": command.get("result_summary")}
    return [("tool_call", at, call), ("tool_result", at, result)]


def _number(value: Any, default: Any) -> Any:
    """A finite float, or `default` for anything else (None, text, NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return default
    return float(value)


def _count(value: Any) -> int:
    number = _number(value, 0.0)
    return int(min(max(number, 0), 2**62))  # database integers are 64-bit


def _seconds(milliseconds: Any) -> float | None:
    value = _number(milliseconds, None)
    return None if value is None else value / 1000
