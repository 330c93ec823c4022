"""`manage.py export_harbor_job RUN_ID DIR`: a run as a Harbor job directory (per-trial result.json,
verifier/reward.txt, agent/trajectory.json; the job's result.json)."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from evalsite.files import user_umask
from runs_app.analysis.harbor_job import export_job
from runs_app.models import Run


class Command(BaseCommand):
    help = "Write a run as a Harbor job directory (result.json, <trial>/result.json, rewards, trajectories)."

    def add_arguments(self, parser):
        parser.add_argument("run_id", type=int)
        parser.add_argument("directory", type=Path, help="a new or empty folder")

    def handle(self, *args, run_id: int, directory: Path, **options):
        run = Run.objects.select_related("experiment").filter(pk=run_id).first()
        if run is None:
            raise CommandError(f"no run {run_id}", returncode=2)
        try:
            with user_umask():
                written = export_job(run, directory)
        except FileExistsError as exc:
            raise CommandError(str(exc), returncode=2) from None
        self.stdout.write(f"wrote {written} trial(s) of run {run.pk} to {directory} (Harbor job directory)")
