from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from experiments_app.definitions import ImportFailed, import_experiment


class Command(BaseCommand):
    help = "Import a coder-eval experiment YAML (with evalsite's task selection fields)."

    def add_arguments(self, parser):
        parser.add_argument("path", type=Path)
        parser.add_argument(
            "--root",
            type=Path,
            help="folder that relative paths may not leave (default: the YAML's folder; use the suite folder "
            "when variants use ../overlays)",
        )

    def handle(self, *args, path: Path, root: Path | None, **options):
        try:
            report = import_experiment(path, root=root)
        except ImportFailed as exc:
            raise CommandError(
                f"nothing imported: {len(exc.issues)} problem(s)\n" + "\n".join(exc.issues)
            ) from None
        for warning in report.warnings:
            self.stderr.write(f"warning: {warning}")
        experiment = report.experiment
        verb = "Created" if report.created else "Updated"
        variants = ", ".join(experiment.variants.values_list("slug", flat=True))
        self.stdout.write(self.style.SUCCESS(f"{verb} experiment {experiment.slug} (variants: {variants})"))
