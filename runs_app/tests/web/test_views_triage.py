"""Failure triage: a unit across variants (where trajectories part), failures grouped by
criterion and error, labels and notes (who, when), quarantining a broken task from every
comparison, said on every page that leaves it out."""

import json

import pytest
from django.urls import reverse
from django.utils import timezone

from experiments_app.models import Quarantine, Task
from runs_app import triage
from runs_app.analysis import load, reports, rollup
from runs_app.analysis.load import comparison
from runs_app.analysis.stats import records
from runs_app.analysis.triage import first_divergence
from runs_app.models import CriterionResult, Run, Trial, TrialEvent, TrialNote
from runs_app.tests.web.builders import finish_run, launched_run
from runs_app.tokens import create_token

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "sequences, expected",
    [
        ([["a", "b"], ["a", "b"]], None),
        ([["a", "b"], ["a", "c"]], 1),
        ([["a"], ["a", "b"]], 1),  # one stops: that is where they part
        ([["x"], ["a"], ["a"]], 0),
        ([["a", "b"]], None),  # nothing to compare with
        ([[], []], None),
    ],
)
def test_it_finds_where_trajectories_part(sequences, expected):
    assert first_divergence(sequences) == expected


def _call(trial: Trial, seq: int, name: str, command: str) -> None:
    TrialEvent.objects.create(
        trial=trial, seq=seq, at=timezone.now(), kind=TrialEvent.Kind.TOOL_CALL,
        data={"id": f"c{seq}", "name": name, "input": {"command": command}},
    )  # fmt: skip


def _criterion(trial: Trial, index: int, kind: str, passed: bool, description: str = "") -> None:
    CriterionResult.objects.create(
        trial=trial, index=index, type=kind, description=description, score=float(passed), passed=passed
    )


@pytest.fixture
def run(member):
    """The smoke run (3 tasks × reference, no-op): reference passes, no-op fails `file_exists`;
    on each task the two ran the same first tool call, then different ones."""
    run = launched_run(member)
    for trial in run.trials.select_related("variant"):
        reference = trial.variant.slug == "reference"
        _criterion(trial, 0, "file_exists", reference, "the fix is in place")
        _call(trial, 1, "Bash", "ls")
        _call(trial, 2, "Read" if reference else "Bash", "slugify.py" if reference else "true")
    run = finish_run(run, ["passed"])
    Trial.objects.filter(run=run, variant__slug="no-op").update(status="failed", score=0.0)
    rollup.recount(run)
    run.refresh_from_db()
    return run


def test_a_unit_shows_each_variants_trial_side_by_side_and_where_they_part(member_client, run):
    response = member_client.get(reverse("unit_view", args=[run.pk, "slugify"]))

    assert response.status_code == 200
    columns = response.context["columns"]
    assert [column.variant.slug for column in columns] == ["reference", "no-op"]
    assert response.context["divergence"] == 1
    assert columns[0].steps[1].startswith("Read ") and columns[1].steps[1].startswith("Bash ")
    assert [result.passed for result in columns[1].criteria] == [False]
    page = response.content.decode()
    assert "agree for 1 tool call, then part at call 2" in page
    assert page.count('data-testid="diverges"') == 2


def test_a_unit_the_run_lacks_is_a_404(member_client, run):
    assert member_client.get(reverse("unit_view", args=[run.pk, "nope"])).status_code == 404


def test_failures_are_grouped_by_failing_criterion_and_error_with_their_labels(member_client, member, run):
    errored = run.trials.filter(variant__slug="reference").first()
    Trial.objects.filter(pk=errored.pk).update(status="error", error_category="setup", error_message="no key")
    failed = run.trials.filter(variant__slug="no-op").first()
    triage.add_note(failed, member, "grader bug", "the file is there, under another name")

    response = member_client.get(reverse("run_failures", args=[run.pk]))

    [criterion] = response.context["criterion_groups"]
    assert (criterion.title, criterion.count, criterion.by_variant) == ("#0 file_exists", 3, {"no-op": 3})
    assert criterion.labels == [("grader bug", 1)]
    [error] = response.context["error_groups"]
    assert (error.title, error.detail, error.count, error.by_variant) == (
        "setup",
        "no key",
        1,
        {"reference": 1},
    )
    page = response.content.decode()
    assert "grader bug ×1" in page and reverse("unit_view", args=[run.pk, "slugify"]) in page


def test_a_member_labels_and_notes_a_trial_and_only_its_author_or_staff_delete_it(
    client, member, outsider, run
):
    trial = run.trials.first()
    url = reverse("trial_note_create", args=[run.pk, trial.pk])
    back = reverse("unit_view", args=[run.pk, trial.task_version.task.slug])
    client.force_login(member)

    response = client.post(url, {"label": "flaky", "text": "passes on a rerun", "next": back})
    assert response["Location"] == back
    assert client.post(url, {"label": "", "text": "  "}).status_code == 302  # refused, said so
    evil = client.post(url, {"label": "x", "next": "https://evil.example/"})
    assert evil["Location"] == reverse("trial_detail", args=[run.pk, trial.pk])

    note = TrialNote.objects.get(label="flaky")
    assert (note.author, note.text) == (member, "passes on a rerun") and note.created_at
    page = client.get(reverse("trial_detail", args=[run.pk, trial.pk])).content.decode()
    assert "passes on a rerun" in page and "— bob," in page
    client.force_login(outsider)
    assert client.post(reverse("trial_note_delete", args=[note.pk])).status_code == 403
    client.force_login(member)
    client.post(reverse("trial_note_delete", args=[note.pk]))
    assert not TrialNote.objects.filter(label="flaky").exists()


def test_only_staff_quarantine_a_task(member_client, run):
    response = member_client.post(reverse("task_quarantine", args=["slugify"]), {"reason": "broken"})

    assert response.status_code == 403 and not Quarantine.objects.exists()


def test_a_quarantined_task_leaves_every_comparison_and_every_page_says_so(client, admin_user, member, run):
    before = comparison([run])
    assert before.units == 3 and before.arm("reference").trials == 3
    version = Run.objects.get(pk=run.pk).tally_version
    client.force_login(admin_user)

    client.post(reverse("task_quarantine", args=["slugify"]), {"reason": "its reference is wrong"})

    run.refresh_from_db()
    assert run.tally_version == version + 1  # no comparison computed before outlives it
    after = comparison([run])
    assert after.units == 2 and after.arm("reference").trials == 2
    assert "slugify" not in [row.task.slug for row in after.rows] and len(after.rows) == 2
    [entry] = after.quarantined
    assert (entry["task"], entry["reason"], entry["by"]) == ("slugify", "its reference is wrong", "alice")
    assert records.comparison_record(after)["quarantined"] == [entry]
    # The gates read the same numbers.
    assert [fact.passed for fact in load.run_facts(run, []).variants] == [2, 0]
    # Every page that shows the numbers says what they leave out.
    client.force_login(member)
    for url in (
        reverse("run_compare", args=[run.pk]),
        reverse("run_detail", args=[run.pk]),
        reverse("experiment_history", args=["smoke"]),
        reverse("run_failures", args=[run.pk]),
        reverse("task_detail", args=["slugify"]),
        reverse("unit_view", args=[run.pk, "slugify"]),
    ):
        page = client.get(url).content.decode()
        assert 'data-testid="quarantined"' in page and "its reference is wrong" in page, url
    token = create_token(member, "ci")[1]
    api = client.get(f"/api/runs/{run.pk}/comparison", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert api["quarantined"] == [entry] and api["units"] == 2
    report = reports.build_report(Run.objects.get(pk=run.pk))
    assert "Left out of these numbers: slugify (quarantined by alice" in reports.render_markdown(report)
    assert json.loads(reports.render_json(report))["quarantined"] == [entry]

    client.force_login(admin_user)
    client.post(reverse("task_quarantine", args=["slugify"]), {"lift": "1"})
    assert comparison([Run.objects.get(pk=run.pk)]).units == 3
    assert Quarantine.objects.get().lifted_by == admin_user


def test_quarantining_twice_keeps_one_and_a_reason_is_needed(admin_user, run):
    task = Task.objects.get(slug="slugify")
    first = triage.quarantine(task, "broken", admin_user)

    assert triage.quarantine(task, "again", admin_user) == first
    with pytest.raises(ValueError, match="say why"):
        triage.quarantine(Task.objects.get(slug="fix-mean"), "  ", admin_user)
    assert Quarantine.objects.active().count() == 1
