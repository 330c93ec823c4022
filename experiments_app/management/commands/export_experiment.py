from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from experiments_app.definitions import ImportFailed, experiment_zip
from experiments_app.models import Experiment


class Command(BaseCommand):
    help = (
        "Write an experiment and every file it names as one zip (`import_experiment` or the site's upload "
        "brings it back with the same digest)."
    )

    def add_arguments(self, parser):
        parser.add_argument("experiment", help="the experiment's ID")
        parser.add_argument("dest", type=Path, help="the zip to write, e.g. demo.zip")

    def handle(self, *args, experiment: str, dest: Path, **options):
        found = Experiment.objects.filter(slug=experiment).first()
        if found is None:
            raise CommandError(f"no experiment {experiment!r}")
        try:
            content = experiment_zip(found)
        except ImportFailed as exc:
            raise CommandError(f"{experiment} cannot be bundled:\n" + "\n".join(exc.issues)) from None
        dest.write_bytes(content)
        self.stdout.write(self.style.SUCCESS(f"Wrote {experiment} ({found.bundle_id[:12]}) to {dest}"))
