import threading
import time
from unittest import mock

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient
from django.urls import reverse

from runs_app import live
from runs_app.analysis import rollup
from runs_app.models import Run
from runs_app.tests.web.builders import finish_run, finish_trial, launched_run
from runs_app.web import fragments, stream


@pytest.fixture(autouse=True)
def _fast_stream(monkeypatch):
    monkeypatch.setattr(stream, "STREAM_CHECK_SECONDS", 0.01)


def _events(chunks: list[bytes]) -> list[tuple[str, str]]:
    """(event name, data) of every event in a stream."""
    found = []
    for block in b"".join(chunks).decode().split("\n\n"):
        lines = block.splitlines()
        names = [line[len("event: ") :] for line in lines if line.startswith("event: ")]
        if names:
            found.append(
                (names[0], "\n".join(line[len("data: ") :] for line in lines if line.startswith("data: ")))
            )
    return found


@pytest.mark.django_db
def test_it_streams_one_update_and_ends_for_a_finished_run(member_client):
    run = finish_run(launched_run())

    response = member_client.get(reverse("run_stream", args=[run.pk]))

    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache"
    events = _events(list(response.streaming_content))  # ends by itself: the run is final
    assert [name for name, _ in events] == ["update", "done"]
    assert 'data-testid="percent">100%' in events[0][1]
    assert events[0][1].count('hx-swap-oob="true"') == 3


@pytest.mark.django_db
def test_it_sends_updates_while_the_run_changes_and_stops_when_it_ends(member_client):
    run = launched_run()
    response = member_client.get(reverse("run_stream", args=[run.pk]))
    stream = iter(response.streaming_content)

    first = [next(stream), next(stream)]  # the retry hint, then the state at connection time
    finish_trial(run.trials.order_by("pk").first(), "passed")
    rollup.recount(run)
    second = next(stream)
    finish_run(run)
    rest = list(stream)

    assert first[0].startswith(b"retry: ")
    assert 'data-count="passed">0<' in _events(first)[0][1]
    assert 'data-count="passed">1<' in _events([second])[0][1]
    assert [name for name, _ in _events(rest)] == ["update", "done"]


@pytest.mark.django_db
def test_it_sends_nothing_when_the_run_did_not_change():
    run = launched_run()

    html, state = stream.run_stream_update(run.pk, None)
    again, same = stream.run_stream_update(run.pk, state)
    Run.objects.filter(pk=run.pk).update(n_running=1)
    live.hub().changed(f"run:{run.pk}")  # the notice a writer's publish brings
    changed, newer = stream.run_stream_update(run.pk, same)

    assert html and 'id="run-progress"' in html
    assert again is None and same == state and not state.final
    assert changed and newer.n_running == 1


@pytest.mark.django_db
def test_a_stream_sends_only_the_parts_that_changed(monkeypatch):
    monkeypatch.setattr(fragments, "RUN_TRIAL_ROWS", 2)  # the table shows the first two trials
    run = launched_run()
    sent: dict = {}
    first, state = stream.run_stream_update(run.pk, None, sent=sent)

    last = run.trials.order_by("pk").last()  # past the table's page: its rows stay as they were
    finish_trial(last, "passed")
    rollup.recount(run)
    live.hub().changed(f"run:{run.pk}")
    second, state = stream.run_stream_update(run.pk, state, sent=sent)

    finish_trial(run.trials.order_by("pk").first(), "failed")
    rollup.recount(run)
    live.hub().changed(f"run:{run.pk}")
    third, _ = stream.run_stream_update(run.pk, state, sent=sent)

    assert all(f'id="run-{part}"' in first for part in ("progress", "variants", "trials"))
    assert 'id="run-progress"' in second and 'id="run-trials"' not in second
    assert 'id="run-trials"' in third and 'data-status="failed"' in third


@pytest.mark.django_db
def test_it_ends_the_stream_when_the_run_is_deleted():
    run = launched_run()
    run_id = run.pk
    run.trials.all().delete()
    run.delete()

    assert stream.run_stream_update(run_id, None) == (None, None)


def test_it_puts_every_line_of_a_fragment_in_its_own_data_field():
    assert stream.sse_event("update", "<a>\n<b>") == b"event: update\ndata: <a>\ndata: <b>\n\n"
    assert stream.sse_event("done", "") == b"event: done\ndata: \n\n"


@pytest.mark.django_db(transaction=True)
def test_it_serves_the_stream_from_an_async_generator_under_asgi(member):
    run = finish_run(launched_run())

    async def fetch() -> tuple[int, str, bool, list[bytes]]:
        client = AsyncClient()
        await client.aforce_login(member)
        response = await client.get(reverse("run_stream", args=[run.pk]))
        chunks = [chunk async for chunk in response.streaming_content]
        return response.status_code, response["Content-Type"], response.is_async, chunks

    status, content_type, is_async, chunks = async_to_sync(fetch)()

    assert status == 200
    assert content_type == "text/event-stream"
    assert is_async  # an async iterator: uvicorn sends each event as it comes
    assert [name for name, _ in _events(chunks)] == ["update", "done"]


@pytest.mark.django_db(transaction=True)
def test_a_published_change_wakes_the_stream_at_once_not_on_its_next_check(member_client, monkeypatch):
    """Push, not poll: with a check only every 30 s, the update still arrives within a second."""
    import threading
    import time

    from runs_app import control

    monkeypatch.setattr(stream, "STREAM_CHECK_SECONDS", 30.0)
    run = launched_run()
    chunks = iter(member_client.get(reverse("run_stream", args=[run.pk])).streaming_content)
    assert next(chunks).startswith(b"retry: ") and _events([next(chunks)])[0][0] == "update"
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(next(chunks)), daemon=True)
    reader.start()
    time.sleep(0.3)  # the stream is waiting now

    started = time.monotonic()
    finish_trial(run.trials.order_by("pk").first(), "passed")
    control.refresh_run(run.pk)  # recounts and publishes, as a worker does after each trial
    reader.join(timeout=5)

    assert got, "no update within 5 s"
    assert time.monotonic() - started < 1.0
    assert 'data-count="passed">1<' in _events(got)[0][1]


@pytest.mark.django_db(transaction=True)
def test_the_listener_wakes_waiters_of_the_key_that_changed_only():
    import threading
    import time

    from runs_app import live

    hub = live.hub()
    woke: dict[str, bool] = {}
    since = {key: hub.version(key) for key in ("run:901", "run:902")}
    waiters = [
        threading.Thread(target=lambda k=key: woke.__setitem__(k, hub.wait_sync(k, 3, since=since[k])))
        for key in since
    ]
    for thread in waiters:
        thread.start()
    time.sleep(0.3)
    started = time.monotonic()
    live.publish(901)
    waiters[0].join(timeout=5)
    elapsed = time.monotonic() - started
    waiters[1].join(timeout=5)

    assert woke == {"run:901": True, "run:902": False} and elapsed < 1.0


@pytest.mark.django_db(transaction=True)
def test_the_trial_page_streams_its_transcript_while_the_agent_runs(member_client, monkeypatch):
    import threading
    import time

    from django.db import transaction
    from django.utils import timezone

    from runs_app import live
    from runs_app.models import Trial, TrialEvent

    monkeypatch.setattr(stream, "STREAM_CHECK_SECONDS", 30.0)
    run = launched_run()
    trial = run.trials.order_by("pk").first()
    Trial.objects.filter(pk=trial.pk).update(status="running", started_at=timezone.now())
    TrialEvent.objects.create(trial=trial, seq=1, at=timezone.now(), kind="phase", data={"phase": "setup"})
    page = member_client.get(reverse("trial_detail", args=[run.pk, trial.pk])).content.decode()
    assert "?after=1" in page and "new events appear as they happen" in page

    chunks = iter(
        member_client.get(reverse("trial_stream", args=[run.pk, trial.pk]) + "?after=1").streaming_content
    )
    assert next(chunks).startswith(b"retry: ")
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(next(chunks)), daemon=True)
    reader.start()
    time.sleep(0.3)
    started = time.monotonic()
    with transaction.atomic():  # as the worker's recorder writes a batch of events
        TrialEvent.objects.create(
            trial=trial, seq=2, at=timezone.now(), kind="message", data={"text": "<b>hi</b>"}
        )
        live.publish(run.pk, trial.pk)
    reader.join(timeout=5)

    assert got and time.monotonic() - started < 1.0
    [(name, html)] = _events(got)
    assert name == "events" and 'data-seq="2"' in html and 'data-seq="1"' not in html
    assert "&lt;b&gt;hi&lt;/b&gt;" in html and "<b>hi</b>" not in html  # agent text is escaped
    Trial.objects.filter(pk=trial.pk).update(status="passed", finished_at=timezone.now())
    live.publish(run.pk, trial.pk)
    rest = _events(list(chunks))
    assert [name for name, _ in rest] == ["ended", "done"]


@pytest.mark.django_db
def test_the_live_transcript_folds_as_the_page_does_replacing_what_it_showed_before():
    from django.utils import timezone

    from runs_app.models import Trial, TrialEvent

    run = launched_run()
    trial = run.trials.order_by("pk").first()
    Trial.objects.filter(pk=trial.pk).update(status="running", started_at=timezone.now())
    now = timezone.now()

    def event(seq, kind, data):
        TrialEvent.objects.create(trial=trial, seq=seq, at=now, kind=kind, data=data)

    event(1, "tool_call", {"id": "c1", "name": "Bash", "input": {"command": "pytest -q"}})
    event(2, "usage", {"input_tokens": 10, "output_tokens": 1})
    live_stream = stream.TrialStream(trial.pk, after=2)  # the page showed events 1 and 2
    event(3, "tool_result", {"id": "c1", "name": "Bash", "output": "3 passed"})
    event(4, "usage", {"input_tokens": 20, "output_tokens": 2})
    [(name, html)] = _events([live_stream.step()])

    assert name == "events"
    # The call's item is sent again with its output, and the one usage item with the new totals,
    # each replacing the item already shown (same id, out-of-band); no item of their own.
    assert html.count('<li id="event-') == 2 and html.count('hx-swap-oob="true"') == 2
    assert 'id="event-1"' in html and "3 passed" in html and "pytest -q" in html
    assert 'id="event-usage"' in html and 'data-seq="3"' not in html


def test_streams_woken_together_render_a_change_once():
    """Twenty streams of one process asking for the same state at once: one renders, the
    others wait for its result (rendering per stream cost the web tier most of its CPU)."""
    state = fragments.RunState("running", 4, 1, 1, 2, 0, 0, 0)
    calls = []

    def slow_context(run, filters):
        calls.append(run.pk)
        time.sleep(0.05)
        return {"run": run}

    run = mock.Mock(pk=987654)
    with (
        mock.patch.object(fragments, "run_context", slow_context),
        mock.patch.object(fragments.Run.objects, "select_related") as select,
        mock.patch.object(fragments, "render_to_string", lambda name, ctx: f"html of {ctx['run'].pk}"),
    ):
        select.return_value.get.return_value = run
        results = []
        threads = [
            threading.Thread(
                target=lambda: results.append(fragments.live_parts(run.pk, state, {}, oob=True)["trials"])
            )
            for _ in range(20)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)

    assert calls == [run.pk] and results == ["html of 987654"] * 20
