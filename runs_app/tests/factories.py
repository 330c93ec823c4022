"""Small builders for runner tests: write task / experiment YAML into a folder and import it."""

import textwrap
from pathlib import Path

import pytest
from django.conf import settings

from experiments_app.definitions import import_experiment, import_tasks
from experiments_app.models import Experiment
from runs_app.analysis import rollup
from runs_app.models import Run, Trial, UnitTally

EXAMPLES = settings.BASE_DIR / "examples"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def import_examples() -> None:
    import_tasks([EXAMPLES / "tasks"], task_set="examples")


def make_experiment(folder: Path, text: str) -> Experiment:
    """Import an experiment written inline (root: `folder`, so scripts beside it are bundled)."""
    yaml_file = write(folder / "experiments" / "exp.yaml", text)
    return import_experiment(yaml_file, root=folder).experiment


def make_task(folder: Path, slug: str, text: str, files: dict[str, str] | None = None) -> None:
    write(folder / "tasks" / slug / "task.yaml", text)
    for name, content in (files or {}).items():
        write(folder / "tasks" / slug / name, content)


def import_folder_tasks(folder: Path, task_set: str | None = None) -> None:
    import_tasks([folder / "tasks"], task_set=task_set)


def assert_tallies_match(run: Run) -> None:
    """The stored tallies equal the trials grouped afresh (criteria included)."""
    fresh = rollup.grouped_trials(Trial.objects.filter(run_id=run.pk))
    criteria = rollup.grouped_criteria(run.pk, rollup.Q())
    stored = {
        (t.variant_id, t.task_version_id, t.dataset_row_id): t
        for t in UnitTally.objects.filter(run_id=run.pk)
    }
    assert set(stored) == set(fresh)
    for unit, values in fresh.items():
        row = stored[unit]
        assert {name: getattr(row, name) for name in values} == pytest.approx(values), unit
        assert row.criteria == criteria.get(unit, {}), unit


def launched_smoke_run() -> Run:
    """The smoke experiment launched; call inside django_capture_on_commit_callbacks so no
    broker message is sent (the test plays the worker)."""
    from runs_app.launching import launch_run

    import_examples()
    smoke = import_experiment(EXAMPLES / "experiments" / "smoke.yaml", root=EXAMPLES).experiment
    return launch_run(smoke)
