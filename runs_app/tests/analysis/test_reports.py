"""Reports of a run: Markdown, JSON, JUnit XML and the self-contained HTML file (and evalreport)."""

import json
import re
import xml.etree.ElementTree as ET
from io import StringIO
from pathlib import Path

import pytest
import xmlschema
from django.conf import settings
from django.core.management import CommandError, call_command

from experiments_app.definitions import import_experiment, import_tasks
from runs_app import control
from runs_app.analysis import reports
from runs_app.launching import LaunchOptions, launch_run
from runs_app.models import CriterionResult, Run, Trial

pytestmark = pytest.mark.django_db

EXAMPLES = settings.BASE_DIR / "examples"
JUNIT_XSD = Path(__file__).parents[1] / "fixtures" / "junit" / "junit.xsd"
HOSTILE = "<script>alert('owned')</script> | `x` \x1b[31mred\x1b[0m & more"

GATED = """\
experiment_id: report-smoke
baseline: reference
tags: [smoke]
variants:
  - variant_id: reference
    agent: {type: oracle}
  - variant_id: no-op
    agent: {type: none}
gates:
  - {type: min_pass_rate, variant: reference, value: 1.0, use: estimate}
  - {type: max_error_share, value: 0.0, name: "no errors at all"}
"""


@pytest.fixture
def finished_run(tmp_path) -> Run:
    """The smoke tasks × (reference, no-op), finished by hand: reference passes twice and errors
    once (with hostile agent output), no-op fails everything."""
    import_tasks([EXAMPLES / "tasks"])
    (tmp_path / "exp.yaml").write_text(GATED)
    run = launch_run(import_experiment(tmp_path / "exp.yaml").experiment, options=LaunchOptions())
    trials = Trial.objects.filter(run=run).order_by("task_version__task__slug")
    reference = list(trials.filter(variant__slug="reference"))
    for trial in reference[:2]:
        trial.status, trial.duration_seconds, trial.score = Trial.Status.PASSED, 1.5, 1.0
        trial.save()
    reference[2].status, reference[2].error_category = Trial.Status.ERROR, "agent_crashed"
    reference[2].error_message = HOSTILE
    reference[2].save()
    for trial in trials.filter(variant__slug="no-op"):
        trial.status, trial.duration_seconds, trial.score = Trial.Status.FAILED, 0.25, 0.0
        trial.save()
        CriterionResult.objects.create(
            trial=trial, index=0, type="run_command", description=HOSTILE, score=0.0, passed=False
        )
    control.refresh_run(run.pk)
    run.refresh_from_db()
    return run


def test_it_summarises_counts_comparison_and_gates(finished_run):
    report = reports.build_report(finished_run)

    reference, no_op = report["variants"]
    assert (reference["variant"], reference["passed"], reference["errors"]) == ("reference", 2, 1)
    assert (no_op["passed"], no_op["failed"], no_op["paired_units"]) == (0, 3, 2)
    assert no_op["delta"] == -1.0 and no_op["p_holm"] == 0.5  # McNemar on 2 discordant pairs
    # Errors are never fails: reference is 2/2 on what it graded, but the error share gate fails.
    assert [gate["passed"] for gate in report["gates"]] == [True, False]
    assert report["gates_passed"] is False
    assert json.loads(reports.render_json(report)) == json.loads(json.dumps(report))


def test_it_writes_junit_that_validates_against_the_junit_schema(finished_run):
    text = reports.render_junit(reports.build_report(finished_run))

    xmlschema.XMLSchema(JUNIT_XSD).validate(text)
    root = ET.fromstring(text)
    suites = {suite.get("name"): suite for suite in root.findall("testsuite")}
    assert list(suites) == ["reference", "no-op", "suite-gates"]
    reference = suites["reference"]
    assert [c.get("name") for c in reference.findall("testcase")] == [
        "fix-mean#0", "paginate-off-by-one#0", "slugify#0",
    ]  # fmt: skip
    assert (reference.get("tests"), reference.get("errors"), reference.get("failures")) == ("3", "1", "0")
    assert reference.find("testcase[3]/error").get("type") == "agent_crashed"
    assert len(suites["no-op"].findall("testcase/failure")) == 3
    gates = suites["suite-gates"].findall("testcase")
    assert [g.get("name") for g in gates] == ["min_pass_rate >= 100% (reference)", "no errors at all"]
    assert [g.find("failure") is not None for g in gates] == [False, True]
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("8", "4", "1")


def test_it_proves_the_junit_schema_rejects_a_wrong_shape(finished_run):
    text = reports.render_junit(reports.build_report(finished_run))
    # A test case without a name: CI readers cannot list it.
    broken = text.replace('name="slugify#0"', "", 1)

    with pytest.raises(xmlschema.XMLSchemaValidationError):
        xmlschema.XMLSchema(JUNIT_XSD).validate(broken)


def test_it_keeps_untrusted_agent_output_inert_in_every_format(finished_run):
    report = reports.build_report(finished_run)

    junit = reports.render_junit(report)
    assert "\x1b" not in junit
    assert "<script>" in ET.fromstring(junit).find(".//error").get("message")  # text, safely encoded
    markdown = reports.render_markdown(report)
    assert "<script>" not in markdown and "&lt;script&gt;" in markdown
    assert "\\|" in markdown  # a pipe in a cell would otherwise split the table
    html = reports.render_html(report)
    assert "<script>alert" not in html and "&lt;script&gt;alert" in html


def test_it_makes_the_html_report_one_self_contained_file(finished_run):
    html = reports.render_html(reports.build_report(finished_run, figures=True))

    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", html)
    assert "Plotly.newPlot" in html and len(html) > 1_000_000  # plotly.js is inlined
    figures = dict(
        re.findall(r'<script id="figure-([\w-]+)" type="application/json">(.*?)</script>', html, re.S)
    )
    assert set(figures) == {"chart-pass-rate", "chart-cost", "chart-forest", "chart-heatmap"}
    assert all(f'<div id="{name}"></div>' in html for name in figures)
    heatmap = json.loads(figures["chart-heatmap"])["data"][0]
    assert heatmap["x"] == ["reference", "no-op"]
    assert heatmap["text"][0] == ["1/1", "0/1"]  # fix-mean


def test_the_html_report_lists_the_first_trials_that_did_not_pass_and_counts_the_rest(
    finished_run, monkeypatch
):
    report = reports.build_report(finished_run)
    failed = [t for t in report["trials"] if t["status"] != "passed"]
    assert len(failed) >= 2
    monkeypatch.setattr(reports, "HTML_TRIAL_ROWS", 1)
    html = reports.render_html(report)
    assert html.count('<td class="message">') == 1
    assert f"… and {len(failed) - 1} more" in html


def test_the_html_reports_rows_are_read_from_the_trials_that_did_not_pass_only(finished_run):
    full = reports.build_report(finished_run)
    failed = [t for t in full["trials"] if t["status"] != "passed"]

    report = reports.build_report(finished_run, unsuccessful=1)

    assert report["unsuccessful_total"] == len(failed) >= 2
    assert [t["id"] for t in report["trials"]] == [failed[0]["id"]]
    assert report["trials"][0]["message"] == failed[0]["message"]
    html = reports.render_html(report)
    assert html.count('<td class="message">') == 1
    assert f"… and {len(failed) - 1} more" in html


def test_it_writes_reports_with_the_evalreport_command(finished_run, tmp_path, capsys, settings):
    settings.USER_UMASK = 0o022  # the person's: evalsite's own files are 0600, a report is theirs
    out = tmp_path / "nested" / "report.xml"
    call_command("evalreport", str(finished_run.pk), "--format", "junit", "-o", str(out), stderr=StringIO())
    assert ET.parse(out).getroot().tag == "testsuites"
    assert (out.stat().st_mode & 0o777, out.parent.stat().st_mode & 0o777) == (0o644, 0o755)

    call_command("evalreport", str(finished_run.pk), "--format", "md")
    assert "## Gates" in capsys.readouterr().out

    with pytest.raises(CommandError, match="no run 999999"):
        call_command("evalreport", "999999")
