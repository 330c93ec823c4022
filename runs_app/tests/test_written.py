"""The hot path's written-out statements store what the ORM would (runs_app.written)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs_app import written
from runs_app.models import Trial, TrialEvent
from runs_app.tests.factories import launched_smoke_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def trial(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks():  # no broker message: nothing runs these trials
        return launched_smoke_run().trials.order_by("pk").first()


def test_an_update_stores_datetimes_json_text_and_numbers_as_the_orm_reads_them(trial):
    finished = timezone.now() + timedelta(seconds=3)
    values = {
        "status": Trial.Status.FAILED,
        "finished_at": finished,
        "lease_expires_at": None,
        "score": 0.25,
        "input_tokens": 12,
        "role_usage": {"judge": {"cost_usd": 0.5, "note": "ünïcode \u2713"}},
        "trajectory": [{"tool": "ls", "args": {"path": "."}}],
        "agent_stdout": "line 1\nline 2 'quoted' %s %(x)s",
        "timed_out": True,
    }

    assert written.update(Trial, values, "id = %s AND status = %s", [trial.pk, Trial.Status.RUNNING]) == 0
    assert written.update(Trial, values, "id = %s AND status = %s", [trial.pk, Trial.Status.QUEUED]) == 1

    trial.refresh_from_db()
    for name, value in values.items():
        assert getattr(trial, name) == value, name


def test_an_insert_stores_every_row_across_statements(trial):
    at = timezone.now()
    events = [
        TrialEvent(trial_id=trial.pk, seq=seq, at=at + timedelta(microseconds=seq), kind="output",
                   data={"text": f"line {seq} \u2713", "n": seq})
        for seq in range(1, 1202)  # more than two statements' worth
    ]  # fmt: skip

    written.insert(TrialEvent, events, ("trial", "seq", "at", "kind", "data"))

    stored = list(TrialEvent.objects.filter(trial=trial).order_by("seq").values_list("seq", "at", "data"))
    assert stored == [(e.seq, e.at, e.data) for e in events]


def test_a_fetch_reads_what_the_orm_reads_and_defers_the_fields_it_was_not_asked_for(trial):
    values = {"status": Trial.Status.RUNNING, "started_at": timezone.now(), "role_usage": {"judge": {"n": 1}}}
    Trial.objects.filter(pk=trial.pk).update(**values)
    expected = Trial.objects.get(pk=trial.pk)

    (fetched,) = written.fetch(Trial, "id = %s", [trial.pk])
    (partial,) = written.fetch(Trial, "id = %s", [trial.pk], ("id", "run", "status"), lock=True)

    assert {f.attname: getattr(fetched, f.attname) for f in Trial._meta.concrete_fields} == {
        f.attname: getattr(expected, f.attname) for f in Trial._meta.concrete_fields
    }
    assert fetched._state.adding is False and fetched._state.db == "default"
    assert (partial.run_id, partial.status) == (trial.run_id, Trial.Status.RUNNING)
    assert partial.get_deferred_fields() >= {"config", "role_usage", "started_at"}
    assert partial.role_usage == {"judge": {"n": 1}}  # a deferred field is read on access
    assert written.fetch(Trial, "id = %s", [-1]) == []
