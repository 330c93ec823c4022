from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from experiments_app.definitions import ImportFailed, import_tasks


class Command(BaseCommand):
    help = (
        "Import coder-eval task YAML files and Harbor task folders (task.toml, instruction.md, ...), "
        "or folders holding them (recursive). All or nothing."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "paths", nargs="+", type=Path, help="task YAML files, Harbor task folders, or folders of them"
        )
        parser.add_argument("--set", dest="task_set", help="also add the tasks to this task set")
        parser.add_argument(
            "--root", type=Path, help="folder that relative paths may not leave (default: each argument)"
        )

    def handle(self, *args, paths: list[Path], task_set: str | None, root: Path | None, **options):
        try:
            report = import_tasks(paths, root=root, task_set=task_set)
        except ImportFailed as exc:
            raise CommandError(
                f"nothing imported: {len(exc.issues)} problem(s)\n" + "\n".join(exc.issues)
            ) from None
        for warning in report.warnings:
            self.stderr.write(f"warning: {warning}")
        in_set = f" into task set {task_set!r}" if task_set else ""
        self.stdout.write(self.style.SUCCESS(f"Imported tasks{in_set}: {report.summary()}"))
