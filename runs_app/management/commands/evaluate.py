"""`manage.py evaluate RUN_ID [--task SLUG ...]`: grade an ended run's trials again with their
tasks' current criteria, into new attempts (coder-eval's `evaluate`)."""

from django.core.management.base import BaseCommand, CommandError

from runs_app.control import ControlRefused
from runs_app.models import Run
from runs_app.regrading import EvaluateRefused, evaluate_run


class Command(BaseCommand):
    help = (
        "Grade the trials of an ended run again with the current criteria of their tasks (import the "
        "edited YAML first). Workspace criteria need the run's artifacts (--keep-artifacts at launch)."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id", type=int)
        parser.add_argument("--task", dest="tasks", action="append", help="only this task (repeatable)")

    def handle(self, *args, run_id: int, tasks: list[str] | None, **options):
        run = Run.objects.filter(pk=run_id).first()
        if run is None:
            raise CommandError(f"no run {run_id}", returncode=2)
        try:
            evaluation = evaluate_run(run, task_slugs=tasks)
        except (EvaluateRefused, ControlRefused) as exc:
            problems = getattr(exc, "problems", [str(exc)])
            raise CommandError("cannot evaluate:\n  " + "\n  ".join(problems), returncode=2) from None
        for old, new in evaluation.changes:
            mark = "  " if old.status == new.status else "→ "
            self.stdout.write(f"{mark}{old.label}: {old.status} -> {new.status} (attempt {new.attempt})")
        run.refresh_from_db()
        self.stdout.write(
            f"re-graded {len(evaluation.changes)} trial(s) of run {run.pk}, {evaluation.changed} changed; "
            f"now {run.n_passed} passed, {run.n_failed} failed, {run.n_error} errors"
        )
