"""An experiment's history page: each variant's figures run after run, the last good run, and
its schedules (made, run now, paused, deleted by their author)."""

from datetime import timedelta

import plotly.graph_objects as go
import pytest
from django.urls import reverse
from django.utils import timezone

from runs_app.analysis.load import comparison
from runs_app.models import Run, Schedule
from runs_app.tests.web.builders import finish_run, launched_run, smoke_experiment

pytestmark = pytest.mark.django_db


@pytest.fixture
def three_runs(member):
    experiment = smoke_experiment()
    runs = []
    for statuses in (["passed"], ["passed", "failed"], ["failed"]):
        runs.append(finish_run(launched_run(member, experiment), statuses))
    Run.objects.filter(pk=runs[2].pk).update(
        gates_passed=False, gate_results=[{"name": "g", "passed": False}]
    )
    for run in runs:
        run.refresh_from_db()
    return runs


def test_it_needs_a_sign_in(client):
    smoke_experiment()

    response = client.get(reverse("experiment_history", args=["smoke"]))

    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_it_shows_each_variants_figures_run_after_run_as_the_comparison_gives_them(member_client, three_runs):
    response = member_client.get(reverse("experiment_history", args=["smoke"]))

    assert response.status_code == 200
    variants = response.context["variants"]
    assert list(variants) == ["reference", "no-op"]
    rows = variants["reference"]
    assert [row["run"].pk for row in rows] == [run.pk for run in reversed(three_runs)]  # newest first
    for row in rows:
        arm = comparison([row["run"]]).arm("reference")
        assert (row["arm"].pass_rate, row["arm"].low, row["arm"].high) == (arm.pass_rate, arm.low, arm.high)
        assert row["arm"].cost_per_pass == arm.cost_per_pass and row["arm"].tokens == arm.tokens
    page = response.content.decode()
    assert 'data-testid="history-reference"' in page and "gates failed" in page
    figure = response.context["chart"]["figure"]
    assert figure["data"][0]["x"] == [f"#{run.pk}" for run in three_runs]
    go.Figure(figure)  # raises on any invalid property


def test_it_compares_a_run_with_the_last_good_one_before_it(member_client, three_runs):
    first, second, third = three_runs

    response = member_client.get(reverse("experiment_history", args=["smoke"]))

    assert response.context["last_good"] == second  # the third's gates failed: not good
    compare = reverse("experiment_compare", args=["smoke"])
    assert f'href="{compare}?runs={second.pk},{third.pk}"' in response.content.decode()
    newest_first = response.context["variants"]["reference"]
    assert [row["last_good"] for row in newest_first] == [second, first, None]
    run_page = member_client.get(reverse("run_detail", args=[third.pk])).content.decode()
    assert f"Compare with the last good run (#{second.pk})" in run_page


def test_it_makes_a_schedule_and_says_when_it_runs(member_client, member):
    smoke_experiment()

    response = member_client.post(
        reverse("schedule_create", args=["smoke"]),
        {"cron": "0  3 * * *", "alert_on": "failure", "emails": "a@example.com, b@example.com",
         "webhook_url": "", "overrides": "repeats=2\n"},
        follow=True,
    )  # fmt: skip

    schedule = Schedule.objects.get()
    assert (schedule.cron, schedule.emails, schedule.overrides) == (
        "0 3 * * *", ["a@example.com", "b@example.com"], ["repeats=2"],
    )  # fmt: skip
    assert schedule.created_by == member and schedule.next_run_at.hour == 3
    assert "Scheduled: the next run starts at" in response.content.decode()


@pytest.mark.parametrize(
    "fields, field, problem",
    [
        ({"cron": "every night"}, "cron", "expected 5 fields"),
        ({"cron": "0 25 * * *"}, "cron", "25"),
        ({"emails": "not-an-address"}, "emails", "Enter a valid email address"),
        ({"emails": ""}, "__all__", "Say where its alerts go"),
        ({"overrides": "repeatz=2"}, "overrides", "repeatz"),
        ({"webhook_url": "ftp://x"}, "webhook_url", "Enter a valid URL"),
        ({"webhook_url": "http://10.0.0.5/probe"}, "webhook_url", "Only staff may set a webhook"),
    ],
)
def test_it_refuses_a_bad_schedule_saying_why(member_client, fields, field, problem):
    smoke_experiment()
    data = {"cron": "0 3 * * *", "alert_on": "failure", "emails": "a@example.com", "overrides": "", **fields}

    response = member_client.post(reverse("schedule_create", args=["smoke"]), data)

    assert response.status_code == 400 and not Schedule.objects.exists()
    assert any(problem in error for error in response.context["form"].errors[field])


def test_only_its_author_or_staff_change_a_schedule(client, member, outsider, admin_user):
    schedule = Schedule.objects.create(
        experiment=smoke_experiment(), cron="0 3 * * *", emails=["a@example.com"], created_by=member,
        next_run_at=timezone.now() + timedelta(hours=5),
    )  # fmt: skip
    url = lambda action: reverse("schedule_action", args=[schedule.pk, action])  # noqa: E731

    client.force_login(outsider)
    assert client.post(url("delete")).status_code == 403

    client.force_login(member)
    client.post(url("pause"))
    schedule.refresh_from_db()
    assert not schedule.enabled
    client.post(url("run-now"))
    schedule.refresh_from_db()
    assert schedule.enabled and schedule.next_run_at <= timezone.now()

    client.force_login(admin_user)
    client.post(url("delete"))
    assert not Schedule.objects.exists()


def test_a_webhooks_secret_path_is_never_shown(member_client, member):
    Schedule.objects.create(
        experiment=smoke_experiment(), cron="@nightly", created_by=member,
        webhook_url="https://hooks.example.com/services/T000/B000/s3cr3t", next_run_at=timezone.now(),
    )  # fmt: skip

    page = member_client.get(reverse("experiment_history", args=["smoke"])).content.decode()

    assert "https://hooks.example.com/…" in page and "s3cr3t" not in page
