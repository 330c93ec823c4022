"""`manage.py import_coder_eval_run DIR`: a coder-eval run directory as a read-only historical run."""

from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from runs_app.importers.coder_eval import CoderEvalImportError, import_coder_eval_run


class Command(BaseCommand):
    help = (
        "Import a coder-eval run directory (run.json, experiment.json, <variant>/<task>/<NN>/task.json) "
        "as a read-only historical run, to compare old results with new ones."
    )

    def add_arguments(self, parser):
        parser.add_argument("directory", type=Path)
        parser.add_argument(
            "--experiment",
            help="attach the run to this experiment slug (default: the run's experiment_id, "
            "else coder-eval-<run_id>)",
        )
        parser.add_argument("--user", help="username recorded as the run's starter")

    def handle(self, *args, directory: Path, experiment: str | None, user: str | None, **options):
        starter = None
        if user:
            starter = get_user_model().objects.filter(username=user).first()
            if starter is None:
                raise CommandError(f"--user: no user named {user!r}", returncode=2)
        try:
            report = import_coder_eval_run(directory, user=starter, experiment_slug=experiment)
        except CoderEvalImportError as exc:
            raise CommandError("nothing imported:\n" + "\n".join(exc.problems), returncode=2) from None
        run = report.run
        verb = "created" if report.created_experiment else "existing"
        self.stdout.write(
            f"imported coder-eval run {run.config['coder_eval']['run_id']} as run {run.pk} "
            f"({verb} experiment {run.experiment.slug}): {run.n_trials} trials, {run.n_passed} passed, "
            f"{run.n_failed} failed, {run.n_error} errors"
        )
        for warning in report.warnings:
            self.stderr.write(f"warning: {warning}")
        self.stdout.write(run.get_absolute_url())
