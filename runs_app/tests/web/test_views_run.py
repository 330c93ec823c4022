import re

import pytest
from django.test import Client
from django.urls import reverse
from django.utils.timezone import now as timezone_now

from runs_app.analysis import rollup
from runs_app.engine import runner
from runs_app.models import Run, Trial
from runs_app.tests.web.builders import finish_run, finish_trial, launched_run

pytestmark = pytest.mark.django_db


def _url(name: str, run: Run) -> str:
    return reverse(name, args=[run.pk])


@pytest.mark.parametrize("name", ["run_detail", "run_stream", "run_progress"])
def test_it_sends_anonymous_visitors_to_login(client, name):
    run = launched_run()

    response = client.get(_url(name, run))

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("name", ["run_cancel", "run_retry", "run_resume", "run_rerun", "run_any_version"])
def test_it_does_not_let_anonymous_visitors_act_on_a_run(client, name):
    run = launched_run()

    response = client.post(_url(name, run))

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))
    assert Run.objects.count() == 1
    assert Run.objects.get().status == Run.Status.QUEUED


@pytest.mark.parametrize("name", ["run_cancel", "run_retry", "run_resume", "run_rerun", "run_any_version"])
def test_it_refuses_get_on_run_actions(member_client, name):
    run = launched_run()

    assert member_client.get(_url(name, run)).status_code == 405


def test_it_shows_progress_counts_variants_and_trials(member_client):
    run = launched_run()
    trials = list(run.trials.order_by("pk"))
    finish_trial(trials[0], "passed", input_tokens=1200, cost_usd=0.25)
    finish_trial(trials[1], "failed")
    finish_trial(trials[2], "error", error_category="agent_crash")
    rollup.recount(run)

    response = member_client.get(_url("run_detail", run))

    assert response.status_code == 200
    body = response.content.decode()
    assert 'data-testid="percent">50%' in body
    assert 'data-count="passed">1<' in body
    assert 'data-count="error">1<' in body
    assert 'data-count="queued">3<' in body
    assert 'data-variant="reference"' in body and 'data-variant="no-op"' in body
    assert body.count('<tr data-status="') == 6
    assert "agent_crash" in body
    # While the run is open the page holds one stream and polls only as a fallback.
    assert f'sse-connect="{_url("run_stream", run)}"' in body
    assert 'hx-trigger="every 2s" data-poll-unless-streaming' in body


def test_it_shows_each_variants_pass_rate_with_the_comparisons_interval(member_client):
    run = finish_run(launched_run(), ["passed", "passed", "failed"])

    response = member_client.get(_url("run_detail", run))

    rows = {row.variant.slug: row for row in response.context["variant_rows"]}
    assert sum(row.total for row in rows.values()) == 6
    reference = rows["reference"]
    decided = reference.passed + reference.failed
    assert reference.pass_rate == pytest.approx(reference.passed / decided)
    from runs_app.analysis.load import compare_runs

    arm = next(arm for arm in compare_runs([run]).arms if arm.variant_slug == "reference")
    assert reference.interval == (arm.low, arm.high)
    assert rows["no-op"].is_baseline  # smoke.yaml names no-op its baseline


def test_it_counts_errors_apart_from_fails_in_the_pass_rate(member_client):
    run = finish_run(launched_run(), ["passed", "error"])

    response = member_client.get(_url("run_detail", run))

    for row in response.context["variant_rows"]:
        assert row.failed == 0
        assert row.pass_rate in (1.0, None)


def test_it_filters_trials_by_variant_task_and_outcome(member_client):
    run = finish_run(launched_run(), ["passed", "failed"])

    by_variant = member_client.get(_url("run_detail", run), {"variant": "reference"})
    by_task = member_client.get(_url("run_detail", run), {"task": "slug"})
    by_outcome = member_client.get(_url("run_detail", run), {"status": "failed"})

    assert {t.variant.slug for t in by_variant.context["trials"]} == {"reference"}
    assert len(by_variant.context["trials"]) == 3
    assert all("slug" in t.task_version.task.slug for t in by_task.context["trials"])
    assert 0 < len(by_task.context["trials"]) < 6
    assert {t.status for t in by_outcome.context["trials"]} == {"failed"}


def test_it_ignores_filters_that_are_not_valid(member_client):
    run = launched_run()

    response = member_client.get(_url("run_detail", run), {"status": "<script>", "page": "-3"})

    assert response.status_code == 200
    assert len(response.context["trials"]) == 6
    assert b"<script>" not in response.content


def test_it_pages_the_trial_table(member_client, monkeypatch):
    monkeypatch.setattr("runs_app.web.fragments.RUN_TRIAL_ROWS", 4)
    run = launched_run()

    first = member_client.get(_url("run_detail", run))
    second = member_client.get(_url("run_detail", run), {"page": 2})

    assert len(first.context["trials"]) == 4 and first.context["has_more"]
    assert len(second.context["trials"]) == 2 and not second.context["has_more"]
    assert not {t.pk for t in first.context["trials"]} & {t.pk for t in second.context["trials"]}
    # The pager speaks of the order shown: launch order has no "older".
    assert "later →" in first.content.decode() and "← earlier" in second.content.decode()
    assert "older →" not in first.content.decode()
    by_finish = member_client.get(_url("run_detail", run), {"sort": "finished"}).content.decode()
    assert "older →" in by_finish


def test_it_shows_a_finished_run_without_stream_or_polling(member_client):
    run = finish_run(launched_run())

    body = member_client.get(_url("run_detail", run)).content.decode()

    assert "sse-connect" not in body
    assert "every 2s" not in body
    assert 'data-testid="percent">100%' in body


def test_it_keeps_the_run_page_query_count_flat(member_client, django_assert_max_num_queries):
    run = finish_run(launched_run())
    member_client.get(_url("run_detail", run))  # warm the session and user

    # Session, user, run and the page's reads; none of them grows with the trials.
    with django_assert_max_num_queries(9):
        response = member_client.get(_url("run_detail", run))

    assert response.status_code == 200


def test_it_returns_the_fragments_and_keeps_polling_while_the_run_is_open(member_client):
    run = launched_run()

    response = member_client.get(_url("run_progress", run), HTTP_HX_REQUEST="true")

    assert response.status_code == 200
    body = response.content.decode()
    assert body.count('hx-swap-oob="true"') == 3
    assert 'id="run-progress"' in body and 'id="run-trials"' in body


def test_it_stops_polling_with_286_once_the_run_has_ended(member_client):
    run = finish_run(launched_run())

    response = member_client.get(_url("run_progress", run), HTTP_HX_REQUEST="true")

    assert response.status_code == 286
    assert b'data-testid="percent">100%' in response.content


def test_it_lets_a_member_cancel_a_run_they_started(member_client, member):
    run = launched_run(user=member)

    response = member_client.post(_url("run_cancel", run), follow=True)

    run.refresh_from_db()
    assert run.cancel_requested
    assert run.status == Run.Status.CANCELLED
    assert run.n_cancelled == 6
    assert b"Cancelled run" in response.content


def test_it_refuses_to_cancel_or_retry_someone_elses_run(member_client, outsider, admin_user):
    run = finish_run(launched_run(user=outsider), ["passed", "error"])

    for name in ("run_cancel", "run_retry", "run_resume", "run_any_version"):
        assert member_client.post(_url(name, run)).status_code == 403
    assert Trial.objects.filter(run=run, attempt=2).count() == 0

    staff = Client()
    staff.force_login(admin_user)
    assert staff.post(_url("run_retry", run)).status_code == 302  # staff may
    assert Trial.objects.filter(run=run, attempt=2).count() == 3


def test_it_retries_errored_trials_as_new_attempts(member_client, member):
    run = finish_run(launched_run(user=member), ["passed", "error"])

    response = member_client.post(_url("run_retry", run), follow=True)

    assert b"Retrying 3 errored trials" in response.content
    assert Trial.objects.filter(run=run, is_latest=True, status="queued", attempt=2).count() == 3
    assert Trial.objects.filter(run=run, is_latest=False, status="error").count() == 3


def test_it_reruns_the_same_tasks_as_a_new_run(member_client, member):
    run = finish_run(launched_run())

    response = member_client.post(_url("run_rerun", run))

    new = Run.objects.exclude(pk=run.pk).get()
    assert response.status_code == 302
    assert response["Location"] == new.get_absolute_url()
    assert new.n_trials == run.n_trials
    assert new.started_by == member
    assert sorted(new.config["tasks"]) == sorted(run.config["tasks"])
    assert new.sample_seed == run.sample_seed


@pytest.mark.django_db
def test_it_groups_errors_by_cause_with_counts_and_a_link_to_those_trials(member_client):
    run = launched_run()
    trials = list(run.trials.order_by("pk"))
    for trial in trials[:3]:
        finish_trial(
            trial, "error", error_category="setup", error_message="codex needs the API key OPENAI_API_KEY"
        )
    finish_trial(trials[3], "error", error_category="grader", error_message="criterion 1 (run_command): boom")
    rollup.recount(run)

    page = member_client.get(reverse("run_detail", args=[run.pk])).content.decode()
    filtered = member_client.get(
        reverse("run_detail", args=[run.pk]), {"status": "error", "category": "grader"}
    )

    digest = page.split('data-testid="error-digest"')[1].split("</ul>")[0]
    assert digest.index("<strong>3</strong> × setup") < digest.index("<strong>1</strong> × grader")
    assert "needs the API key OPENAI_API_KEY" in digest and "?status=error&amp;category=setup" in digest
    assert filtered.context["trials"] == [trials[3]]


@pytest.mark.django_db
def test_it_says_when_no_worker_is_there_to_run_queued_trials(member_client, monkeypatch):
    from datetime import timedelta

    from django.utils import timezone

    from runs_app.models import Worker
    from runs_app.web import fragments

    monkeypatch.setattr(fragments, "KEPT_SECONDS", 0)  # each look below reads the workers afresh
    monkeypatch.setattr(fragments, "PAGE_STALE_SECONDS", 0)
    run = launched_run()
    url = reverse("run_detail", args=[run.pk])
    assert 'data-testid="no-worker"' in member_client.get(url).content.decode()

    Worker.objects.create(name="celery@host-a", last_seen_at=timezone.now() - timedelta(minutes=5))
    stale = member_client.get(url).content.decode()
    assert 'data-testid="no-worker"' in stale and "since 5" in stale

    Worker.objects.filter(name="celery@host-a").update(last_seen_at=timezone.now(), code_version="0ld")
    elsewhere = member_client.get(url).content.decode()
    assert 'data-testid="no-worker"' in elsewhere and f"code version ({run.code_version})" in elsewhere
    assert "they run 0ld on" in elsewhere

    assert reverse("run_any_version", args=[run.pk]) in elsewhere

    Worker.objects.filter(name="celery@host-a").update(code_version=run.code_version, hostname="host-a")
    alive = member_client.get(url).content.decode()
    assert 'data-testid="no-worker"' not in alive and "celery@host-a (0 running)" in alive


@pytest.mark.django_db
def test_a_run_whose_only_worker_died_mid_run_says_so_while_its_trials_count_as_running(member_client):
    from datetime import timedelta

    from django.utils import timezone

    from runs_app.models import Trial, Worker

    run = launched_run()
    now = timezone.now()
    Worker.objects.create(name="celery@host-a", last_seen_at=now - timedelta(minutes=2))
    for trial in run.trials.order_by("pk")[:2]:
        assert runner.claim(trial.pk, "celery@host-a:41")
    Trial.objects.filter(run=run, status="running").update(lease_expires_at=now - timedelta(seconds=90))

    page = member_client.get(reverse("run_detail", args=[run.pk])).content.decode()
    workers = member_client.get(reverse("worker_list")).content.decode()

    assert 'data-testid="no-worker"' in page and "since 2" in page
    assert "2 trials counted as running were on a worker that stopped" in page
    assert 'data-testid="stranded"' in workers and "celery@host-a stopped renewing the leases of 2" in workers


@pytest.mark.django_db
def test_a_run_with_a_live_worker_says_which_trials_lost_theirs(member_client):
    from datetime import timedelta

    from django.utils import timezone

    from runs_app.models import Trial, Worker

    run = launched_run()
    now = timezone.now()
    Worker.objects.create(name="celery@host-b", code_version=run.code_version, last_seen_at=now)
    trial = run.trials.order_by("pk").first()
    assert runner.claim(trial.pk, "celery@host-a:41")
    Trial.objects.filter(pk=trial.pk).update(lease_expires_at=now - timedelta(seconds=5))

    page = member_client.get(reverse("run_detail", args=[run.pk])).content.decode()

    assert 'data-testid="no-worker"' not in page
    assert "1 running trial lost its worker" in page


@pytest.mark.django_db
def test_the_run_and_workers_pages_say_when_the_broker_cannot_be_reached(member_client, monkeypatch):
    import socket

    from celery import current_app
    from kombu import Connection

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(
        current_app, "connection_for_write", lambda **kw: Connection(f"redis://127.0.0.1:{port}/0", **kw)
    )
    run = launched_run()

    page = member_client.get(reverse("run_detail", args=[run.pk])).content.decode()
    workers = member_client.get(reverse("worker_list")).content.decode()

    assert 'data-testid="broker-down"' in page and f"127.0.0.1:{port}/0" in page
    assert "Connection refused" in page and "Nothing is lost" in page
    assert 'data-testid="broker-down"' in workers


@pytest.mark.django_db
def test_the_workers_page_shows_hosts_slots_versions_and_what_runs_where(member_client):
    from django.utils import timezone

    from runs_app.models import Trial, Worker

    run = launched_run()
    Worker.objects.create(
        name="w1@host-a", hostname="host-a", slots=64, code_version=run.code_version,
        last_seen_at=timezone.now(), agent_versions={"claude-code": "2.1.3 (Claude Code)"},
    )  # fmt: skip
    first, second = run.trials.order_by("pk")[:2]
    for trial in (first, second):
        Trial.objects.filter(pk=trial.pk).update(status="running", lease_owner="w1@host-a:77", host="host-a")
    page = member_client.get(reverse("worker_list")).content.decode()
    assert "host-a" in page and "w1@host-a" in page and ">64<" in page and run.code_version in page
    assert "claude-code: 2.1.3 (Claude Code)" in page
    assert f'href="{reverse("run_detail", args=[run.pk])}">#{run.pk}</a></td><td class="num">2<' in page
    run_page = member_client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert "this run on host-a (2)" in run_page


@pytest.mark.django_db
def test_a_cancelled_run_says_how_many_ran_and_can_be_resumed(member_client, member):
    from runs_app import control

    run = launched_run(user=member)
    finish_trial(run.trials.order_by("pk").first(), "passed")
    control.cancel_run(run, member)
    url = reverse("run_detail", args=[run.pk])

    page = member_client.get(url).content.decode()
    assert "1 of 6 trials ran, 5 cancelled" in page and "Resume 5 cancelled" in page
    # Each variant says what ran of it, not "done" counting the cancelled ones.
    ran = [(int(n), int(total)) for n, total in re.findall(r'data-testid="ran">(\d+)/(\d+)', page)]
    assert sum(n for n, _ in ran) == 1 and sum(total for _, total in ran) == 6, ran
    assert page.count(" cancelled</div>") == len(ran)

    response = member_client.post(reverse("run_resume", args=[run.pk]))

    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == "running" and run.n_queued == 5 and run.n_passed == 1


@pytest.mark.django_db
def test_without_javascript_a_running_runs_page_reloads_itself_and_a_finished_one_does_not(member_client):
    running = launched_run()
    finished = finish_run(launched_run())

    open_page = member_client.get(reverse("run_detail", args=[running.pk])).content.decode()
    done_page = member_client.get(reverse("run_detail", args=[finished.pk])).content.decode()

    assert '<noscript><meta http-equiv="refresh" content="10"></noscript>' in open_page
    assert 'http-equiv="refresh"' not in done_page


@pytest.mark.django_db
def test_the_trial_table_keeps_launch_order_while_trials_finish_and_sorts_on_request(member_client):
    from datetime import timedelta

    from django.utils import timezone

    run = launched_run()
    trials = list(run.trials.order_by("pk"))
    finish_trial(trials[3], "passed", finished_at=timezone.now(), duration_seconds=9.0)
    finish_trial(trials[1], "failed", finished_at=timezone.now() - timedelta(minutes=1), duration_seconds=2.0)
    url = reverse("run_detail", args=[run.pk])

    def order(**query) -> list[int]:
        return [t.pk for t in member_client.get(url, query).context["trials"]]

    assert order() == [t.pk for t in trials]  # finishing moves nothing
    assert order(sort="finished")[:2] == [trials[3].pk, trials[1].pk]
    assert order(sort="slowest")[:2] == [trials[3].pk, trials[1].pk]


@pytest.mark.django_db
def test_a_run_whose_code_version_has_no_worker_left_may_be_opened_to_any(member_client, member):
    run = launched_run(user=member)
    run.trials.update(dispatched_at=timezone_now())  # sent to its version's queue already
    finish_trial(run.trials.order_by("pk").first(), "passed")

    response = member_client.post(reverse("run_any_version", args=[run.pk]), follow=True)

    run.refresh_from_db()
    assert run.any_code_version and b"may now run its 5 waiting trials" in response.content
    # Sent again, to the shared queue: dispatch marked them (max_parallel of them) anew.
    assert run.trials.filter(status="queued", dispatched_at__isnull=False).count() == min(5, run.max_parallel)


def test_a_running_run_shows_its_anytime_valid_intervals_and_what_they_decide(member_client):
    from runs_app.tests.analysis.test_comparison import make_experiment, make_run

    outcomes = {f"t{i:02d}": {"base": "FF", "new": "PP"} for i in range(12)}
    outcomes["t99"] = {"base": "QQ", "new": "RQ"}  # still going: not in the sequence yet
    run = make_run(make_experiment(), outcomes, baseline="base", status=Run.Status.RUNNING)

    response = member_client.get(_url("run_detail", run))

    rows = {row.variant.slug: row for row in response.context["variant_rows"]}
    assert rows["new"].arm.cs_units == 12 and rows["new"].versus.decided == "better"
    low, high = rows["new"].sequence
    assert low < rows["new"].interval[0] and 0 < low < high == 1.0
    body = response.content.decode()
    assert body.count('data-testid="anytime"') == 2
    assert 'data-decided="better"' in body and "decided: better" in body
    assert f"Δ {100 * rows['new'].versus.cs_low:+.1f} to +100.0 pp" in body


def test_an_undecided_run_says_so(member_client):
    run = finish_run(launched_run(), ["passed", "failed", "passed"])
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, finished_at=None)

    body = member_client.get(_url("run_detail", run)).content.decode()

    assert 'data-decided=""' in body and "undecided" in body
