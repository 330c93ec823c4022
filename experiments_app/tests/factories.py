"""Builders shared by the tests (no tests here)."""

from django.conf import settings

from experiments_app.definitions import import_experiment, import_tasks
from experiments_app.models import Experiment

EXAMPLES = settings.BASE_DIR / "examples"


def smoke_experiment() -> Experiment:
    """The example tasks (set "examples") and the `smoke` experiment: 3 tasks × 2 variants."""
    import_tasks([EXAMPLES / "tasks"], task_set="examples")
    return import_experiment(EXAMPLES / "experiments" / "smoke.yaml", root=EXAMPLES).experiment
