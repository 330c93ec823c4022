"""Export tasks as YAML plus bundle files, laid out so that re-importing gives the same digests."""

import io
import zipfile
from pathlib import Path

from experiments_app.models import Task
from experiments_app.specs.bundles import read_bundle, write_bundle_files


def task_files(task: Task) -> dict[str, bytes]:
    """The task's bundle (its YAML and every file it references) under `<task_id>/`."""
    files = read_bundle(bytes(task.bundle.data))
    return {f"{task.slug}/{name}": content for name, content in files.items()}


def export_tasks(tasks, dest: Path) -> list[Path]:
    """Write each task to `dest/<task_id>/`; returns the YAML paths written."""
    written = []
    for task in tasks.select_related("bundle"):
        write_bundle_files(task_files(task), dest)
        written.append(dest / task.slug / task.current_version().yaml_path)
    return written


def export_tasks_zip(tasks) -> bytes:
    """The same layout as export_tasks, as a zip archive (for the admin's download)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for task in tasks.select_related("bundle"):
            for name, content in sorted(task_files(task).items()):
                archive.writestr(name, content)
    return buffer.getvalue()
