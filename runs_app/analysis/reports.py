"""Run reports: one JSON-ready dict per run (`build_report`), rendered as Markdown, JSON, JUnit
XML or one self-contained HTML file. Used by `evalrun` (--report, --junit-xml, the summary it
prints) and `evalreport`.

Agent output is untrusted: every renderer escapes it for its own format (Markdown table cells,
XML text and attributes, HTML through Django's autoescaping and `json_script`).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from html import escape
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.template.loader import render_to_string

from runs_app.analysis import exports
from runs_app.analysis.load import compare_runs
from runs_app.analysis.stats import charts, records
from runs_app.analysis.stats.comparison import ArmSummary, Comparison
from runs_app.models import CriterionResult, Run, Trial

FORMATS = ("md", "json", "junit", "html")
GATES_SUITE = "suite-gates"
MESSAGE_CHARS = 500
# Red (never passes) to green (always passes); plotly.js has no such named scale.
HEAT_COLORS = [[0.0, "#d73027"], [0.5, "#fee08b"], [1.0, "#1a9850"]]
# Characters XML 1.0 cannot hold at all (agent output may contain terminal escapes).
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


# --- gathering -------------------------------------------------------------------------------


def build_report(run: Run, *, figures: bool = False, unsuccessful: int | None = None) -> dict[str, Any]:
    """Everything a report shows about `run`, as plain JSON-ready data; with `figures`, also the
    comparison page's Plotly charts and the task × variant map (for the HTML report). With
    `unsuccessful`, `trials` holds only the first that many trials that did not pass, and
    `unsuccessful_total` counts them all (a 100k-trial run's rows would cost seconds and
    hundreds of MB for a page that lists a thousand)."""
    summary = compare_runs([run])
    report = {
        "run": _run_info(run),
        "baseline": summary.baseline or None,
        "baseline_problem": summary.baseline_problem or None,
        "repeats": summary.repeats,
        "method": summary.method,
        "variants": [_variant_row(arm, summary) for arm in summary.arms],
        "warnings": list(summary.warnings),
        # Tasks set aside as broken: left out of every number above, each with its reason.
        "quarantined": list(summary.quarantined),
        "gates": list(run.gate_results),
        "gates_passed": run.gates_passed,
        "suites": list(run.suite_results),
        "trials": _trial_rows(run, unsuccessful),
    }
    if unsuccessful is not None:
        report["unsuccessful_total"] = _unsuccessful(run).count()
    if figures:
        report["figures"] = {**charts.figures(summary), "chart-heatmap": heatmap_figure(report)}
    return report


def _variant_row(arm: ArmSummary, summary: Comparison) -> dict[str, Any]:
    """One variant's line: the comparison's record (`stats.records`: the same fields as the API
    and the downloads) and the heat-map column, [passes, graded] per task."""
    index = summary.arms.index(arm)
    return {
        **records.arm_record(arm, summary),
        "tasks": {
            row.task.slug: [row.cells[index].passed, row.cells[index].n]
            for row in summary.rows
            if row.cells[index]
        },
    }


def _run_info(run: Run) -> dict[str, Any]:
    elapsed = None
    if run.started_at and run.finished_at:
        elapsed = (run.finished_at - run.started_at).total_seconds()
    return {
        "id": run.pk,
        "url": settings.SITE_URL + run.get_absolute_url(),
        "experiment": run.experiment.slug,
        "status": run.status,
        "historical": run.historical,
        "created_at": _iso(run.created_at),
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
        "duration_seconds": elapsed,
        "fingerprint": run.fingerprint,
        "seed": run.sample_seed,
        "overrides": list(run.overrides),
        "counts": exports.run_counts(run),
    }


def _iso(moment) -> str | None:
    return moment.isoformat() if moment else None


def _unsuccessful(run: Run):
    return Trial.objects.for_run(run).current().exclude(status=Trial.Status.PASSED)


def _trial_rows(run: Run, unsuccessful: int | None = None) -> list[dict[str, Any]]:
    """The run's current trials (or the first `unsuccessful` that did not pass) in the shape of
    every export, each with an absolute `url` and a short `message` saying why it did not pass."""
    trials = Trial.objects.for_run(run).current() if unsuccessful is None else _unsuccessful(run)
    trials = trials.order_by(
        "variant__position", "variant__slug", "task_version__task__slug", "dataset_row_id", "replicate"
    )
    if unsuccessful is not None:
        trials = trials[:unsuccessful]
    rows = list(exports.trial_rows(trials))
    failing = _failing_criteria([row["id"] for row in rows if row["status"] == Trial.Status.FAILED])
    for row in rows:
        row["url"] = settings.SITE_URL + row["url"]
        row["message"] = _trial_message(row, failing.get(row["id"], []))
    return rows


def _failing_criteria(trial_ids: list[int]) -> dict[int, list[CriterionResult]]:
    failing: dict[int, list[CriterionResult]] = defaultdict(list)
    results = CriterionResult.objects.filter(trial_id__in=trial_ids, passed=False, gating=True)
    for result in results.order_by("trial_id", "index"):
        failing[result.trial_id].append(result)
    return failing


def _trial_message(row: dict[str, Any], failing: list[CriterionResult]) -> str:
    """Why the trial did not pass, in one short line ("" when it passed)."""
    status = row["status"]
    if status == Trial.Status.FAILED:
        criteria = [
            f"{c.type} {c.description} (score {c.score:.2f} < {c.pass_threshold:g})".replace("  ", " ")
            for c in failing
        ]
        limits = ["timed out"] if row["timed_out"] else []
        limits += [f"{row['budget_exceeded']} budget exceeded"] if row["budget_exceeded"] else []
        text = "; ".join(limits + criteria) or "a gating criterion failed"
    elif status in (Trial.Status.ERROR, Trial.Status.CANCELLED):
        text = f"{row['error_category'] or status}: {row['error_message']}".rstrip(": ")
    elif status in (Trial.Status.QUEUED, Trial.Status.RUNNING):
        text = f"not finished ({status})"
    else:
        return ""
    return _shorten(text)


def _shorten(text: str, limit: int = MESSAGE_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- rendering ---------------------------------------------------------------------------------


def render(report: dict[str, Any], fmt: str) -> str:
    renderers = {"md": render_markdown, "json": render_json, "junit": render_junit, "html": render_html}
    return renderers[fmt](report)


def render_json(report: dict[str, Any]) -> str:
    # allow_nan=False: a number that is not finite must have become null (`records.finite`),
    # never the `NaN` no JSON reader accepts.
    return (
        json.dumps(records.finite(report), indent=2, sort_keys=False, cls=DjangoJSONEncoder, allow_nan=False)
        + "\n"
    )


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def _rate_cell(row: dict) -> str:
    if row["pass_rate"] is None:
        return "–"
    return f"{_pct(row['pass_rate'])} [{_pct(row['pass_rate_low'])}, {_pct(row['pass_rate_high'])}]"


def _delta_cell(row: dict) -> str:
    if row.get("delta") is None:
        return ""
    return (
        f"{row['delta']:+.1%} [{row['delta_low']:+.1%}, {row['delta_high']:+.1%}] "
        f"({_pct(row['rate_paired'])} vs {_pct(row['baseline_rate_paired'])} on {row['paired_units']} units)"
    )


def _p_cell(row: dict) -> str:
    if row.get("delta") is None:
        return ""
    return "not tested" if row.get("p_holm") is None else f"{row['p_holm']:.3g}"


def summary_rows(report: dict[str, Any]) -> list[list[str]]:
    """The comparison summary as a header plus one row of text cells per variant."""
    header = [
        "variant",
        "passed",
        "failed",
        "errors",
        "pass rate [95% CI]",
        "Δ vs baseline [95% CI]",
        "p (Holm)",
    ]
    rows = [header]
    for row in report["variants"]:
        name = row["arm"] + (" (baseline)" if row["baseline"] else "")
        counts = [str(row["passed"]), str(row["failed"]), str(row["errors"])]
        rows.append([name, *counts, _rate_cell(row), _delta_cell(row), _p_cell(row)])
    return rows


def render_text_table(report: dict[str, Any]) -> str:
    """The summary table for a terminal: aligned columns, plain text."""
    rows = summary_rows(report)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    if report.get("baseline_problem"):
        lines.append(report["baseline_problem"])
    if report.get("method"):
        lines.append(report["method"] + ".")
    return "\n".join(line.rstrip() for line in lines)


def _md_cell(text: Any) -> str:
    """A Markdown table cell that shows untrusted text literally."""
    text = " ".join(str(text).split())
    for char, entity in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("`", "\\`")):
        text = text.replace(char, entity)
    return text


def _md_table(rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(_md_cell(c) for c in rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows[1:]]
    return lines


def headline(report: dict[str, Any]) -> str:
    run, counts = report["run"], report["run"]["counts"]
    text = (
        f"Run {run['id']} of {run['experiment']} ({run['status']}): {counts['trials']} trials, "
        f"{counts['passed']} passed, {counts['failed']} failed, {counts['errors']} errors, "
        f"{counts['cancelled']} cancelled"
    )
    if report["gates"]:
        failed = sum(not gate["passed"] for gate in report["gates"])
        text += f"; gates: {len(report['gates']) - failed} of {len(report['gates'])} hold"
    return text


def quarantine_lines(report: dict[str, Any]) -> list[str]:
    """What the numbers leave out, in words: one line per quarantined task."""
    return [
        f"Left out of these numbers: {entry['task']} (quarantined"
        f"{' by ' + entry['by'] if entry.get('by') else ''} {entry['since'][:10]}: {entry['reason']})"
        for entry in report.get("quarantined") or []
    ]


def suite_lines(report: dict[str, Any]) -> list[str]:
    """One line per dataset suite with thresholds (task × variant): pass or FAIL, and each
    threshold against the metric found, as coder-eval's suite gate reads them."""
    lines = []
    for suite in report["suites"]:
        checks = [check for c in suite.get("criteria") or [] for check in c.get("threshold_checks") or []]
        verdict = "pass" if suite.get("passed") else "FAIL"
        words = ", ".join(_threshold_words(check) for check in checks) or "no threshold"
        lines.append(f"suite {verdict}: {suite.get('task')} × {suite.get('variant')}: {words}")
    return lines


def _threshold_words(check: dict[str, Any]) -> str:
    metric, minimum, actual = check.get("metric"), check.get("min_value"), check.get("actual_value")
    if actual is None:
        return f"{metric} not measured (needs >= {minimum:g})"
    return f"{metric} {actual:.3g} {'>=' if check.get('passed') else '<'} {minimum:g}"


def render_markdown(report: dict[str, Any]) -> str:
    run = report["run"]
    lines = [f"# Run {run['id']}: {_md_cell(run['experiment'])}", "", _md_cell(headline(report)), ""]
    lines += [f"Link: <{run['url']}>", "", "## Summary", "", *_md_table(summary_rows(report)), ""]
    lines += [f"- {_md_cell(warning)}" for warning in report["warnings"]] + (
        [""] if report["warnings"] else []
    )
    lines += [f"- {_md_cell(line)}" for line in quarantine_lines(report)] + (
        [""] if report.get("quarantined") else []
    )
    if report["gates"]:
        gates = [["gate", "result", "detail"]]
        gates += [[g["name"], "pass" if g["passed"] else "FAIL", g["detail"]] for g in report["gates"]]
        lines += ["## Gates", "", *_md_table(gates), ""]
    if report["suites"]:
        suites = [["task", "variant", "result"]]
        suites += [
            [s.get("task"), s.get("variant"), "pass" if s.get("passed") else "FAIL"] for s in report["suites"]
        ]
        lines += ["## Dataset suites", "", *_md_table(suites), ""]
    unsuccessful = [t for t in report["trials"] if t["status"] != Trial.Status.PASSED]
    if unsuccessful:
        table = [["trial", "variant", "status", "message"]]
        table += [[t["label"], t["variant"], t["status"], t["message"]] for t in unsuccessful]
        lines += ["## Trials that did not pass", "", *_md_table(table), ""]
    return "\n".join(lines)


def _xml_text(text: Any) -> str:
    return _XML_INVALID.sub("\ufffd", str(text))


def _seconds(value: float | None) -> str:
    return f"{value or 0.0:.3f}"


def render_junit(report: dict[str, Any]) -> str:
    """JUnit XML as CI systems read it (Ant/Jenkins shape): one <testsuite> per variant, one
    <testcase> per trial, and a `suite-gates` <testsuite> with one <testcase> per gate."""
    root = ET.Element("testsuites", name=_xml_text(f"evalsite run {report['run']['id']}"))
    by_variant: dict[str, list[dict]] = defaultdict(list)
    for trial in report["trials"]:
        by_variant[trial["variant"]].append(trial)
    for row in report["variants"]:
        _junit_variant(root, row["variant"], by_variant[row["variant"]], report)
    if report["gates"]:
        _junit_gates(root, report["gates"], report)
    _junit_totals(root, root.findall("testsuite"))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _junit_suite(root: ET.Element, name: str, report: dict) -> ET.Element:
    suite = ET.SubElement(root, "testsuite", name=_xml_text(name))
    suite.set("timestamp", (report["run"]["started_at"] or report["run"]["created_at"] or "")[:19])
    return suite


def _junit_variant(root: ET.Element, variant: str, trials: list[dict], report: dict) -> None:
    suite = _junit_suite(root, variant, report)
    properties = ET.SubElement(suite, "properties")
    for name in ("id", "experiment", "url", "fingerprint"):
        ET.SubElement(properties, "property", name=f"run.{name}", value=_xml_text(report["run"][name]))
    for trial in trials:
        case = ET.SubElement(
            suite, "testcase", classname=_xml_text(variant), name=_xml_text(trial["label"]),
            time=_seconds(trial["duration_seconds"]),
        )  # fmt: skip
        message = _xml_text(trial["message"])
        if trial["status"] == Trial.Status.FAILED:
            ET.SubElement(case, "failure", message=message, type="failed").text = message
        elif trial["status"] == Trial.Status.ERROR:
            kind = trial["error_category"] or "error"
            ET.SubElement(case, "error", message=message, type=_xml_text(kind)).text = message
        elif trial["status"] != Trial.Status.PASSED:
            ET.SubElement(case, "skipped", message=message)
        ET.SubElement(case, "system-out").text = _xml_text(trial["url"])


def _junit_gates(root: ET.Element, gates: list[dict], report: dict) -> None:
    suite = _junit_suite(root, GATES_SUITE, report)
    for gate in gates:
        case = ET.SubElement(
            suite, "testcase", classname=GATES_SUITE, name=_xml_text(gate["name"]), time="0.000"
        )
        if not gate["passed"]:
            detail = _xml_text(gate["detail"])
            ET.SubElement(case, "failure", message=detail, type="gate").text = detail
        ET.SubElement(case, "system-out").text = _xml_text(gate["detail"])


def _junit_totals(root: ET.Element, suites: list[ET.Element]) -> None:
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    total_time = 0.0
    for suite in suites:
        cases = suite.findall("testcase")
        counts = {
            "tests": len(cases),
            "failures": sum(c.find("failure") is not None for c in cases),
            "errors": sum(c.find("error") is not None for c in cases),
            "skipped": sum(c.find("skipped") is not None for c in cases),
        }
        seconds = sum(float(c.get("time", "0")) for c in cases)
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
        suite.set("time", f"{seconds:.3f}")
        total_time += seconds
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("time", f"{total_time:.3f}")


def heatmap_figure(report: dict[str, Any]) -> dict:
    """Task × variant map of passes (k/n per cell). Labels are escaped: Plotly renders HTML."""
    columns = [row["tasks"] for row in report["variants"]]
    tasks = sorted({task for column in columns for task in column})
    cells = [[column.get(task) for column in columns] for task in tasks]
    heatmap = {
        "type": "heatmap",
        "x": [escape(row["arm"]) for row in report["variants"]],
        "y": [escape(task) for task in tasks],
        "z": [[passes / n if n else None for passes, n in (c or (0, 0) for c in row)] for row in cells],
        "text": [[f"{c[0]}/{c[1]}" if c else "" for c in row] for row in cells],
        "texttemplate": "%{text}",
        "zmin": 0,
        "zmax": 1,
        "colorscale": HEAT_COLORS,
        "hovertemplate": "%{y} × %{x}: %{text}<extra></extra>",
    }
    layout = {
        "title": {"text": "Passes per task and variant"},
        "height": 220 + 28 * len(tasks),
        "yaxis": {"automargin": True},
    }
    return {"data": [heatmap], "layout": layout}


# The HTML report lists this many trials that did not pass, then says how many more there are:
# a page of 45,000 rows (a 100k-trial run) is 11 MB nobody reads; the JSON, JUnit and the CSV
# of the comparison page have them all.
HTML_TRIAL_ROWS = 1000


def render_html(report: dict[str, Any]) -> str:
    """One self-contained HTML file: plotly.js and the figures inlined, no network needed."""
    from plotly.offline import get_plotlyjs

    figures = report.get("figures") or {"chart-heatmap": heatmap_figure(report)}
    unsuccessful = [t for t in report["trials"] if t["status"] != Trial.Status.PASSED]
    total = report.get("unsuccessful_total", len(unsuccessful))
    context = {
        "report": report,
        "headline": headline(report),
        "summary": summary_rows(report),
        "unsuccessful": unsuccessful[:HTML_TRIAL_ROWS],
        "more_unsuccessful": max(0, total - min(len(unsuccessful), HTML_TRIAL_ROWS)),
        "figures": [(name, f"figure-{name}", figure) for name, figure in figures.items()],
        "plotly_js": get_plotlyjs(),
    }
    return render_to_string("reports/run_report.html", context)
