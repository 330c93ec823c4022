"""Outage drills on the production stack (PostgreSQL + Redis, uvicorn, a real worker): the database
down 30 s, the broker down 30 s, the only worker killed mid-run. Each is seen on the pages at
once, no trial is lost, and no trial whose agent ran runs again.

The database and the broker are reached through a proxy the test cuts (tests/outages.py): the
machine's own services keep running for everything else, and this process keeps its direct
connection to check the rows.
"""

import threading
import time
from collections import Counter

import pytest
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore
from django.db import connection

from conftest import WorkerProcess, wait_for, worker_environment
from runs_app.launching import launch_run
from runs_app.models import Run, Trial, TrialEvent
from runs_app.tests.workers import small_suite, wait_for_run
from tests.outages import CutProxy, WebProcess

pytestmark = pytest.mark.django_db(transaction=True)

OUTAGE_SECONDS = 30


def production_pass() -> None:
    if connection.vendor != "postgresql" or not settings.CELERY_BROKER_URL.startswith("redis://"):
        pytest.skip("outages of networked services: the production pass (PostgreSQL + Redis) runs this")


def session_cookie(user) -> str:
    session = SessionStore()
    session[SESSION_KEY], session[BACKEND_SESSION_KEY] = (
        str(user.pk),
        "django.contrib.auth.backends.ModelBackend",
    )
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return f"sessionid={session.session_key}"


class StreamReader(threading.Thread):
    """A browser holding a run page's live stream: the events it gets, and whether it closed."""

    def __init__(self, web: WebProcess, path: str, cookie: str) -> None:
        super().__init__(daemon=True)
        self.web, self.path, self.cookie = web, path, cookie
        self.updates: list[float] = []
        self.closed_at: float | None = None
        self.status = 0

    def run(self) -> None:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.web.port, timeout=300)
        conn.request("GET", self.path, headers={"Cookie": self.cookie, "Accept": "text/event-stream"})
        response = conn.getresponse()
        self.status = response.status
        while line := response.fp.readline():
            if line.startswith(b"event: update"):
                self.updates.append(time.monotonic())
            if line.startswith(b"event: done"):
                break
        self.closed_at = time.monotonic()


def assert_each_trial_ran_once(run: Run) -> None:
    trials = list(Trial.objects.filter(run=run))
    assert {t.status for t in trials} == {"passed"}, [(t.pk, t.status, t.error_message) for t in trials]
    assert {t.attempt for t in trials} == {1}  # none was taken from its worker and run again
    finished = Counter(
        TrialEvent.objects.filter(trial__run=run, kind="phase", data__phase="finished").values_list(
            "trial_id", flat=True
        )
    )
    assert finished == Counter({t.pk: 1 for t in trials})
    assert not TrialEvent.objects.filter(
        trial__run=run, kind="system", data__text__icontains="stopped renewing"
    )


@pytest.fixture
def database_proxy():
    production_pass()
    proxy = CutProxy(int(connection.settings_dict["PORT"] or 5432))
    yield proxy
    proxy.stop()


@pytest.fixture
def broker_proxy():
    production_pass()
    proxy = CutProxy(6379)
    yield proxy
    proxy.stop()


def test_a_database_outage_is_shown_at_once_ends_within_seconds_and_runs_no_trial_twice(
    tmp_path, database_proxy, member
):
    experiment = small_suite(tmp_path, 4, "sleep 6 && echo done > out.txt", parallel=4, repeats=2)
    env = worker_environment()
    through = {"DATABASE_URL": database_proxy.url(env["DATABASE_URL"])}
    worker = WorkerProcess(tmp_path, concurrency=4, extra_env=through, beat=True).start()
    web = WebProcess(tmp_path, {**env, **through})
    cookie = session_cookie(member)
    try:
        run = launch_run(experiment)
        page = f"/runs/{run.pk}/"
        wait_for(
            lambda: Trial.objects.filter(run=run, status="running").count() == 4,
            timeout=60,
            message=lambda: f"4 trials to run; log:\n{worker.log()[-3000:]}",
        )
        assert web.get(page, cookie)[0] == 200
        stream = StreamReader(web, f"/runs/{run.pk}/stream/", cookie)
        stream.start()
        wait_for(lambda: stream.updates, timeout=10, message="the stream's first update")

        database_proxy.cut()
        started = time.monotonic()
        status, headers, body = web.get(page, cookie)
        shown_after = time.monotonic() - started
        time.sleep(OUTAGE_SECONDS - (time.monotonic() - started))
        during = web.get(page, cookie)
        database_proxy.restore()
        restored = time.monotonic()
        wait_for(
            lambda: web.get(page, cookie)[0] == 200, timeout=30, interval=0.2, message="pages to come back"
        )
        back_after = time.monotonic() - restored
        run = wait_for_run(run, timeout=180, worker=worker)
    finally:
        web.stop()
        worker.kill()

    assert status == 503 and "Database unreachable" in body and headers["retry-after"] == "5", body
    print(
        f"database outage: 503 page after {shown_after:.2f} s, pages back {back_after:.2f} s after its return"
    )
    assert shown_after < 2, shown_after  # at once: not after the pool's timeout
    assert during[0] == 503 and "Database unreachable" in during[2]
    assert back_after < 5, back_after
    # The stream rode the outage out: it stayed open and sent the run's end.
    assert stream.status == 200 and any(at > restored for at in stream.updates)
    stream.join(timeout=30)
    assert "Traceback" not in web.log(), web.log()[-3000:]
    # The 4 trials in flight finished their agents during the outage and were reported after it.
    assert_each_trial_ran_once(run)


def test_a_broker_outage_is_bannered_and_delays_but_loses_no_trial(tmp_path, broker_proxy, member):
    experiment = small_suite(tmp_path, 4, "sleep 4 && echo done > out.txt", parallel=2, repeats=2)
    env = worker_environment()
    through = {"CELERY_BROKER_URL": broker_proxy.url(settings.CELERY_BROKER_URL)}
    worker = WorkerProcess(tmp_path, concurrency=2, extra_env=through, beat=True).start()
    web = WebProcess(tmp_path, {**env, **through})
    cookie = session_cookie(member)
    try:
        run = launch_run(experiment)
        page = f"/runs/{run.pk}/"
        wait_for(
            lambda: Trial.objects.filter(run=run, status="running").count() == 2,
            timeout=60,
            message=lambda: f"2 trials to run; log:\n{worker.log()[-3000:]}",
        )
        broker_proxy.cut()
        cut = time.monotonic()
        wait_for(
            lambda: 'data-testid="broker-down"' in web.get(page, cookie)[2],
            timeout=10,
            message="the run page to say the broker is unreachable",
        )
        shown_after = time.monotonic() - cut
        workers_page = web.get("/workers/", cookie)[2]
        # The two trials in flight finish and report without the broker (their worker may run
        # one more each that it reserved: no message needed); the others wait.
        wait_for(
            lambda: Trial.objects.filter(run=run, status="passed").count() >= 2,
            timeout=OUTAGE_SECONDS,
            message=lambda: f"the running trials to report; log:\n{worker.log()[-3000:]}",
        )
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - cut)))
        waiting = Trial.objects.filter(run=run, status="queued").count()
        broker_proxy.restore()
        run = wait_for_run(run, timeout=180, worker=worker)
        after = web.get(page, cookie)[2]
    finally:
        web.stop()
        worker.kill()

    assert shown_after < 10 and 'data-testid="broker-down"' in workers_page
    assert waiting >= 2  # nothing could send them
    assert 'data-testid="broker-down"' not in after
    assert_each_trial_ran_once(run)


def test_the_only_worker_killed_mid_run_is_bannered_and_its_trials_run_once_more(
    tmp_path, member_client, settings, monkeypatch
):
    from django.urls import reverse

    from runs_app.web import fragments

    experiment = small_suite(tmp_path, 2, "sleep 3 && echo done > out.txt", parallel=2, repeats=2)
    fast = {"TRIAL_LEASE_SECONDS": "3", "REAPER_INTERVAL_SECONDS": "1", "WORKER_HEARTBEAT_SECONDS": "2"}
    settings.WORKER_HEARTBEAT_SECONDS = 2  # the pages judge "alive" by the workers' period
    monkeypatch.setattr(fragments, "KEPT_SECONDS", 0)  # each look reads the workers afresh
    monkeypatch.setattr(fragments, "PAGE_STALE_SECONDS", 0)
    first = WorkerProcess(tmp_path, extra_env=fast, beat=True).start()
    run = launch_run(experiment)
    wait_for(
        lambda: Trial.objects.filter(run=run, status="running").count() == 2,
        timeout=60,
        message=lambda: f"2 trials to run; log:\n{first.log()[-3000:]}",
    )
    first.kill()
    page = reverse("run_detail", args=[run.pk])
    wait_for(
        lambda: 'data-testid="no-worker"' in member_client.get(page).content.decode(),
        timeout=30,
        message="the run page to say no worker is there",
    )
    banner = member_client.get(page).content.decode()
    workers_page = member_client.get(reverse("worker_list")).content.decode()
    time.sleep(5)  # leases long expired: still nobody may take them, nobody could run them
    assert Trial.objects.filter(run=run, status="running").count() == 2
    second = WorkerProcess(tmp_path, extra_env=fast, beat=True).start()
    try:
        run = wait_for_run(run, timeout=120, worker=second)
    finally:
        second.kill()

    assert "2 trials counted as running were on a worker that stopped" in banner
    assert 'data-testid="stranded"' in workers_page
    trials = list(Trial.objects.filter(run=run))
    assert {t.status for t in trials} == {"passed"}
    assert sorted(t.attempt for t in trials) == [1, 1, 2, 2]  # the killed worker's two, once more
