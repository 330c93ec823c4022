"""`manage.py export_coder_eval_run RUN_ID DIR`: a run as a coder-eval run directory, which
coder-eval's `report` (and evalsite's `import_coder_eval_run`) reads."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from evalsite.files import user_umask
from runs_app.analysis.coder_eval_run import export_run
from runs_app.models import Run


class Command(BaseCommand):
    help = "Write a run as a coder-eval run directory (run.json, <variant>/<task>/<NN>/task.json)."

    def add_arguments(self, parser):
        parser.add_argument("run_id", type=int)
        parser.add_argument("directory", type=Path, help="a new or empty folder")

    def handle(self, *args, run_id: int, directory: Path, **options):
        run = Run.objects.select_related("experiment").filter(pk=run_id).first()
        if run is None:
            raise CommandError(f"no run {run_id}", returncode=2)
        try:
            with user_umask():
                written = export_run(run, directory)
        except FileExistsError as exc:
            raise CommandError(str(exc), returncode=2) from None
        self.stdout.write(
            f"wrote {written} trial(s) of run {run.pk} to {directory} (coder-eval run directory)"
        )
