"""The comparison pages and their downloads (runs_app.web.compare)."""

import csv
import io
import json
import re

import pytest
from asgiref.sync import async_to_sync
from django.contrib.staticfiles import finders
from django.test import AsyncClient
from django.urls import reverse

from runs_app.models import Run, Trial
from runs_app.tests.analysis.test_comparison import REPEATS, make_experiment, make_run
from runs_app.web import compare as compare_views

pytestmark = pytest.mark.django_db


@pytest.fixture
def run():
    outcomes = {
        "alpha": {"base": "P", "new": "F"},
        "beta": {"base": "F", "new": "P"},
        "gamma": {"base": "PP", "new": "PE"},
    }
    return make_run(make_experiment(), outcomes, tags={"alpha": ("x",), "gamma": ("x", "y")}, baseline="base")


def compare_url(run: Run, **params) -> str:
    url = reverse("run_compare", args=[run.pk])
    return url + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else "")


def test_it_requires_login(client, run):
    response = client.get(compare_url(run))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    experiment_url = reverse("experiment_compare", args=[run.experiment.slug])
    assert client.get(experiment_url).status_code == 302


def test_it_shows_a_member_the_variants_statistics_and_charts(member_client, run):
    response = member_client.get(compare_url(run))
    assert response.status_code == 200
    page = response.content.decode()
    assert "Compare variants · run #" in page
    comparison = response.context["comparison"]
    assert [arm.key for arm in comparison.arms] == ["base", "new"]
    assert comparison.baseline == "base"
    # Unit-weighted: base alpha 1, beta 0, gamma 2/2 -> 66.7%; new 0, 1, 1/1 with one error apart
    # -> 66.7%, and 50.0% with the error counted as a fail.
    assert "66.7%" in page and "50.0%" in page
    assert "cluster-robust t interval" in page
    assert "/static/plotly/plotly.min.js" in page and "/static/js/compare.js" in page
    for chart in ("chart-pass-rate", "chart-forest", "chart-cost"):
        assert f'id="{chart}"' in page and f'id="{chart}-data"' in page


def test_it_pins_the_comparison_page_query_count(member_client, django_assert_num_queries):
    experiment = make_experiment(variants=("base", "a", "b", "c"))
    outcomes = {f"t{i}": {"base": "PF", "a": "PP", "b": "FE", "c": "PC"} for i in range(12)}
    many = make_run(experiment, outcomes)
    # Session, user, run, grouped trials, criteria, task versions, quarantines, variants: the same
    # for any size.
    with django_assert_num_queries(7):
        response = member_client.get(compare_url(many))
    assert response.status_code == 200
    assert len(response.context["comparison"].rows) == 12


def test_it_takes_the_baseline_from_the_url_and_falls_back_on_a_bad_one(member_client, run):
    response = member_client.get(compare_url(run, baseline="new"))
    assert response.context["comparison"].baseline == "new"
    assert 'value="new" selected' in response.content.decode()
    response = member_client.get(compare_url(run, baseline="missing"))
    assert response.status_code == 200
    assert response.context["comparison"].baseline == "base"
    assert "missing is not one of the available choices" in response.content.decode()


def test_it_filters_by_tag(member_client, run):
    response = member_client.get(compare_url(run, tag="y"))
    rows = response.context["comparison"].rows
    assert [row.task.slug for row in rows] == ["gamma"]
    assert response.context["comparison"].tags == ["y"]


def test_it_links_heat_map_cells_to_their_trials(member_client, run):
    response = member_client.get(compare_url(run))
    rows = {row["task"].slug: row["cells"] for row in response.context["heat_rows"]}
    single = Trial.objects.get(run=run, task_version__task__slug="alpha", variant__slug="base")
    assert rows["alpha"][0]["url"] == reverse("trial_detail", args=[run.pk, single.pk])
    assert rows["alpha"][0]["text"] == "1/1"
    assert rows["gamma"][1]["url"] == f"{reverse('run_detail', args=[run.pk])}?task=gamma&variant=new"
    assert (rows["gamma"][1]["text"], rows["gamma"][1]["errors"]) == ("1/1", 1)
    page = response.content.decode()
    assert f'href="{rows["gamma"][1]["url"].replace("&", "&amp;")}"' in page


def test_it_paginates_the_heat_map_and_serves_its_fragment(member_client, run, monkeypatch):
    monkeypatch.setattr(compare_views, "HEATMAP_ROWS", (1, 2))
    response = member_client.get(compare_url(run, page=2))
    assert [row["task"].slug for row in response.context["heat_rows"]] == ["gamma"]
    assert "tasks 3–3 of 3" in response.content.decode()
    fragment = member_client.get(
        compare_url(run, page=1), headers={"HX-Request": "true", "HX-Target": "heatmap"}
    )
    html = fragment.content.decode()
    assert html.lstrip().startswith('<div id="heatmap">') and "<html" not in html
    assert "HX-Request" in fragment["Vary"]
    assert "alpha" in html and "gamma" not in html.split("</table>")[0]


def test_a_heat_map_page_holds_fewer_tasks_the_more_arms_it_shows(member_client, run, monkeypatch):
    monkeypatch.setattr(compare_views, "HEATMAP_ROWS", (1, 50))
    monkeypatch.setattr(compare_views, "HEATMAP_CELLS", 4)  # two arms: two tasks a page
    response = member_client.get(compare_url(run))
    assert len(response.context["comparison"].arms) == 2
    assert [row["task"].slug for row in response.context["heat_rows"]] == ["alpha", "beta"]


def test_it_lists_changed_and_flaky_tasks_up_to_a_limit(member_client, monkeypatch):
    monkeypatch.setattr(compare_views, "TASK_LIST_LIMIT", 1)
    outcomes = {
        "a": {"base": "FFFFF", "new": "PPPPP"},
        "b": {"base": "FFFFF", "new": "PPPPF"},
        "c": {"base": "PFPFP", "new": "PFPFP"},
        "d": {"base": "FF", "new": "PP"},
    }
    page = member_client.get(compare_url(make_run(make_experiment(), outcomes))).content.decode()
    # Every unit whose rate moved is listed, read against what identical arms would show.
    assert "new: ↑ 3 improved · ↓ 0 regressed" in page
    assert "by chance alone, with identical arms:" in page
    # Largest change first: a and d (0 -> 100%) shown, the rest left to "2 more".
    assert "<li>a <span" in page and "<li>b <span" not in page and "and 2 more" in page
    assert "base: 1 flaky" in page and "new: 2 flaky" in page


def test_it_downloads_the_summary_as_csv_and_json(member_client, run):
    response = member_client.get(compare_url(run, format="csv", table="summary"))
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.pk}-summary.csv"'
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [(row["arm"], row["passed"], row["errors"]) for row in rows] == [
        ("base", "3", "0"),
        ("new", "2", "1"),
    ]
    data = member_client.get(compare_url(run, format="json", table="summary")).json()
    assert data["baseline"] == "base" and data["arms"][1]["paired_units"] == 3


def test_it_streams_the_trials_as_csv_and_json(member_client, run):
    response = member_client.get(compare_url(run, format="csv", table="trials", tag="x"))
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.pk}-trials.csv"'
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert sorted({row["task"] for row in rows}) == ["alpha", "gamma"] and len(rows) == 6
    response = member_client.get(compare_url(run, format="json", table="trials"))
    trials = json.loads(b"".join(response.streaming_content))
    assert len(trials) == 8 and {t["status"] for t in trials} == {"passed", "failed", "error"}


@pytest.mark.django_db(transaction=True)
def test_under_asgi_the_trials_csv_is_streamed_not_read_into_memory_first(member, run):
    async def fetch():
        client = AsyncClient()
        await client.aforce_login(member)
        response = await client.get(compare_url(run, format="csv", table="trials"))
        chunks = [chunk async for chunk in response.streaming_content]
        return response.is_async, chunks

    is_async, chunks = async_to_sync(fetch)()

    assert is_async  # a sync iterator would be read whole before the first byte went out
    rows = list(csv.DictReader(io.StringIO(b"".join(chunks).decode())))
    assert len(rows) == 8 and rows[0]["task"] == "alpha"


def test_it_keeps_formulas_out_of_csv_cells(member_client):
    run = make_run(
        make_experiment(), {"a": {"base": "P"}}, dataset_row_id={("a", "base", 0): "=HYPERLINK(1)"}
    )
    response = member_client.get(compare_url(run, format="csv", table="trials"))
    row = next(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert row["dataset_row_id"] == "'=HYPERLINK(1)"
    assert row["label"] == "a[=HYPERLINK(1)]#0"  # starts with the task: no formula


def test_it_compares_several_runs_of_an_experiment(member_client, django_assert_num_queries):
    experiment = make_experiment()
    old = make_run(experiment, REPEATS, baseline="base")
    new = make_run(experiment, REPEATS, content={"a": "v2"})
    url = reverse("experiment_compare", args=[experiment.slug])
    # Session, user, experiment, the picker's recent runs, runs, grouped trials, criteria, task
    # versions, quarantines, variants.
    with django_assert_num_queries(9):
        response = member_client.get(f"{url}?runs={old.pk},{new.pk}&baseline=new@{old.pk}")
    assert response.status_code == 200
    comparison = response.context["comparison"]
    assert [arm.key for arm in comparison.arms][1:3] == [f"new@{old.pk}", f"base@{new.pk}"]
    assert comparison.baseline == f"new@{old.pk}"
    assert "Task changed between run" in response.content.decode()
    # Without ?runs=: the latest two runs, oldest first, ticked in the picker.
    default = member_client.get(url)
    assert [run.pk for run in default.context["runs"]] == [old.pk, new.pk]
    ticked = re.findall(r'name="pick" value="(\d+)"[^>]*checked', default.content.decode())
    assert sorted(map(int, ticked)) == [old.pk, new.pk]
    typed = member_client.get(f"{url}?runs={old.pk}").content.decode()
    assert re.findall(r'name="pick" value="(\d+)"[^>]*checked', typed) == [str(old.pk)]
    # Ticked in the picker, the same as typed.
    picked = member_client.get(f"{url}?pick={new.pk}&pick={old.pk}")
    assert [run.pk for run in picked.context["runs"]] == [old.pk, new.pk]
    assert f'name="pick" value="{old.pk}"' in picked.content.decode()


def test_it_refuses_runs_of_another_experiment(member_client, run):
    other = make_run(make_experiment(slug="other"), {"a": {"base": "P"}})
    url = reverse("experiment_compare", args=["other"])
    response = member_client.get(f"{url}?runs={other.pk},{run.pk},x")
    assert "Give run numbers separated by commas" in response.content.decode()
    response = member_client.get(f"{url}?runs={other.pk},{run.pk}")
    assert f"Not runs of other: {run.pk}." in response.content.decode()
    assert [r.pk for r in response.context["runs"]] == [other.pk]


def test_it_shows_gates_and_escapes_what_agents_wrote(member_client, run):
    run.gate_results = [{"name": "min pass rate", "passed": False, "detail": "<script>alert(1)</script>"}]
    run.save(update_fields=["gate_results"])
    page = member_client.get(compare_url(run)).content.decode()
    assert "min pass rate" in page and "fails" in page
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_it_says_so_when_there_is_nothing_to_compare(member_client):
    experiment = make_experiment(slug="empty")
    response = member_client.get(reverse("experiment_compare", args=[experiment.slug]))
    assert response.status_code == 200
    assert "No trials to compare yet" in response.content.decode()


def test_it_serves_plotly_from_the_installed_package(client):
    response = client.get("/static/plotly/plotly.min.js")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/javascript")
    response.close()
    path = finders.find("plotly/plotly.min.js")
    assert path and path.endswith("package_data/plotly.min.js")
    with open(path, encoding="utf-8") as handle:
        assert "plotly" in handle.read(300).lower()
    assert finders.find("plotly/widgetbundle.js") is None


def test_the_cost_columns_say_whose_calls_they_count(member_client):
    quiet = make_run(make_experiment(), {"alpha": {"base": "P", "new": "F"}}, baseline="base")
    page = member_client.get(compare_url(quiet)).content.decode()
    assert "Cost (agent)" in page and "Cost (answerer)" not in page and "Cost (judge)" not in page

    simulated = make_run(
        make_experiment("simulated"),
        {"alpha": {"base": "PP", "new": "F"}},
        baseline="base",
        answerer_cost_usd={("alpha", "base", 0): 0.25, ("alpha", "base", 1): 0.5},
        judge_cost_usd={("alpha", "new", 0): 0.125},
    )
    response = member_client.get(compare_url(simulated))
    page = response.content.decode()
    assert "Cost (answerer)" in page and "Cost (judge)" in page
    arms = {arm.key: arm for arm in response.context["comparison"].arms}
    assert (arms["base"].answerer_cost, arms["base"].judge_cost) == (0.75, 0.0)
    assert (arms["new"].answerer_cost, arms["new"].judge_cost) == (0.0, 0.125)
    assert "$0.75" in page and "$0.12" in page


def test_it_shows_cost_differences_with_intervals_and_the_pareto_frontier(member_client):
    outcomes = {f"t{i}": {"base": "PF", "new": "PP"} for i in range(6)}
    costs = {(f"t{i}", "new", r): 0.5 + 0.1 * i for i in range(6) for r in range(2)}
    run = make_run(make_experiment(), outcomes, baseline="base", cost_usd=costs)

    response = member_client.get(compare_url(run))

    versus = response.context["comparison"].arm("new").versus
    assert versus.cost_delta == pytest.approx(0.25) and versus.cost_delta_low < 0.25 < versus.cost_delta_high
    page = response.content.decode()
    assert "Δ cost / trial" in page and "Cost / trial (agent)" in page
    low, high = versus.cost_delta_low, versus.cost_delta_high
    assert f"${versus.cost_delta:+,.4f} [${low:+,.4f}, ${high:+,.4f}]" in page
    figure = json.loads(page.split('id="chart-cost-data" type="application/json">')[1].split("</script>")[0])
    frontier, points = figure["data"]
    assert frontier["name"] == "Pareto frontier" and len(frontier["x"]) == 2  # neither beats the other
    assert points["error_x"]["array"][1] > 0
