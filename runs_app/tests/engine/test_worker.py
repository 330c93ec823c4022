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


def test_a_worker_reports_its_clis_and_which_providers_it_has_keys_for(transactional_db, tmp_path):
    import os

    from conftest import WorkerProcess, purge_broker

    purge_broker()
    secret = "sk-test-never-shown-0123456789"
    env = dict.fromkeys(("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "GEMINI_API_KEY"), "")
    worker = WorkerProcess(tmp_path, extra_env={**env, "OPENAI_API_KEY": secret}).start()

    found = wait_for(
        lambda: Worker.objects.exclude(hostname="").first(),
        timeout=60,
        message=lambda: f"the worker's own report; log:\n{worker.log()}",
    )

    assert found.providers == ["openai"]
    assert secret not in repr(Worker.objects.values().get(pk=found.pk))
    if os.access("node_modules/.bin/claude", os.X_OK):
        assert "claude-code" in found.agent_versions
