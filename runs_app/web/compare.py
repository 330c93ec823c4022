"""Comparison pages: the variants of one run, or several runs of one experiment.

All state lives in the query string (baseline, tags, heat-map page, runs), so a view can be
shared by copying its URL; `?format=csv|json&table=summary|trials` downloads the same data.
"""

import math
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.handlers.asgi import ASGIRequest
from django.core.paginator import Page, Paginator
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.utils.datastructures import MultiValueDict
from django.views.decorators.http import require_GET

from experiments_app.models import Experiment
from runs_app.analysis import exports
from runs_app.analysis.load import comparison, loaded
from runs_app.analysis.stats import charts, records
from runs_app.analysis.stats.comparison import CLUSTERINGS, Arm, ArmSummary, Cell, Comparison
from runs_app.models import Run, Trial
from runs_app.web.experiments import get_experiment_for_user
from runs_app.web.runs import get_run_for_user

# A heat-map page holds about this many cells, and 5 to 50 tasks: 50 tasks at 10 variants is
# about a screen, and at 100 arms (10 runs × 10 variants) 5,000 cells took 0.8 s to render.
HEATMAP_CELLS = 500
HEATMAP_ROWS = (5, 50)
TASK_LIST_LIMIT = 50  # improved / regressed / flaky tasks listed per variant on the page
MAX_RUNS = 10
DEFAULT_RUNS = 2


PICKER_RUNS = 20  # the recent runs the picker lists


class RunSelectionForm(forms.Form):
    """The runs to compare: ticked in the list of the experiment's recent runs, or typed."""

    pick = forms.TypedMultipleChoiceField(
        required=False, coerce=int, widget=forms.CheckboxSelectMultiple, label="Runs"
    )
    runs = forms.CharField(required=False, help_text="Or run numbers separated by commas, e.g. 3,5")

    def __init__(self, *args: Any, experiment: Experiment | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        recent = Run.objects.filter(experiment=experiment).order_by("-created_at", "-pk")[:PICKER_RUNS]
        self.fields["pick"].choices = [
            (run.pk, f"#{run.pk} · {run.get_status_display().lower()} · {run.created_at:%Y-%m-%d %H:%M}")
            for run in recent
        ]

    def clean_runs(self) -> list[int]:
        raw = self.cleaned_data["runs"].replace(" ", "")
        try:
            ids = [int(part) for part in raw.split(",") if part]
        except ValueError:
            raise forms.ValidationError("Give run numbers separated by commas, e.g. 3,5.") from None
        return ids

    def clean(self) -> dict:
        data = super().clean()
        ids = list(dict.fromkeys([*(data.get("pick") or []), *(data.get("runs") or [])]))
        if len(ids) > MAX_RUNS:
            self.add_error("runs", f"Compare at most {MAX_RUNS} runs at once.")
        data["runs"] = sorted(ids)
        return data


class CompareForm(forms.Form):
    baseline = forms.ChoiceField(required=False)
    cluster = forms.ChoiceField(
        required=False,
        choices=[(key, f"{key}: {words}") for key, words in CLUSTERINGS.items()],
        label="Clusters",
        help_text="What the intervals and tests treat as independent draws.",
    )
    tag = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple, label="Tags")
    page = forms.IntegerField(required=False, min_value=1)  # heat-map page; "Apply" resets it
    format = forms.ChoiceField(required=False, choices=[("html", "HTML"), ("csv", "CSV"), ("json", "JSON")])
    table = forms.ChoiceField(required=False, choices=[("summary", "summary"), ("trials", "trials")])

    def __init__(self, data, *, arms: Sequence[Arm], tags: Sequence[str]):
        super().__init__(data)
        self.fields["baseline"].choices = [(arm.key, arm.label) for arm in arms]
        self.fields["tag"].choices = [(tag, tag) for tag in tags]


@login_required
@require_GET
def run_compare(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for_user(request, run_id)
    return _comparison_response(request, run.experiment, [run], run_form=None)


@login_required
@require_GET
def experiment_compare(request: HttpRequest, slug: str) -> HttpResponse:
    experiment = get_experiment_for_user(request, slug)
    run_form = RunSelectionForm(request.GET, experiment=experiment)
    runs = _selected_runs(experiment, run_form)
    if run_form.is_valid():
        run_form.data = _as_picked(run_form, runs)
    return _comparison_response(request, experiment, runs, run_form=run_form)


def _as_picked(form: RunSelectionForm, runs: Sequence[Run]) -> MultiValueDict:
    """The picker as the page shows it: every run compared ticked (one outside the recent list
    typed), whatever named them (ticks, typed numbers, or the default latest two)."""
    listed = {pk for pk, _ in form.fields["pick"].choices}
    return MultiValueDict(
        {
            "pick": [str(run.pk) for run in runs if run.pk in listed],
            "runs": [",".join(str(run.pk) for run in runs if run.pk not in listed)],
        }
    )


def _selected_runs(experiment: Experiment, form: RunSelectionForm) -> list[Run]:
    """The runs named in the form, in its order; else the experiment's latest two, oldest first."""
    runs = Run.objects.filter(experiment=experiment).select_related("experiment")
    ids = form.cleaned_data["runs"] if form.is_valid() else []
    if not ids:
        return sorted(runs.newest(DEFAULT_RUNS), key=lambda run: run.pk)
    found = {run.pk: run for run in runs.filter(pk__in=ids)}
    missing = [str(pk) for pk in ids if pk not in found]
    if missing:
        form.add_error("runs", f"Not runs of {experiment.slug}: {', '.join(missing)}.")
    return [found[pk] for pk in ids if pk in found]


def _comparison_response(
    request: HttpRequest, experiment: Experiment, runs: list[Run], run_form: RunSelectionForm | None
) -> HttpResponse:
    data = loaded(runs)
    form = CompareForm(request.GET, arms=data.arms, tags=data.tags)
    form.is_valid()  # an invalid field falls back to its default below; its error is shown
    options = form.cleaned_data
    tags = options.get("tag") or []
    stem = _file_stem(experiment, runs)
    if options.get("format") in ("csv", "json") and options.get("table") == "trials":
        task_ids = [task.task_id for task in data.tasks if set(tags) & set(task.tags)] if tags else None
        return _trials_download(request, _current_trials(runs, task_ids), options["format"], stem)
    result = comparison(
        runs, baseline=options.get("baseline") or None, tags=tags, cluster=options.get("cluster") or "unit"
    )
    if options.get("format") in ("csv", "json"):
        return _summary_download(result, options["format"], stem)
    context = _page_context(result, options.get("page"))
    context.update(experiment=experiment, runs=runs, form=form, run_form=run_form)
    context["run"] = runs[0] if run_form is None else None
    fragment = request.htmx and request.htmx.target == "heatmap"
    response = render(request, "runs/compare.html#heatmap" if fragment else "runs/compare.html", context)
    patch_vary_headers(response, ["HX-Request", "HX-Target"])
    return response


def _page_context(result: Comparison, page: int | None) -> dict:
    fewest, most = HEATMAP_ROWS
    per_page = max(fewest, min(most, HEATMAP_CELLS // max(1, len(result.arms))))
    heatmap = Paginator(result.rows, per_page).get_page(page)
    return {
        "comparison": result,
        "confidence": round(result.confidence * 100),
        "arms": [_arm_display(arm, result.max_k) for arm in result.arms],
        # The answerer's and the judge's calls have columns of their own, shown once any cost.
        "other_roles": [
            role for role in ("answerer", "judge") if any(getattr(arm, f"{role}_cost") for arm in result.arms)
        ],
        "k_range": range(1, result.max_k + 1),
        "k_tables": [("pass@k", "at"), ("pass^k", "hat")],
        "heatmap": heatmap,
        "heat_rows": _heat_rows(heatmap, result.arms),
        "charts": _charts(result),
        "by_tag": _breakdown(result.by_tag, result.arms),
        "by_criterion": _breakdown(result.by_criterion, result.arms),
        "gates": [(run, _gate_rows(run.gate_results)) for run in result.runs if run.gate_results],
    }


def _file_stem(experiment: Experiment, runs: Sequence[Run]) -> str:
    ids = "-".join(str(run.pk) for run in runs) or "none"
    return f"{experiment.slug}-runs-{ids}" if len(runs) != 1 else f"run-{ids}"


def _summary_download(result: Comparison, fmt: str, stem: str) -> HttpResponse:
    if fmt == "json":
        response = JsonResponse(records.comparison_record(result), json_dumps_params={"indent": 1})
    else:
        rows = records.csv_rows(result)
        columns = list(rows[0]) if rows else ["arm"]
        response = HttpResponse(exports.csv_lines(rows, columns), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{stem}-summary.{fmt}"'
    return response


def _current_trials(runs: Sequence[Run], task_ids: list[int] | None):
    trials = Trial.objects.filter(run__in=list(runs)).current().order_by("pk")
    if task_ids is not None:
        trials = trials.filter(task_version__task_id__in=task_ids)
    return trials


def _trials_download(request: HttpRequest, trials, fmt: str, stem: str) -> StreamingHttpResponse:
    """Streams the per-trial table: 100,000 trials never sit in memory at once."""
    if fmt == "json":
        content, content_type = exports.json_array(exports.trial_rows(trials)), "application/json"
    else:
        content, content_type = exports.trials_csv(trials), "text/csv; charset=utf-8"
    if isinstance(request, ASGIRequest):
        content = exports.pulled(content)
    response = StreamingHttpResponse(content, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{stem}-trials.{fmt}"'
    return response


def _arm_display(arm: ArmSummary, max_k: int) -> dict:
    """One summary-table row, formatted (the numbers stay in `arm` for downloads). pass@k
    stops at an arm's fewest graded trials of a task: pad so the k columns line up."""
    row = {
        "arm": arm,
        "rate": _pct(arm.pass_rate),
        "interval": f"{_pct(arm.low)} – {_pct(arm.high)}" if arm.low is not None else "",
        "if_errors_fail": _pct(arm.rate_if_errors_fail),
        "mean_score": _with_interval(arm.mean_score, arm.mean_score_low, arm.mean_score_high, "{:.3f}"),
        "median": f"{arm.median_duration:.1f} s" if arm.median_duration is not None else "–",
        "tokens": f"{arm.tokens:,}",
        "cost": _with_interval(arm.cost, None, None, "${:,.2f}"),
        "answerer_cost": _with_interval(arm.answerer_cost, None, None, "${:,.2f}"),
        "judge_cost": _with_interval(arm.judge_cost, None, None, "${:,.2f}"),
        "cost_per_pass": _with_interval(
            arm.cost_per_pass, arm.cost_per_pass_low, arm.cost_per_pass_high, "${:,.4f}"
        ),
        "cost_per_trial": _with_interval(arm.mean_cost, arm.mean_cost_low, arm.mean_cost_high, "${:,.4f}"),
        "flaky": _capped(arm.flaky),
        "at_k": [_at_k(arm, k) for k in range(1, max_k + 1)],
        "hat_k": [_pct(arm.pass_hat_k.get(k)) for k in range(1, max_k + 1)],
    }
    versus = arm.versus
    if versus:
        row["delta"] = f"{versus.delta * 100:+.1f} pp"
        row["delta_interval"] = f"{versus.low * 100:+.1f} to {versus.high * 100:+.1f}"
        row["paired_rates"] = f"{_pct(versus.arm_rate)} vs {_pct(versus.baseline_rate)}"
        row["mde"] = f"±{versus.mde * 100:.1f} pp" if versus.mde is not None else "none: too few clusters"
        if versus.p_value is not None:
            row["p"], row["p_holm"] = _p_value(versus.p_value), _p_value(versus.p_holm)
            row["significant"] = versus.significant
            row["depends_on_errors"] = versus.depends_on_errors
        if versus.delta_if_errors_pass is not None and versus.delta_if_errors_fail is not None:
            row["error_range"] = (
                f"{versus.delta_if_errors_fail * 100:+.1f} to {versus.delta_if_errors_pass * 100:+.1f} pp"
            )
        row["cost_delta"] = _with_interval(
            versus.cost_delta, versus.cost_delta_low, versus.cost_delta_high, "${:+,.4f}"
        )
        row["cost_per_pass_delta"] = _with_interval(
            versus.cost_per_pass_delta,
            versus.cost_per_pass_delta_low,
            versus.cost_per_pass_delta_high,
            "${:+,.4f}",
        )
    row["improved"] = _capped(versus.improved if versus else [])
    row["regressed"] = _capped(versus.regressed if versus else [])
    return row


def _at_k(arm: ArmSummary, k: int) -> str:
    """pass@k with its interval, and over how many units when some have fewer than k trials."""
    if k not in arm.pass_at_k:
        return "–"
    text = f"{_pct(arm.pass_at_k[k])} [{_pct(arm.pass_at_k_low[k])}, {_pct(arm.pass_at_k_high[k])}]"
    if arm.pass_at_k_units[k] < arm.units:
        text += f" ({arm.pass_at_k_units[k]} of {arm.units} units)"
    return text


def _capped(items: list) -> dict:
    """The first TASK_LIST_LIMIT items, and how many more the page leaves out."""
    return {
        "shown": items[:TASK_LIST_LIMIT],
        "more": max(0, len(items) - TASK_LIST_LIMIT),
        "count": len(items),
    }


def _with_interval(value: float | None, low: float | None, high: float | None, form: str) -> str:
    """A figure with its interval; "—" for none, or for a figure that is not a finite number (a
    cost an agent reported as NaN)."""
    if value is None or not math.isfinite(value):
        return "—"
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return form.format(value)
    return f"{form.format(value)} [{form.format(low)}, {form.format(high)}]"


def _breakdown(rows, arms: list[ArmSummary]) -> list[dict]:
    """Tag or criterion rows: each arm's rate and interval, as text."""
    return [
        {
            "name": row.name,
            "cells": [
                f"{_pct(cell.estimate)} [{_pct(cell.low)}, {_pct(cell.high)}]" if cell else "–"
                for cell in row.cells
            ],
        }
        for row in rows
    ]


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"


def _p_value(value: float) -> str:
    return "< 0.001" if value < 0.001 else f"{value:.3f}"


def _heat_rows(page: Page, arms: list[ArmSummary]) -> list[dict]:
    """The heat-map page's cells with their text, colour class and link."""
    run_urls = {arm.run_id: reverse("run_detail", args=[arm.run_id]) for arm in arms}
    rows = []
    for row in page.object_list:
        cells = []
        for arm, cell in zip(arms, row.cells, strict=True):
            cells.append(_heat_cell(arm, cell, row.task.slug, run_urls[arm.run_id]))
        rows.append({"task": row.task, "cells": cells})
    return rows


def _heat_cell(arm: ArmSummary, cell: Cell | None, task: str, run_url: str) -> dict:
    if cell is None or cell.total == 0:
        return {"text": "", "css": "none", "url": "", "title": "no trials"}
    if cell.total == 1:
        url = reverse("trial_detail", args=[arm.run_id, cell.first_trial_id])
    else:
        url = f"{run_url}?{urlencode({'task': task, 'variant': arm.variant_slug})}"
    css = f"r{round(cell.rate * 10)}" if cell.n else "none"
    title = f"{task} × {arm.label}: {cell.passed} passed of {cell.n} graded, {cell.errors} errors"
    return {"text": f"{cell.passed}/{cell.n}", "errors": cell.errors, "css": css, "url": url, "title": title}


def _charts(result: Comparison) -> list[dict]:
    if not result.arms:
        return []
    return [
        {"id": chart_id, "data_id": f"{chart_id}-data", "figure": figure}
        for chart_id, figure in charts.figures(result).items()
    ]


def _gate_rows(results: list) -> list[dict]:
    """Gate verdicts as (name, passed, detail), whatever shape the gate evaluator stored."""
    rows = []
    for result in results:
        if not isinstance(result, dict):
            rows.append({"name": str(result), "passed": None, "detail": ""})
            continue
        rows.append(
            {
                "name": _first(result, ("name", "gate", "type", "description")) or "gate",
                "passed": result.get("passed"),
                "detail": _first(result, ("detail", "message", "reason")),
            }
        )
    return rows


def _first(data: dict, keys: Sequence[str]) -> str:
    return next((str(data[key]) for key in keys if data.get(key) not in (None, "")), "")
