"""The one serialiser: every figure under one name in the API, the downloads and the reports, and
docs/schema.md listing exactly the fields it writes."""

import json
import math
import re

import pytest
from django.conf import settings

from runs_app.analysis import exports, reports
from runs_app.analysis.load import compare_runs
from runs_app.analysis.stats import records
from runs_app.tests.analysis.test_comparison import make_experiment, make_run

pytestmark = pytest.mark.django_db

OUTCOMES = {
    "a": {"base": "PF", "new": "PP"},
    "b": {"base": "FE", "new": "PF"},
    "c": {"base": "P", "new": "E"},
}


def documented(section: str) -> list[str]:
    """The fields of a table in docs/schema.md, from its heading (or its line before) to the next."""
    text = (settings.BASE_DIR / "docs" / "schema.md").read_text()
    start = text.index(section)
    end = text.find("\n## ", start + 1)
    block = text[start : end if end > 0 else len(text)]
    table = block.split("\n\n| field |", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^\| `([a-z_@0-9]+)` \|", table, re.M)


@pytest.fixture
def run():
    return make_run(make_experiment(), OUTCOMES, baseline="base")


def test_the_schema_page_lists_every_field_written(run):
    comparison = compare_runs([run])
    record = records.comparison_record(comparison)
    assert documented("## Comparison record") == list(record)
    assert documented("## Arm record") == list(record["arms"][0]) == list(record["arms"][1])
    assert documented("## Run counts") == list(exports.run_counts(run))
    assert documented("## Trial rows") == exports.TRIAL_COLUMNS
    report = reports.build_report(run, unsuccessful=10)
    assert documented("## Report") == list(report)
    assert documented("The report's `run`:") == list(report["run"])


def test_one_figure_has_one_name_in_every_output(run, member_client, member):
    from runs_app.tokens import create_token

    comparison = compare_runs([run])
    new = comparison.arm("new")
    token = create_token(member, "records")[1]
    api = member_client.get(f"/api/runs/{run.pk}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    page = member_client.get(f"/runs/{run.pk}/compare/?format=json&table=summary").json()
    csv_text = member_client.get(f"/runs/{run.pk}/compare/?format=csv&table=summary").content.decode()
    report = json.loads(reports.render_json(reports.build_report(run)))
    header = csv_text.splitlines()[0].split(",")
    for arms in (api["summary"]["arms"], page["arms"], report["variants"]):
        line = next(arm for arm in arms if arm["arm"] == "new")
        assert (line["pass_rate"], line["errors"], line["p_holm"]) == (new.pass_rate, 1, new.versus.p_holm)
        assert line["cost_usd"] == new.cost and line["delta"] == new.versus.delta
    assert {"pass_rate", "errors", "p_holm", "cost_usd", "delta", "pass_at_k_1"} <= set(header)
    assert api["counts"]["errors"] == report["run"]["counts"]["errors"] == 2


def test_numbers_that_are_not_finite_leave_as_null():
    assert records.finite({"a": [1.0, math.nan, {"b": math.inf}], "c": (2, -math.inf)}) == {
        "a": [1.0, None, {"b": None}],
        "c": [2, None],
    }


def test_a_nan_cost_reaches_no_json_and_shows_as_a_dash():
    """A NaN cost that got into the tallies (PostgreSQL keeps one; costs are checked as they are
    stored now): every output gives null, every page "—", nothing raises."""
    import numpy as np

    from runs_app.analysis.stats import charts, compare
    from runs_app.analysis.stats.simulation import Design, comparison_data
    from runs_app.web.compare import _arm_display

    data = comparison_data(Design(12, 2, shift=1.0), np.random.default_rng(1))
    for i, (_, cell) in enumerate(sorted(data.cells.items())):
        cell.cost = math.nan if i == 3 else (math.inf if i == 20 else 0.25)
    result = compare.compare(data)
    record = records.comparison_record(result)
    text = json.dumps(record, allow_nan=False)  # raises on NaN or Infinity
    assert '"cost_usd": null' in text and "NaN" not in text
    json.dumps(charts.figures(result), allow_nan=False)
    for arm in result.arms:
        shown = _arm_display(arm, result.max_k)
        assert shown["cost"] == "—" and shown["cost_per_trial"] == "—"
    from runs_app.templatetags.formatting import usd

    assert (usd(math.nan), usd(math.inf), usd(None), usd(0.0), usd(0.5)) == ("—", "—", "—", "$0", "$0.5000")


def test_a_stored_nan_cost_leaves_as_null_or_cannot_be_stored(run, member_client, member):
    from django.db import IntegrityError, connection, transaction

    from runs_app.analysis import rollup
    from runs_app.models import Trial
    from runs_app.tokens import create_token

    trial = Trial.objects.filter(run=run, variant__slug="new").first()
    if connection.vendor != "postgresql":
        with pytest.raises(IntegrityError), transaction.atomic():  # SQLite stores NaN as NULL
            Trial.objects.filter(pk=trial.pk).update(cost_usd=math.nan)
        return
    Trial.objects.filter(pk=trial.pk).update(cost_usd=math.nan)
    rollup.recount(run)
    token = create_token(member, "nan")[1]
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    api = member_client.get(f"/api/runs/{run.pk}", **headers)
    trials = member_client.get(f"/api/runs/{run.pk}/trials?page_size=500", **headers)
    summary_json = member_client.get(f"/runs/{run.pk}/compare/?format=json&table=summary")
    for response in (api, trials, summary_json):
        assert b"NaN" not in response.content and response.status_code == 200
    assert {item["cost_usd"] for item in trials.json()["items"] if item["id"] == trial.pk} == {None}
    page = member_client.get(f"/runs/{run.pk}/compare/").content.decode()
    assert "$nan" not in page.lower() and "NaN" not in page
    run_page = member_client.get(f"/runs/{run.pk}/").content.decode()
    assert "$nan" not in run_page.lower()
    csv_text = b"".join(
        c if isinstance(c, bytes) else c.encode() for c in exports.trials_csv(Trial.objects.filter(run=run))
    )
    assert b"NaN" not in csv_text
    assert "NaN" not in reports.render_json(reports.build_report(run))
