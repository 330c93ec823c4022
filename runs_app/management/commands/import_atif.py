"""`manage.py import_atif TRIAL_ID FILE`: an ATIF trajectory as the transcript of a trial of an
imported run (its review page then shows the steps)."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from runs_app.analysis.atif import AtifError, ImportRefused, import_trajectory
from runs_app.models import Trial


class Command(BaseCommand):
    help = "Import an ATIF trajectory.json as the transcript of a trial of an imported (historical) run."

    def add_arguments(self, parser):
        parser.add_argument("trial_id", type=int)
        parser.add_argument("file", type=Path)

    def handle(self, *args, trial_id: int, file: Path, **options):
        trial = Trial.objects.select_related("run").filter(pk=trial_id).first()
        if trial is None:
            raise CommandError(f"no trial {trial_id}", returncode=2)
        try:
            text = file.read_bytes()
        except OSError as exc:
            raise CommandError(f"{file}: {exc.strerror}", returncode=2) from None
        try:
            written = import_trajectory(trial, text, name=str(file))
        except AtifError as exc:
            raise CommandError("nothing imported:\n" + "\n".join(exc.problems), returncode=2) from None
        except ImportRefused as exc:
            raise CommandError(str(exc), returncode=2) from None
        self.stdout.write(f"imported {file} into trial {trial.pk}: {written} transcript events")
        self.stdout.write(trial.get_absolute_url())
