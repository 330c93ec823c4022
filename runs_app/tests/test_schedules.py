"""Scheduled runs and their alerts: cron times, launching once per time, gates deciding alerts,
delivery by e-mail and webhook; and the real thing: beat in a worker launches the run, the run
ends, its alert reaches a local SMTP server and webhook."""

from datetime import UTC, datetime, timedelta

import pytest
from django.core import mail
from django.utils import timezone

from conftest import WorkerProcess, purge_broker
from evalsite.versioning import code_version
from runs_app import alerts, scheduling
from runs_app.models import Alert, Run, Schedule, Worker
from runs_app.tests.factories import EXAMPLES, import_examples, make_experiment
from runs_app.tests.sinks import SmtpSink, WebhookSink
from runs_app.tests.web.builders import finish_run, launched_run, smoke_experiment
from runs_app.tests.workers import wait_for_run

GATED = """
experiment_id: gated
tags: [smoke]
baseline: reference
defaults:
  run_limits: {task_timeout: 60}
variants:
  - variant_id: reference
    agent: {type: oracle}
  - variant_id: no-op
    agent: {type: none}
gates:
  - {type: min_pass_rate, variant: no-op, value: 0.5, name: no-op solves half}
"""


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    "cron, after, expected",
    [
        ("0 3 * * *", "2026-05-01T01:00:00", "2026-05-01T03:00:00"),
        ("0 3 * * *", "2026-05-01T03:00:00", "2026-05-02T03:00:00"),  # strictly after
        ("0 3 * * *", "2026-05-01T02:59:59.999", "2026-05-01T03:00:00"),
        ("*/15 * * * *", "2026-05-01T10:07:30", "2026-05-01T10:15:00"),
        ("@nightly", "2026-05-01T04:00:00", "2026-05-02T03:00:00"),
        ("30 6 * * mon", "2026-05-01T00:00:00", "2026-05-04T06:30:00"),  # 1 May 2026 is a Friday
    ],
)
def test_it_finds_a_crons_next_time(cron, after, expected):
    assert scheduling.next_time(cron, at(after)) == at(expected)


@pytest.mark.parametrize(
    "cron, problem",
    [
        ("0 3 * *", "expected 5 fields"),
        ("61 * * * *", "61"),
        ("0 0 31 2 *", "never occurs"),
        ("x", "5 fields"),
    ],
)
def test_it_says_what_is_wrong_with_a_cron(cron, problem):
    with pytest.raises(scheduling.ScheduleError, match=problem):
        scheduling.parse_cron(cron)


def _schedule(experiment, user=None, **fields) -> Schedule:
    defaults = {"cron": "0 3 * * *", "emails": ["team@example.com"], "next_run_at": timezone.now()}
    return Schedule.objects.create(experiment=experiment, created_by=user, **{**defaults, **fields})


@pytest.mark.django_db
def test_a_due_schedule_launches_one_run_and_moves_to_its_next_time(member):
    schedule = _schedule(smoke_experiment(), member, next_run_at=timezone.now() - timedelta(minutes=1))

    launched = scheduling.launch_due()
    again = scheduling.launch_due()

    [run] = launched
    assert again == [] and Run.objects.count() == 1
    assert run.started_by == member and Run.objects.get().schedule == schedule
    schedule.refresh_from_db()
    assert schedule.next_run_at > timezone.now() and schedule.next_run_at.minute == 0
    assert schedule.next_run_at.hour == 3 and schedule.last_error == ""


@pytest.mark.django_db
def test_a_paused_or_future_schedule_launches_nothing():
    experiment = smoke_experiment()
    _schedule(experiment, enabled=False, next_run_at=timezone.now() - timedelta(hours=1))
    _schedule(experiment, next_run_at=timezone.now() + timedelta(hours=1))

    assert scheduling.launch_due() == [] and not Run.objects.exists()


@pytest.mark.django_db
def test_a_run_pre_flight_refuses_is_not_launched_and_alerts(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    import_examples()
    from experiments_app.definitions import import_experiment

    demo = import_experiment(EXAMPLES / "experiments" / "demo.yaml", root=EXAMPLES).experiment
    Worker.objects.create(name="w@a", hostname="a", code_version=code_version(), last_seen_at=timezone.now())
    schedule = _schedule(demo, next_run_at=timezone.now())

    assert scheduling.launch_due() == []

    schedule.refresh_from_db()
    assert not Run.objects.exists()
    assert "pre-flight: claude: the claude CLI (claude-code): no live worker has it" in schedule.last_error
    [message] = mail.outbox
    assert message.subject == "[evalsite] demo: the scheduled run did not start"
    assert "a key for anthropic (ANTHROPIC_API_KEY)" in message.body
    assert Alert.objects.get().run is None


@pytest.mark.django_db
def test_gates_decide_whether_a_run_alerts():
    schedule = _schedule(smoke_experiment())
    run = finish_run(launched_run(), ["passed"])

    assert alerts.reason(run, schedule) is None  # no gates, finished: quiet
    run.gates_passed, run.gate_results = True, [{"name": "g", "passed": True}]
    assert alerts.reason(run, schedule) is None
    run.gates_passed, run.gate_results = False, [{"name": "every variant solves half", "passed": False}]
    assert alerts.reason(run, schedule) == "1 gate failed: every variant solves half"
    run.status, run.stop_reason = Run.Status.CANCELLED, "stopped early: 5 trials ended in the same error"
    assert (
        alerts.reason(run, schedule)
        == "stopped before its end: stopped early: 5 trials ended in the same error"
    )
    schedule.alert_on = Schedule.AlertOn.ALWAYS
    run.status, run.gates_passed, run.gate_results = Run.Status.FINISHED, None, []
    assert alerts.reason(run, schedule) == "finished (the experiment has no gates)"


@pytest.mark.django_db
def test_an_alert_goes_once_by_mail_and_webhook_with_the_comparison_with_the_last_good_run(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    hook = WebhookSink()
    experiment = smoke_experiment()
    good = finish_run(launched_run(experiment=experiment), ["passed"])
    Run.objects.filter(pk=good.pk).update(gates_passed=True)
    schedule = _schedule(experiment, webhook_url=hook.url)
    bad = finish_run(launched_run(experiment=experiment), ["failed"])
    Run.objects.filter(pk=bad.pk).update(
        schedule=schedule,
        gates_passed=False,
        gate_results=[{"name": "min rate", "passed": False, "detail": "0%"}],
    )

    sent = alerts.alert_run(bad.pk)
    assert alerts.alert_run(bad.pk) == []  # once per run and channel

    assert [alert.channel for alert in sent] == ["email", "webhook"] and all(a.delivered for a in sent)
    [message] = mail.outbox
    url = f"{settings.SITE_URL}/experiments/smoke/compare/?runs={good.pk}%2C{bad.pk}"
    assert message.subject == f"[evalsite] smoke: scheduled run #{bad.pk} 1 gate failed: min rate"
    assert url in message.body and "Gate FAILED: min rate: 0%" in message.body
    [body] = hook.wait()
    assert body["comparison_url"] == url and body["run"] == bad.pk and body["gates_passed"] is False
    assert body["text"].startswith(message.subject)
    hook.stop()


@pytest.mark.django_db
def test_an_undeliverable_webhook_is_recorded_not_raised():
    hook = WebhookSink(status=500)
    schedule = _schedule(smoke_experiment(), emails=[], webhook_url=hook.url)
    run = finish_run(launched_run(), ["failed"])
    Run.objects.filter(pk=run.pk).update(
        schedule=schedule, gates_passed=False, gate_results=[{"passed": False}]
    )

    [alert] = alerts.alert_run(run.pk)

    host = hook.url.split("/hook")[0]
    assert not alert.delivered and alert.detail == f"not delivered: {host}/… answered HTTP 500"
    assert "/hook" not in alert.detail  # a chat webhook's path is its secret
    hook.stop()


@pytest.mark.django_db(transaction=True)
def test_beat_launches_the_scheduled_run_and_its_failed_gate_alerts_by_mail_and_webhook(tmp_path, member):
    smtp, hook = SmtpSink(), WebhookSink()
    import_examples()
    experiment = make_experiment(tmp_path, GATED)
    schedule = Schedule.objects.create(
        experiment=experiment, cron="0 3 * * *", emails=["team@example.com"], webhook_url=hook.url,
        created_by=member, next_run_at=timezone.now(),
    )  # fmt: skip
    purge_broker()
    env = {"SCHEDULE_TICK_SECONDS": "1", "EMAIL_HOST": "127.0.0.1", "EMAIL_PORT": str(smtp.port)}
    worker = WorkerProcess(tmp_path, beat=True, extra_env=env).start()

    run = wait_for_run(_scheduled_run(schedule, worker), timeout=120, worker=worker)

    assert run.gates_passed is False and run.started_by == member
    [message] = smtp.wait(timeout=60)
    assert (
        message["Subject"].replace("\r\n", "")
        == f"[evalsite] gated: scheduled run #{run.pk} 1 gate failed: no-op solves half"
    )
    assert message["To"] == "team@example.com"
    [body] = hook.wait(timeout=60)
    assert body["run"] == run.pk and body["comparison_url"].endswith(f"/runs/{run.pk}/compare/")
    schedule.refresh_from_db()
    assert schedule.next_run_at > timezone.now() and Run.objects.count() == 1  # once, not every tick
    smtp.stop()
    hook.stop()


def _scheduled_run(schedule: Schedule, worker: WorkerProcess) -> Run:
    from conftest import wait_for

    return wait_for(
        lambda: Run.objects.filter(schedule=schedule).first(),
        timeout=60,
        message=lambda: f"beat to launch the scheduled run; log:\n{worker.log()[-3000:]}",
    )


def test_make_run_starts_beat_so_schedules_work_on_the_embedded_default(settings):
    import re

    script = (settings.BASE_DIR / "scripts" / "run_dev.sh").read_text()

    assert re.search(r"celery -A evalsite worker [^\n]*(-B|--beat)", script.replace("\\\n", " "))
    tick = settings.CELERY_BEAT_SCHEDULE["launch-scheduled-runs"]
    assert tick["task"] == "runs_app.tasks.launch_scheduled_runs"
    assert tick["schedule"] == settings.SCHEDULE_TICK_SECONDS
