"""`manage.py export_atif TRIAL_ID [FILE]`: one trial's transcript as an ATIF trajectory."""

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from runs_app.analysis.atif import trial_trajectory
from runs_app.models import Trial


class Command(BaseCommand):
    help = "Write a trial's transcript as an ATIF trajectory (trajectory.json; stdout without FILE)."

    def add_arguments(self, parser):
        parser.add_argument("trial_id", type=int)
        parser.add_argument("file", type=Path, nargs="?", help="where to write it (default: stdout)")

    def handle(self, *args, trial_id: int, file: Path | None, **options):
        trial = Trial.objects.filter(pk=trial_id).first()
        if trial is None:
            raise CommandError(f"no trial {trial_id}", returncode=2)
        text = json.dumps(trial_trajectory(trial), indent=2) + "\n"
        if file is None:
            self.stdout.write(text, ending="")
            return
        file.write_text(text, encoding="utf-8")
        self.stdout.write(f"wrote trial {trial.pk}'s trajectory to {file}")
