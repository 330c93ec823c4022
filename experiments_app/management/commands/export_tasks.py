from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from evalsite.files import user_umask
from experiments_app.definitions import export_tasks
from experiments_app.models import TaskSet


class Command(BaseCommand):
    help = "Write a task set's tasks as YAML plus bundle files into DIR (re-imports to the same digests)."

    def add_arguments(self, parser):
        parser.add_argument("--set", dest="task_set", required=True, help="task set name")
        parser.add_argument("dest", type=Path, help="output folder")

    def handle(self, *args, task_set: str, dest: Path, **options):
        try:
            tasks = TaskSet.objects.get(name=task_set).tasks.all()
        except TaskSet.DoesNotExist:
            raise CommandError(f"no task set named {task_set!r}") from None
        with user_umask():
            dest.mkdir(parents=True, exist_ok=True)
            written = export_tasks(tasks, dest)
        self.stdout.write(self.style.SUCCESS(f"Exported {len(written)} task(s) to {dest}"))
