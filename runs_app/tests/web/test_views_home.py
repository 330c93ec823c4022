import pytest
from django.urls import reverse

from experiments_app.models import Experiment
from runs_app.models import Run
from runs_app.tests.web.builders import finish_run, launched_run, smoke_experiment

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("name", ["home", "run_list"])
def test_it_sends_anonymous_visitors_to_login(client, name):
    response = client.get(reverse(name))

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_it_lists_running_runs_first_with_their_pass_rate(member_client):
    experiment = smoke_experiment()
    finished = finish_run(launched_run(experiment=experiment), ["passed", "passed", "failed"])
    running = launched_run(experiment=experiment)
    Run.objects.filter(pk=running.pk).update(status=Run.Status.RUNNING)
    older_finished = finish_run(launched_run(experiment=experiment))

    response = member_client.get(reverse("home"))

    runs = list(response.context["runs"])
    assert runs[0].pk == running.pk
    assert {r.pk for r in runs[1:]} == {finished.pk, older_finished.pk}
    # Each variant's rate as the comparison gives it (one decimal, as on every page).
    assert b'<span class="rate">66.7%</span>' in response.content


def test_it_shows_each_experiment_with_its_last_result(member_client):
    experiment = smoke_experiment()
    finish_run(launched_run(experiment=experiment), ["failed"])
    last = finish_run(launched_run(experiment=experiment), ["passed"])
    Experiment.objects.create(slug="never-run")

    response = member_client.get(reverse("home"))

    rows = {e.slug: e for e in response.context["experiments"]}
    assert rows["smoke"].last_run_pk == last.pk
    assert rows["smoke"].last_run_n_passed == 6
    assert rows["never-run"].last_run_pk is None
    assert b"never run" in response.content


def test_it_keeps_the_home_page_query_count_flat(member_client, django_assert_max_num_queries):
    experiment = smoke_experiment()
    for _ in range(4):
        finish_run(launched_run(experiment=experiment))
    for slug in ("a", "b", "c"):
        Experiment.objects.create(slug=slug)
    member_client.get(reverse("home"))

    with django_assert_max_num_queries(5):  # + one aggregate for the per-variant counts
        response = member_client.get(reverse("home"))

    assert len(response.context["runs"]) == 4


def test_it_filters_the_run_list_by_status_and_experiment(member_client):
    experiment = smoke_experiment()
    done = finish_run(launched_run(experiment=experiment))
    waiting = launched_run(experiment=experiment)

    finished = member_client.get(reverse("run_list"), {"status": "finished"})
    by_experiment = member_client.get(reverse("run_list"), {"experiment": "smoke"})
    nothing = member_client.get(reverse("run_list"), {"experiment": "other"})

    assert [r.pk for r in finished.context["page"]] == [done.pk]
    assert {r.pk for r in by_experiment.context["page"]} == {done.pk, waiting.pk}
    assert list(nothing.context["page"]) == []


def test_it_keeps_the_run_list_query_count_flat(member_client, django_assert_max_num_queries):
    experiment = smoke_experiment()
    for _ in range(3):
        launched_run(experiment=experiment)
    member_client.get(reverse("run_list"))

    with django_assert_max_num_queries(5):  # + one aggregate for the per-variant counts
        response = member_client.get(reverse("run_list"))

    assert len(response.context["page"]) == 3


@pytest.mark.django_db
def test_lists_show_each_variants_pass_rate_not_one_pooled_over_variants(member_client):
    from runs_app.tests.web.builders import finish_run, launched_run

    run = finish_run(launched_run(), ["passed", "failed", "passed"])
    expected = {
        slug: f"{100 * sum(s == 'passed' for s in statuses) / len(statuses):.1f}%"
        for slug, statuses in _statuses_by_variant(run).items()
    }

    for url in (reverse("home"), reverse("run_list")):
        page = member_client.get(url).content.decode()
        for slug, rate in expected.items():
            assert f'<span class="muted small">{slug}</span> <span class="rate">{rate}</span>' in page


def _statuses_by_variant(run) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for slug, status in run.trials.values_list("variant__slug", "status"):
        found.setdefault(slug, []).append(status)
    return found
