"""A run as a Harbor job directory (`manage.py export_harbor_job RUN DIR`), the layout `harbor run`
writes and Harbor's viewer and its readers walk:

    DIR/config.json                       the job: name, agents (variants), tasks, attempts
    DIR/result.json                       JobResult: n_total_trials, stats.evals[...].metrics
    DIR/<trial_name>/config.json          the trial's configuration
    DIR/<trial_name>/result.json          TrialResult: verifier_result.rewards, agent_result, timings
    DIR/<trial_name>/agent/trajectory.json    the ATIF trajectory (runs_app.analysis.atif)
    DIR/<trial_name>/verifier/reward.txt  the reward (the trial's score), only when it was measured
    DIR/<trial_name>/exception.txt        an errored trial's message

A trial name is `<task>__<variant>-<NN>` (Harbor's `<task>__<random id>`, made stable so two
exports of one run agree). The reward is the trial's weighted score; an errored trial gets no
reward file and an `exception_info`, as Harbor records a verifier that wrote none, so it never
reads as a measured 0. Cancelled, queued and running trials are left out, as in the coder-eval
export.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from runs_app.analysis.atif import agent_version, trajectory_uuid, trial_trajectory
from runs_app.models import Run, Trial


def export_job(run: Run, directory: Path) -> int:
    """Write `run` under `directory` (created; must be empty). Returns how many trials it wrote."""
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()):
        raise FileExistsError(f"{directory} is not empty: export writes a new job directory")
    trials = (
        Trial.objects.for_run(run)
        .current()
        .exclude(status__in=[Trial.Status.CANCELLED, Trial.Status.QUEUED, Trial.Status.RUNNING])
        .select_related("task_version__task", "variant")
        .order_by("variant__position", "task_version__task__slug", "dataset_row_id", "replicate")
    )
    job_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"evalsite:run:{run.pk}"))
    results = []
    for trial in trials.iterator(chunk_size=200):
        name = trial_name(trial)
        folder = directory / name
        result = trial_result(trial, name, job_id)
        _write(folder / "config.json", result["config"])
        _write(folder / "result.json", result)
        _write(folder / "agent" / "trajectory.json", trial_trajectory(trial))
        (folder / "verifier").mkdir(parents=True, exist_ok=True)
        if result["verifier_result"] is not None:
            (folder / "verifier" / "reward.txt").write_text(
                f"{result['verifier_result']['rewards']['reward']}\n"
            )
        if result["exception_info"] is not None:
            (folder / "exception.txt").write_text(result["exception_info"]["exception_message"] + "\n")
        results.append(result)
    _write(directory / "config.json", job_config(run, job_id))
    _write(directory / "result.json", job_result(run, job_id, results))
    return len(results)


def task_name(trial: Trial) -> str:
    slug = trial.task_version.task.slug
    return f"{slug}.{trial.dataset_row_id}" if trial.dataset_row_id else slug


def trial_name(trial: Trial) -> str:
    return f"{task_name(trial)}__{trial.variant.slug}-{trial.replicate:02d}"


def trial_result(trial: Trial, name: str, job_id: str) -> dict[str, Any]:
    """One trial as Harbor's TrialResult."""
    agent = (trial.config or {}).get("agent") or {}
    measured = trial.status in (Trial.Status.PASSED, Trial.Status.FAILED) and trial.score is not None
    exception = None
    if not measured:
        exception = {
            "exception_type": trial.error_category or "EvalsiteTrialError",
            "exception_message": trial.error_message or f"trial {trial.status}",
            "exception_traceback": "",
            "occurred_at": _time(trial.finished_at),
        }
    return {
        "id": trajectory_uuid(trial),
        "task_name": task_name(trial),
        "trial_name": name,
        "trial_uri": f"evalsite:run/{trial.run_id}/trial/{trial.pk}",
        "task_id": {"path": trial.task_version.yaml_path or trial.task_version.task.slug},
        "source": trial.run.experiment.slug,
        "task_checksum": trial.task_version.bundle_id or "",
        "config": {
            "task": {"path": trial.task_version.yaml_path or trial.task_version.task.slug},
            "trial_name": name,
            "job_id": job_id,
            "agent": {"name": str(agent.get("type") or "unknown"), "model_name": agent.get("model")},
            "variant": trial.variant.slug,
            "replicate": trial.replicate,
            "dataset_row": trial.dataset_row_id or None,
        },
        "agent_info": {
            "name": str(agent.get("type") or "unknown"),
            "version": agent_version(trial),
            "model_info": {"name": agent.get("model"), "provider": agent.get("provider")}
            if agent.get("model")
            else None,
        },
        "agent_result": {
            "n_input_tokens": trial.input_tokens + trial.cache_read_tokens + trial.cache_creation_tokens,
            "n_cache_tokens": trial.cache_read_tokens,
            "n_output_tokens": trial.output_tokens,
            "cost_usd": trial.cost_usd,
            "metadata": {
                "status": trial.status,
                "turns": trial.turns,
                "stopped_early": trial.stopped_early or None,
            },
        },
        "verifier_result": {"rewards": {"reward": trial.score}} if measured else None,
        "exception_info": exception,
        "started_at": _time(trial.started_at),
        "finished_at": _time(trial.finished_at),
        "agent_execution": _phase(trial, trial.setup_seconds, trial.agent_seconds),
    }


def job_config(run: Run, job_id: str) -> dict[str, Any]:
    variants = run.experiment.variants.order_by("position")
    return {
        "job_name": f"evalsite-run-{run.pk}",
        "job_id": job_id,
        "n_attempts": max(1, int((run.config or {}).get("repeats") or 1)),
        "n_concurrent_trials": run.max_parallel,
        "agents": [{"name": v.slug} for v in variants],
        "datasets": [{"name": run.experiment.slug}],
    }


def job_result(run: Run, job_id: str, results: list[dict]) -> dict[str, Any]:
    """Harbor's JobResult: per (agent, model, dataset) the trials, errors, mean reward (an errored
    trial counts 0, as Harbor's mean metric counts a trial with no reward), and which trials got
    which reward or exception."""
    # Harbor's `agent__model__dataset` key: a variant is the agent, with the model it names.
    models = {
        v.slug: v.agent.get("model") or v.agent.get("type") or "default"
        for v in run.experiment.variants.all()
    }
    evals: dict[str, dict[str, Any]] = {}
    rewards: dict[str, list[float]] = {}
    for result in results:
        variant = result["config"]["variant"]
        key = f"{variant}__{models.get(variant, 'default')}__{result['source']}"
        entry = evals.setdefault(
            key,
            {
                "n_trials": 0,
                "n_errors": 0,
                "metrics": [],
                "reward_stats": {"reward": {}},
                "exception_stats": {},
            },
        )
        entry["n_trials"] += 1
        if result["exception_info"] is not None:
            entry["n_errors"] += 1
            kind = result["exception_info"]["exception_type"]
            entry["exception_stats"].setdefault(kind, []).append(result["trial_name"])
            rewards.setdefault(key, []).append(0.0)
        else:
            reward = result["verifier_result"]["rewards"]["reward"]
            entry["reward_stats"]["reward"].setdefault(str(reward), []).append(result["trial_name"])
            rewards.setdefault(key, []).append(reward)
    for key, entry in evals.items():
        entry["metrics"] = [{"mean": sum(rewards[key]) / len(rewards[key])}]
    return {
        "id": job_id,
        "started_at": _time(run.started_at or run.created_at),
        "finished_at": _time(run.finished_at),
        "n_total_trials": len(results),
        "stats": {
            "n_trials": len(results),
            "n_errors": sum(1 for r in results if r["exception_info"] is not None),
            "evals": evals,
        },
    }


def _phase(trial: Trial, offset: float | None, seconds: float | None) -> dict[str, Any] | None:
    if trial.started_at is None or seconds is None:
        return None
    start = trial.started_at + timedelta(seconds=offset or 0.0)
    return {"started_at": _time(start), "finished_at": _time(start + timedelta(seconds=seconds))}


def _time(value) -> str | None:
    return value.isoformat() if value else None


def _write(path: Path, document: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
