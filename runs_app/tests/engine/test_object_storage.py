"""Kept workspaces in S3-compatible object storage: a worker stores them there, and nothing on its
disk; the web process reads them back from there (the trial page's download)."""

import io
import tarfile

import pytest
from django.urls import reverse

from conftest import WorkerProcess
from runs_app.launching import LaunchOptions, launch_run
from runs_app.models import Trial
from runs_app.tests.workers import small_suite, wait_for_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_worker_keeps_workspaces_in_the_bucket_and_the_web_serves_them(tmp_path, s3_server, admin_client):
    experiment = small_suite(tmp_path, 2, "echo kept-by-the-agent > out.txt")
    worker_media = tmp_path / "worker-media"
    worker_media.mkdir()
    env = {**s3_server.env, "MEDIA_ROOT": str(worker_media)}
    worker = WorkerProcess(tmp_path, extra_env=env).start()
    run = wait_for_run(launch_run(experiment, options=LaunchOptions(keep_artifacts=True)), 90, worker)

    trials = list(Trial.objects.filter(run=run))
    assert {t.status for t in trials} == {"passed"}, worker.log()[-3000:]
    assert s3_server.keys() == sorted(t.artifact for t in trials)
    assert not any(worker_media.iterdir())  # nothing went to the worker's own disk

    trial = trials[0]
    response = admin_client.get(reverse("trial_artifact", args=[run.pk, trial.pk]))
    assert response.status_code == 200 and response["Content-Type"] == "application/gzip"
    with tarfile.open(fileobj=io.BytesIO(b"".join(response.streaming_content))) as tar:
        names = tar.getnames()
        out = next(member for member in tar.getmembers() if member.name.endswith("out.txt"))
        assert tar.extractfile(out).read() == b"kept-by-the-agent\n", names
    page = admin_client.get(reverse("trial_detail", args=[run.pk, trial.pk])).content.decode()
    assert reverse("trial_artifact", args=[run.pk, trial.pk]) in page
