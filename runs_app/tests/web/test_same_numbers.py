"""One run with dataset tasks, repeats and errors: the run page, the comparison page, the CLI
summary, the HTML report and the API show the same rate, interval and Δ."""

import html

import pytest
from django.urls import reverse

from runs_app.analysis import reports
from runs_app.analysis.load import compare_runs
from runs_app.models import Trial
from runs_app.tests.analysis.test_comparison import make_experiment, make_run
from runs_app.tokens import create_token

pytestmark = pytest.mark.django_db

OUTCOMES = {
    # A dataset task: two rows, three trials of each row per variant.
    "rows": {"base": "PPFFFP", "new": "PPPPFE"},
    "alpha": {"base": "PPF", "new": "PPP"},
    "beta": {"base": "FFE", "new": "PFP"},
    "gamma": {"base": "PPP", "new": "EPP"},
}
ROWS = {("rows", variant, i): ("r1" if i < 3 else "r2") for variant in ("base", "new") for i in range(6)}
CATEGORIES = {("rows", "new", 5): "crash", ("beta", "base", 2): "rate_limit", ("gamma", "new", 0): "setup"}


@pytest.fixture
def run():
    return make_run(
        make_experiment(), OUTCOMES, baseline="base", dataset_row_id=ROWS, error_category=CATEGORIES
    )


def pct(value: float) -> str:
    return f"{value * 100:.1f}%"


def test_every_surface_shows_the_same_numbers(run, member_client, member):
    summary = compare_runs([run])
    base, new = summary.arms
    assert (base.units, new.units) == (5, 5)  # two dataset rows and three tasks
    assert new.agent_errors == 1 and new.errors == 2  # the crash counts as a fail, setup does not
    versus = new.versus
    assert versus.delta == pytest.approx(versus.arm_rate - versus.baseline_rate)

    # Run page: the same rate and interval per variant.
    page = member_client.get(reverse("run_detail", args=[run.pk]))
    rows = {row.variant.slug: row for row in page.context["variant_rows"]}
    for arm in (base, new):
        assert rows[arm.variant_slug].pass_rate == arm.pass_rate
        assert rows[arm.variant_slug].interval == (arm.low, arm.high)
        assert f"{pct(arm.pass_rate)}</span>" in page.content.decode()
        assert f"{pct(arm.low)} – {pct(arm.high)}" in page.content.decode()

    # Comparison page.
    compare = member_client.get(reverse("run_compare", args=[run.pk]))
    shown = compare.context["comparison"]
    assert [(a.pass_rate, a.low, a.high) for a in shown.arms] == [
        (a.pass_rate, a.low, a.high) for a in summary.arms
    ]
    assert (shown.arms[1].versus.delta, shown.arms[1].versus.p_holm) == (versus.delta, versus.p_holm)
    text = html.unescape(compare.content.decode())
    assert (
        f"{versus.delta * 100:+.1f} pp" in text
        and f"{pct(versus.arm_rate)} vs {pct(versus.baseline_rate)}" in text
    )

    # CLI summary and HTML report: both render the report built from the same comparison.
    report = reports.build_report(run, figures=True)
    cli = reports.render_text_table(report)
    for arm in (base, new):
        assert f"{pct(arm.pass_rate)} [{pct(arm.low)}, {pct(arm.high)}]" in cli
    assert f"{versus.delta:+.1%} [{versus.low:+.1%}, {versus.high:+.1%}]" in cli
    report_html = html.unescape(reports.render_html(report))
    assert f"{pct(new.pass_rate)} [{pct(new.low)}, {pct(new.high)}]" in report_html

    # API.
    token = create_token(member, "numbers")[1]
    data = member_client.get(f"/api/runs/{run.pk}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    arms = {arm["arm"]: arm for arm in data["summary"]["arms"]}
    for arm in (base, new):
        line = arms[arm.key]
        assert [line[f"pass_rate{e}"] for e in ("", "_low", "_high")] == [arm.pass_rate, arm.low, arm.high]
    assert arms["new"]["delta"] == versus.delta
    assert arms["new"]["p_holm"] == versus.p_holm
    assert Trial.objects.filter(run=run).count() == 30
