"""Builders shared by the dashboard view tests (no tests here)."""

from django.utils import timezone

from experiments_app.models import Experiment
from experiments_app.tests.factories import smoke_experiment
from runs_app.analysis import rollup
from runs_app.launching import LaunchOptions, launch_run
from runs_app.models import Run, Trial

__all__ = ["finish_run", "finish_trial", "launched_run", "smoke_experiment"]


def launched_run(user=None, experiment: Experiment | None = None) -> Run:
    """A queued run of 6 trials; nothing is dispatched (on_commit never fires in a test transaction)."""
    return launch_run(experiment or smoke_experiment(), user=user, options=LaunchOptions(seed=1))


def finish_trial(trial: Trial, status: str, **fields) -> Trial:
    now = timezone.now()
    defaults = {
        "started_at": now,
        "finished_at": now,
        "duration_seconds": 1.5,
        "score": 1.0 if status == "passed" else 0.0,
    }
    Trial.objects.filter(pk=trial.pk).update(status=status, **{**defaults, **fields})
    trial.refresh_from_db()
    return trial


def finish_run(run: Run, statuses: list[str] | None = None) -> Run:
    """Give every current trial an outcome (cycling through `statuses`) and end the run."""
    statuses = statuses or ["passed", "failed"]
    for i, trial in enumerate(run.trials.filter(is_latest=True).order_by("pk")):
        finish_trial(trial, statuses[i % len(statuses)])
    rollup.recount(run)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FINISHED, finished_at=timezone.now())
    run.refresh_from_db()
    return run
