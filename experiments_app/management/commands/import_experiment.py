from pathlib import Path

import yaml
from django.core.files import File
from django.core.management.base import BaseCommand, CommandError

from experiments_app.definitions import ImportFailed, import_experiment, import_experiment_upload
from experiments_app.models import Experiment
from experiments_app.specs.yaml_errors import load_yaml


def _experiment_id(path: Path) -> str | None:
    """The file's experiment_id, read without importing (None when the file does not say)."""
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    value = data.get("experiment_id") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


class Command(BaseCommand):
    help = (
        "Import a coder-eval experiment YAML (with evalsite's task selection fields), or an experiment's zip "
        "(its YAML and files: export_experiment, or the site's download)."
    )

    def add_arguments(self, parser):
        parser.add_argument("path", type=Path)
        parser.add_argument(
            "--root",
            type=Path,
            help="folder that relative paths may not leave (default: the YAML's folder; use the suite folder "
            "when variants use ../overlays)",
        )
        parser.add_argument(
            "--keep-existing",
            action="store_true",
            help="leave an experiment of the same ID as it is (`make run` keeps edits to the demo)",
        )

    def handle(self, *args, path: Path, root: Path | None, keep_existing: bool = False, **options):
        slug = _experiment_id(path) if keep_existing and path.suffix != ".zip" else None
        if slug and Experiment.objects.filter(slug=slug).exists():
            self.stdout.write(f"Kept experiment {slug} as it is (--keep-existing)")
            return
        try:
            if path.suffix == ".zip":  # an experiment with its files (export_experiment, the site)
                with path.open("rb") as handle:
                    report = import_experiment_upload(File(handle, name=path.name), replace=True)
            else:
                report = import_experiment(path, root=root)
        except (ImportFailed, OSError) as exc:
            issues = exc.issues if isinstance(exc, ImportFailed) else [str(exc)]
            raise CommandError(f"nothing imported: {len(issues)} problem(s)\n" + "\n".join(issues)) from None
        for warning in report.warnings:
            self.stderr.write(f"warning: {warning}")
        experiment = report.experiment
        verb = "Created" if report.created else "Updated"
        variants = ", ".join(experiment.variants.values_list("slug", flat=True))
        self.stdout.write(self.style.SUCCESS(f"{verb} experiment {experiment.slug} (variants: {variants})"))
