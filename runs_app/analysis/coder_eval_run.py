"""A run as a coder-eval run directory (`manage.py export_coder_eval_run RUN DIR`), the shape
coder-eval's `report` (Markdown, `--format junit|html`, `--rebuild`) reads and evalsite's own
`import_coder_eval_run` reads back:

    DIR/run.json                                  RunSummary
    DIR/<variant>/<task_id>/<NN>/task.json        EvaluationResult, one per replicate NN
    DIR/<variant>/<task_id>/<NN>/trajectory.json  its transcript as ATIF (as `--format harbor`)
    DIR/<variant>/<suite_id>/suite.json           SuiteRollup, one per dataset task and variant

Field names and meanings follow coder-eval 0.12.16 (`models/results.py`, `docs/REPORT_SCHEMA.md`).
No experiment.json: coder-eval's ExperimentResult ranks variants per task by its own rules, which
evalsite does not reproduce; without it `report` renders the run from run.json. Only current
attempts are written; a cancelled trial never ran to an outcome and is left out, as
coder-eval leaves out what it did not run.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import evalsite
from runs_app.analysis.atif import trial_trajectory
from runs_app.engine.criteria.early_stop import armed, gate_threshold
from runs_app.models import Run, Trial, TrialEvent

# evalsite status (and what stopped the agent) -> coder-eval FinalStatus; the inverse of the
# importer's table.
LIMIT_STATUSES = {
    "timeout": "TIMEOUT",
    "max_turns": "MAX_TURNS_EXHAUSTED",
    "max_usd": "COST_BUDGET_EXCEEDED",
    "max_input_tokens": "TOKEN_BUDGET_EXCEEDED",
    "max_output_tokens": "TOKEN_BUDGET_EXCEEDED",
    "max_total_tokens": "TOKEN_BUDGET_EXCEEDED",
}


def final_status(trial: Trial) -> str:
    if trial.status == Trial.Status.PASSED:
        return "SUCCESS"
    if trial.status == Trial.Status.ERROR:
        return "ERROR"
    if trial.timed_out:
        return "TIMEOUT"
    return LIMIT_STATUSES.get(trial.budget_exceeded, "FAILURE")


def export_run(run: Run, directory: Path) -> int:
    """Write `run` under `directory` (created; must be empty). Returns how many trials it wrote."""
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()):
        raise FileExistsError(f"{directory} is not empty: export writes a new run directory")
    trials = (
        Trial.objects.for_run(run)
        .current()
        .exclude(status__in=[Trial.Status.CANCELLED, Trial.Status.QUEUED, Trial.Status.RUNNING])
        .select_related("task_version__task", "variant")
        .prefetch_related("criterion_results")
        .order_by("variant__position", "task_version__task__slug", "dataset_row_id", "replicate")
    )
    results, documents = [], []
    for trial in trials.iterator(chunk_size=500):
        folder = directory / trial.variant.slug / trial.task_version.task.slug
        if trial.dataset_row_id:
            folder = folder / trial.dataset_row_id
        folder = folder / f"{trial.replicate:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        document = evaluation_result(trial)
        _write(folder / "task.json", document)
        # coder-eval's `--format harbor` sibling: the trial's transcript as ATIF.
        _write(folder / "trajectory.json", trial_trajectory(trial))
        results.append(_task_result(trial, document, folder.relative_to(directory)))
        documents.append(document)
    _write(directory / "run.json", run_summary(run, results))
    for rollup in suite_rollups(run, results, documents):
        _write(directory / rollup["variant_id"] / rollup["suite_id"] / "suite.json", rollup)
    return len(results)


def evaluation_result(trial: Trial) -> dict[str, Any]:
    """One trial as coder-eval's EvaluationResult."""
    task = trial.task_version.task
    config = trial.config or {}
    agent = config.get("agent") or {}
    trajectory = trial.trajectory or {}
    task_id = f"{task.slug}/{trial.dataset_row_id}" if trial.dataset_row_id else task.slug
    started = trial.started_at or trial.queued_at
    usage = _token_usage(trial)
    commands = [
        _command(call, index, started) for index, call in enumerate(trajectory.get("tool_calls") or [])
    ]
    return {
        "task_id": task_id,
        "task_description": str(config.get("description") or ""),
        "variant_id": trial.variant.slug,
        "replicate_index": trial.replicate,
        "agent_type": str(agent.get("type") or "claude-code"),
        "model_used": agent.get("model"),
        "started_at": _time(started),
        "completed_at": _time(trial.finished_at),
        "duration_seconds": trial.duration_seconds or 0.0,
        "setup_ms": _ms(trial.setup_seconds),
        "grading_ms": _ms(trial.grading_seconds),
        "final_status": final_status(trial),
        "max_turns_exhausted": trial.budget_exceeded == "max_turns",
        "weighted_score": trial.score,
        "iteration_count": 1,
        "success_criteria_results": [_criterion(c) for c in trial.criterion_results.all()],
        "post_failure_criteria_results": [],
        "iterations": [
            {
                "iteration": 1,
                "user_input": trial.prompt,
                "agent_output": str(trajectory.get("final_text") or ""),
                "commands": commands,
                "duration_seconds": trial.agent_seconds or 0.0,
                "token_usage": usage,
                "model_used": agent.get("model"),
                "assistant_turn_count": trial.turns,
                "num_turns": trial.turns,
                "max_turns_exhausted": trial.budget_exceeded == "max_turns",
                "crashed": False,
            }
        ],
        "error_message": trial.error_message or None,
        "error_details": {"category": trial.error_category} if trial.error_category else None,
        "error_log_tail": trial.agent_stderr[-4000:] or None,
        "environment_info": {"evalsite": evalsite.__version__},
        "agent_config": None,
        "sdk_options": None,
        "task_config": {
            "resolved": config,
            "source_yaml": trial.task_version.source_yaml,
            "source_file": trial.task_version.yaml_path,
            "lineage": _lineage(config, trial.lineage or {}),
        },
        "total_token_usage": usage,
        "total_assistant_turns": trial.turns,
        "actual_commands": len(commands),
        **_commands_efficiency(trial),
        "pre_run_results": [],
        "post_run_results": [],
        "simulation": _simulation(trial, config),
        "early_stop": _early_stop(trial),
    }


def _commands_efficiency(trial: Trial) -> dict[str, Any]:
    """coder-eval's expected_commands figures, when the task set a budget."""
    figures = (trial.trajectory or {}).get("commands")
    if not figures:
        return {}
    return {"expected_commands": figures["expected"], "commands_efficiency": figures["efficiency"]}


def _simulation(trial: Trial, config: dict) -> dict[str, Any] | None:
    """coder-eval's SimulationTelemetry of a simulated conversation (None for other trials)."""
    simulation = config.get("simulation") or {}
    if not simulation.get("enabled"):
        return None
    ending = (trial.trajectory or {}).get("conversation") or {}
    answerer = (trial.role_usage or {}).get("answerer") or {}
    return {
        "n_trials": 1,
        "replicate_index": trial.replicate,
        "stop_reason": ending.get("reason"),
        "simulator_input_tokens": answerer.get("input_tokens", 0),
        "simulator_output_tokens": answerer.get("output_tokens", 0),
        "simulator_failures": 1 if ending.get("reason") == "error" else 0,
        "total_turns": ending.get("turns", 0),
        "simulator_model": simulation.get("model"),
    }


def run_summary(run: Run, results: list[dict]) -> dict[str, Any]:
    """coder-eval's RunSummary over the task results."""
    statuses = [r["status"] for r in results]
    graded = [s for s in statuses if s not in ("ERROR", "NOT_GRADED")]
    start = run.started_at or run.created_at
    end = run.finished_at or start
    cost = sum(r["total_cost_usd"] or 0.0 for r in results)
    return {
        "run_id": f"evalsite-run-{run.pk}",
        "start_time": _time(start),
        "end_time": _time(end),
        "total_duration_seconds": (end - start).total_seconds(),
        "tasks_run": len(results),
        "tasks_succeeded": statuses.count("SUCCESS"),
        "tasks_failed": len(graded) - statuses.count("SUCCESS"),
        "tasks_error": statuses.count("ERROR"),
        "tasks_not_graded": 0,
        "tasks_measured": len(results),
        "tasks_graded": len(graded),
        "tasks_token_budget_exceeded": statuses.count("TOKEN_BUDGET_EXCEEDED"),
        "tasks_cost_budget_exceeded": statuses.count("COST_BUDGET_EXCEEDED"),
        "skipped_tasks": [],
        "max_parallel": run.max_parallel,
        "task_results": results,
        "framework_version": f"evalsite {evalsite.__version__}",
        "environment_info": {"evalsite": evalsite.__version__},
        "pass_rate": statuses.count("SUCCESS") / len(graded) if graded else None,
        "agent_cost_usd": cost,
        "total_cost_usd": cost,
        "cost_complete": True,
    }


def _task_result(trial: Trial, document: dict, folder: Path) -> dict[str, Any]:
    usage = document["total_token_usage"]
    return {
        "task_id": document["task_id"],
        "variant_id": trial.variant.slug,
        "replicate_index": trial.replicate,
        "status": document["final_status"],
        "weighted_score": trial.score,
        "duration": trial.duration_seconds or 0.0,
        "setup_ms": document["setup_ms"],
        "grading_ms": document["grading_ms"],
        "agent_wall_ms": _ms(trial.agent_seconds),
        "iteration_count": 1,
        "tags": list((trial.config or {}).get("tags") or []),
        "task_path": trial.task_version.yaml_path,
        "result_path": (folder / "task.json").as_posix(),
        "model_used": document["model_used"],
        "input_tokens": usage["input_tokens"],
        "output_tokens": usage["output_tokens"],
        "cache_creation_input_tokens": usage["cache_creation_input_tokens"],
        "cache_read_input_tokens": usage["cache_read_input_tokens"],
        "total_tokens": trial.total_tokens,
        "total_cost_usd": trial.cost_usd,
        "agent_cost_usd": trial.cost_usd,
        "cost_complete": True,
        "error_message": trial.error_message or None,
        "error_category": trial.error_category or None,
        "actual_commands": document["actual_commands"],
    }


def _token_usage(trial: Trial) -> dict[str, Any]:
    return {
        "uncached_input_tokens": trial.input_tokens,
        "input_tokens": trial.input_tokens,
        "output_tokens": trial.output_tokens,
        "cache_creation_input_tokens": trial.cache_creation_tokens,
        "cache_read_input_tokens": trial.cache_read_tokens,
        "total_cost_usd": trial.cost_usd,
    }


def _criterion(result) -> dict[str, Any]:
    details = result.details
    return {
        "result_kind": "basic",
        "criterion_type": result.type,
        "description": result.description,
        "score": result.score,
        "evaluation_status": "evaluated",
        "pass_threshold": result.pass_threshold,
        "gating": result.gating,
        "details": details if isinstance(details, str) else json.dumps(details, sort_keys=True, default=str),
        "error": result.error or None,
    }


def _command(call: dict, index: int, at: datetime) -> dict[str, Any]:
    status = call.get("status")
    return {
        "tool_name": str(call.get("name") or ""),
        "tool_id": str(call.get("id") or f"call_{index}"),
        "timestamp": _time(at),
        "parameters": call.get("input") if isinstance(call.get("input"), dict) else {},
        "result_status": status if status in ("success", "error") else "unknown",
        "result_summary": str(call.get("output"))[:2000] if call.get("output") is not None else None,
        "sequence_number": index,
    }


def _early_stop(trial: Trial) -> dict[str, Any] | None:
    """coder-eval's EarlyStopInfo, every required field filled (`report` refuses a task.json
    without them): the watcher's note in the transcript names the deciding criterion and call."""
    if not trial.stopped_early:
        return None
    note = (
        TrialEvent.objects.filter(trial=trial, kind=TrialEvent.Kind.SYSTEM, data__early_stop__isnull=False)
        .order_by("seq")
        .first()
    )
    data = note.data if note is not None else {}
    config = trial.config or {}
    criteria = [c for c in config.get("success_criteria") or [] if isinstance(c, dict)]
    descriptions = {r.index: r.description for r in trial.criterion_results.all()}
    index = data.get("criterion_index", 0)
    deciding = criteria[index] if 0 <= index < len(criteria) else {}
    max_turns = (config.get("run_limits") or {}).get("max_turns")
    started = trial.started_at or trial.queued_at
    return {
        "reason": trial.stopped_early,
        "deciding_criterion_type": str(deciding.get("type") or "command_executed"),
        "deciding_criterion_description": descriptions.get(index) or str(deciding.get("description") or ""),
        "armed_criteria": [
            f"{c.get('type')}: {descriptions.get(i) or c.get('description') or ''}"
            for i, c in enumerate(criteria)
            if armed(c)
        ],
        "sdk_turn_index": trial.turns,
        "tool_call_index": int(data.get("tool_call_index") or 0),
        # From the trial's start to the watcher's note; the agent phase's own start is not kept.
        "elapsed_seconds": max((note.at - started).total_seconds(), 0.0) if note is not None else 0.0,
        "turns_remaining_at_stop": max(int(max_turns) - trial.turns, 0) if max_turns else None,
        "gate_threshold": float(data.get("gate_threshold", gate_threshold(config))),
    }


def suite_rollups(run: Run, results: list[dict], documents: list[dict]) -> list[dict[str, Any]]:
    """coder-eval's SuiteRollup per (variant, dataset task): the row counts, per-criterion stats
    and failed samples from the written trials, and the suite thresholds' verdicts evalsite
    judged (`Run.suite_results`), computed as coder-eval's `reports/markdown.py` does."""
    judged = {(s["variant"], s["task"]): s for s in run.suite_results or []}
    groups: dict[tuple[str, str], list[tuple[dict, dict]]] = {}
    for result, document in zip(results, documents, strict=True):
        suite_id, _, row_id = result["task_id"].partition("/")
        if row_id:
            groups.setdefault((result["variant_id"], suite_id), []).append((result, document))
    rollups = []
    for (variant, suite_id), rows in groups.items():
        statuses = [r["status"] for r, _ in rows]
        passed = statuses.count("SUCCESS")
        errors = statuses.count("ERROR")
        scores = [r["weighted_score"] for r, _ in rows if r["weighted_score"] is not None]
        suite = judged.get((variant, suite_id)) or {}
        rollups.append(
            {
                "suite_id": suite_id,
                "variant_id": variant,
                "rows_total": len(rows),
                "rows_passed": passed,
                "rows_failed": len(rows) - passed - errors,
                "rows_error": errors,
                "rows_not_graded": 0,
                "pass_rate": passed / len(rows),
                "average_weighted_score": sum(scores) / len(scores) if scores else None,
                "criterion_stats": _criterion_stats([d for _, d in rows]),
                "failed_samples": _failed_samples(rows),
                "criterion_aggregates": [_aggregate(a) for a in suite.get("criteria") or []],
                "passed": bool(suite.get("passed", True)),
            }
        )
    return rollups


def _criterion_stats(documents: list[dict]) -> list[dict[str, Any]]:
    scores: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    for document in documents:
        for result in document["success_criteria_results"]:
            scores.setdefault(result["criterion_type"], []).append(result["score"])
            errors[result["criterion_type"]] = errors.get(result["criterion_type"], 0) + bool(result["error"])
    return [
        {
            "criterion_type": kind,
            "rows_evaluated": len(values),
            "average_score": sum(values) / len(values),
            "error_count": errors[kind],
        }
        for kind, values in sorted(scores.items())
    ]


# coder-eval's caps on the failed rows a suite.json lists (`reports/markdown.py`).
FAILED_SAMPLE_LIMIT, FAILURE_REASONS_PER_ROW, FAILURE_REASON_MAX_LEN = 20, 3, 240


def _failed_samples(rows: list[tuple[dict, dict]]) -> list[dict[str, Any]]:
    samples = []
    for result, document in rows:
        if result["status"] == "SUCCESS":
            continue
        if len(samples) >= FAILED_SAMPLE_LIMIT:
            break
        reasons = []
        for criterion in document["success_criteria_results"]:
            if not criterion["gating"]:
                continue  # an informational criterion cannot be why the row failed
            if criterion["error"] is not None or criterion["score"] < criterion["pass_threshold"]:
                fallback = f"{criterion['criterion_type']}: score={criterion['score']:.2f}"
                reasons.append(
                    (criterion["error"] or criterion["details"] or fallback)[:FAILURE_REASON_MAX_LEN]
                )
            if len(reasons) >= FAILURE_REASONS_PER_ROW:
                break
        samples.append(
            {
                "row_id": result["task_id"].partition("/")[2],
                "task_id": result["task_id"],
                "final_status": result["status"],
                "weighted_score": result["weighted_score"],
                "failure_reasons": reasons,
                "error_message": result["error_message"],
                "task_json_relpath": result["result_path"],
                "replicate_index": result["replicate_index"],
            }
        )
    return samples


def _aggregate(aggregate: dict) -> dict[str, Any]:
    """evalsite's criterion aggregate as coder-eval's CriterionAggregate (same metric names)."""
    checks = aggregate.get("threshold_checks") or []
    return {
        "criterion_type": aggregate.get("criterion_type") or aggregate.get("type") or "",
        "description": aggregate.get("description") or None,
        "rows_total": aggregate.get("rows_total", 0),
        "rows_excluded": aggregate.get("rows_excluded", 0),
        "metrics": dict(aggregate.get("metrics") or {}),
        "threshold_checks": [
            {
                "metric": c.get("metric"),
                "min_value": c.get("min_value"),
                "actual_value": c.get("actual_value"),
                "passed": bool(c.get("passed")),
            }
            for c in checks
        ],
        "passed": bool(aggregate.get("passed", True)),
        "details": dict(aggregate.get("details") or {}),
        "error": aggregate.get("error"),
    }


# evalsite's layer names -> coder-eval's ConfigLineageEntry sources.
SOURCES = {"builtin": "default", "experiment": "experiment-defaults", "task": "task", "variant": "variant"}


def _lineage(config: dict, lineage: dict[str, str]) -> dict[str, dict]:
    return {
        path: {"source": SOURCES.get(layer, "cli"), "value": _at(config, path)}
        for path, layer in lineage.items()
    }


def _at(config: dict, path: str) -> Any:
    value: Any = config
    for part in re.split(r"\.|\[(\d+)\]", path):
        if not part:
            continue
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict):
            value = value.get(part)
        else:
            return None
    return value


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _write(path: Path, document: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
