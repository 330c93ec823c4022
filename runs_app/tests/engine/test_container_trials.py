"""Container tasks end to end through a real worker: Harbor task folders and coder-eval docker
tasks build their image once per host, run their oracle and verifier in the trial's container,
and leave no container behind."""

import shutil

import pytest

from runs_app.engine.sandbox import docker
from runs_app.launching import launch_run
from runs_app.models import CriterionResult, Trial, TrialEvent
from runs_app.tests.containers import container_worker, purge_container_queues, require_engine
from runs_app.tests.factories import EXAMPLES, import_folder_tasks, make_experiment
from runs_app.tests.workers import wait_for_run

pytestmark = pytest.mark.django_db(transaction=True)

ORACLE_AND_NONE = """
experiment_id: harbor
max_parallel: 4
defaults:
  repeats: {repeats}
variants:
  - variant_id: oracle
    agent: {{type: oracle}}
  - variant_id: none
    agent: {{type: none}}
"""


@pytest.fixture
def worker(tmp_path):
    require_engine()
    yield container_worker(tmp_path)
    purge_container_queues()


def outcomes(run) -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for trial in Trial.objects.filter(run=run).select_related("task_version__task", "variant"):
        key = (trial.variant.slug, trial.task_version.task.slug)
        found.setdefault(key, []).append(trial.status)
    return found


def test_harbor_folders_run_their_oracle_and_verifier_in_a_container(worker, tmp_path):
    for name in ("hello-world", "shout-and-count"):
        shutil.copytree(EXAMPLES / "harbor" / name, tmp_path / "tasks" / name)
    import_folder_tasks(tmp_path)
    run = launch_run(make_experiment(tmp_path, ORACLE_AND_NONE.format(repeats=2)))
    run = wait_for_run(run, 240, worker)

    found = outcomes(run)
    errors = list(Trial.objects.filter(run=run, status="error").values_list("error_message", flat=True))
    assert not errors, errors
    assert found[("oracle", "hello-world")] == ["passed", "passed"]
    assert found[("oracle", "shout-and-count")] == ["passed", "passed"]
    assert found[("none", "hello-world")] == ["failed", "failed"]
    assert found[("none", "shout-and-count")] == ["failed", "failed"]
    # reward.json's two keys are two results, each half the verifier's weight.
    trial = Trial.objects.filter(run=run, variant__slug="oracle", task_version__task__slug="shout-and-count")[
        0
    ]
    parts = {c.description.rsplit(": ", 1)[-1]: c for c in CriterionResult.objects.filter(trial=trial)}
    assert set(parts) == {"count", "upper"} and all(c.passed and c.weight == 0.5 for c in parts.values())
    # One image per task, built at most once on this host; every trial names its digest.
    digests = {t.task_version.task.slug: set() for t in Trial.objects.filter(run=run)}
    for t in Trial.objects.filter(run=run).select_related("task_version__task"):
        digests[t.task_version.task.slug].add(t.image_digest)
    assert all(len(d) == 1 and next(iter(d)).startswith("sha256:") for d in digests.values()), digests
    builds = [
        e.data
        for e in TrialEvent.objects.filter(trial__run=run, kind="output")
        if e.data.get("step") == "image"
    ]
    assert len(builds) == 8
    built = [b for b in builds if "built evalsite/task:" in b["stdout"]]
    assert len(built) <= 2  # the first trial of each task, if the image was not there yet
    # The containers went with their trials.
    assert not [
        c
        for c in docker.containers()
        if str(tmp_path) in str(c.root) or c.worker.endswith(f":{worker.proc.pid}")
    ]
