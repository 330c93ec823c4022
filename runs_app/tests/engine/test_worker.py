from conftest import wait_for
from runs_app.models import Worker
from runs_app.tasks import record_heartbeat


def test_it_runs_a_task_through_a_real_worker(celery_worker_process):
    record_heartbeat.delay("ping-from-test")

    worker = wait_for(
        lambda: Worker.objects.filter(name="ping-from-test").first(),
        timeout=60,
        message=lambda: f"the worker to run the task; log:\n{celery_worker_process.log()}",
    )
    assert worker.last_seen_at is not None
