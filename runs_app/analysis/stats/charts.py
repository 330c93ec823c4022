"""Plotly figures of a comparison, as plain figure dicts ({"data": [...], "layout": {...}}).

Plain dicts, not plotly.graph_objects: building a graph_objects figure validates every property
and costs tens of milliseconds a chart; the page serialises these with `json_script` and
static/js/compare.js hands them to Plotly.newPlot. The tests validate them with graph_objects.
Plotly renders a subset of HTML in text, so every label is HTML-escaped first.
"""

import math
import re
from html import escape
from typing import Any

from runs_app.analysis.stats.comparison import ArmSummary, Comparison
from runs_app.analysis.stats.records import finite

BASELINE_COLOUR = "#6a7380"
ARM_COLOUR = "#2b5fd9"
FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 13}


# Charts of more arms than this lean their axis labels and name cost points on hover only.
MANY_ARMS = 6
LABEL_LINE = 18


def tick_label(arm: ArmSummary) -> str:
    """An arm's axis label on short lines: a cross-run arm's run on a line of its own, a long
    variant name broken at its separators, so labels neither overlap nor get cut."""
    words, lines = re.split(r"(?<=[-_.])", arm.variant_slug), [""]
    for word in words:
        if lines[-1] and len(lines[-1]) + len(word) > LABEL_LINE:
            lines.append("")
        lines[-1] += word
    if arm.label != arm.variant_slug:
        lines.append(arm.label.removeprefix(arm.variant_slug).strip(" ·"))
    return "<br>".join(escape(line) for line in lines)


def pass_rate_figure(comparison: Comparison) -> dict[str, Any]:
    """Pass rate per arm, with its 95% interval as error bars (baseline in grey)."""
    arms = comparison.arms
    bar = {
        "type": "bar",
        "x": [tick_label(arm) for arm in arms],
        "y": [arm.pass_rate for arm in arms],
        "error_y": _error_bars(arms, "pass_rate", "low", "high"),
        "marker": {"color": [BASELINE_COLOUR if arm.is_baseline else ARM_COLOUR for arm in arms]},
        "customdata": [[arm.passed, arm.passed + arm.failed, arm.errors] for arm in arms],
        "hovertemplate": "%{x}<br>%{y:.1%} (%{customdata[0]}/%{customdata[1]}), "
        "%{customdata[2]} errors<extra></extra>",
    }
    layout = _layout(f"Pass rate ({_interval_name(comparison)})")
    layout["yaxis"] = {"range": [0, 1], "tickformat": ".0%", "title": {"text": "pass rate"}}
    # Wrapped labels need the room below the axis; past a few arms they lean so none overlap.
    layout["xaxis"] = {"automargin": True, "tickangle": -40 if len(arms) > MANY_ARMS else 0}
    return {"data": [bar], "layout": layout}


def forest_figure(comparison: Comparison) -> dict[str, Any]:
    """Δ pass rate of every arm against the baseline, with its paired 95% interval."""
    # Plotly draws the first category at the bottom; reverse so the table's order reads down.
    rows = [(arm, arm.versus) for arm in reversed(comparison.others) if arm.versus is not None]
    points = {
        "type": "scatter",
        "mode": "markers",
        "x": [v.delta for _, v in rows],
        "y": [tick_label(arm) for arm, _ in rows],
        "error_x": {
            "type": "data",
            "symmetric": False,
            "array": [v.high - v.delta for _, v in rows],
            "arrayminus": [v.delta - v.low for _, v in rows],
        },
        "marker": {"size": 10, "color": ARM_COLOUR},
        "customdata": [[v.low, v.high, _p_text(v.p_holm)] for _, v in rows],
        "hovertemplate": "%{y}<br>Δ %{x:+.1%} [%{customdata[0]:+.1%}, %{customdata[1]:+.1%}]"
        "<br>Holm p %{customdata[2]}<extra></extra>",
    }
    baseline = escape(comparison.baseline_label)
    layout = _layout(f"Δ pass rate vs {baseline} ({round(comparison.confidence * 100)}% paired)")
    layout["xaxis"] = {"tickformat": "+.0%", "zeroline": False, "title": {"text": "Δ pass rate"}}
    layout["yaxis"] = {"automargin": True}  # room for long variant names
    layout["shapes"] = [
        {
            "type": "line",
            "x0": 0,
            "x1": 0,
            "yref": "paper",
            "y0": 0,
            "y1": 1,
            "line": {"color": BASELINE_COLOUR, "dash": "dot"},
        }
    ]
    return {"data": [points], "layout": layout}


def pareto_front(arms: list[ArmSummary]) -> list[ArmSummary]:
    """The arms no other arm beats on both pass rate and cost per trial (as high a rate for no
    more cost, one of them strictly), cheapest first: the choices worth making."""
    known = [(float(arm.mean_cost or 0.0), float(arm.pass_rate or 0.0), arm) for arm in arms if _costed(arm)]
    front = [
        (cost, rate, arm)
        for cost, rate, arm in known
        if not any(
            other_cost <= cost and other_rate >= rate and (other_cost < cost or other_rate > rate)
            for other_cost, other_rate, _ in known
        )
    ]
    return [arm for _, _, arm in sorted(front, key=lambda item: (item[0], -item[1]))]


def _costed(arm: ArmSummary) -> bool:
    """An arm with a rate and a known cost (not NaN: an agent may report one)."""
    return arm.pass_rate is not None and arm.mean_cost is not None and math.isfinite(arm.mean_cost)


def cost_figure(comparison: Comparison) -> dict[str, Any]:
    """Pass rate against cost per trial, one point per arm (per run and variant across runs),
    both with their 95% intervals, and the Pareto frontier: the arms no other beats on both.
    Dominated arms are hollow."""
    arms = [arm for arm in comparison.arms if _costed(arm)]
    front = pareto_front(arms)
    on_front = {arm.key for arm in front}
    points = {
        "type": "scatter",
        # Past a few arms the names would sit on each other: they move to the hover text.
        "mode": "markers+text" if len(arms) <= MANY_ARMS else "markers",
        "x": [arm.mean_cost for arm in arms],
        "y": [arm.pass_rate for arm in arms],
        "text": [escape(arm.label) for arm in arms],
        "textposition": "top center",
        "cliponaxis": False,  # labels of points at the axis edge stay whole
        "error_y": _error_bars(arms, "pass_rate", "low", "high"),
        "error_x": _error_bars(arms, "mean_cost", "mean_cost_low", "mean_cost_high"),
        "customdata": ["on the Pareto frontier" if arm.key in on_front else "beaten on both" for arm in arms],
        "marker": {
            "size": 10,
            "color": [BASELINE_COLOUR if arm.is_baseline else ARM_COLOUR for arm in arms],
            "symbol": ["circle" if arm.key in on_front else "circle-open" for arm in arms],
        },
        "hovertemplate": "%{text}<br>%{y:.1%} at $%{x:.4f} a trial<br>%{customdata}<extra></extra>",
        "name": "arms",
    }
    frontier = {
        "type": "scatter",
        "mode": "lines",
        "x": [arm.mean_cost for arm in front],
        "y": [arm.pass_rate for arm in front],
        "line": {"shape": "hv", "color": ARM_COLOUR, "dash": "dot", "width": 1.5},
        "hoverinfo": "skip",
        "name": "Pareto frontier",
    }
    layout = _layout("Pass rate vs cost per trial (Pareto frontier dotted)")
    layout["xaxis"] = {
        "title": {"text": "mean cost per trial (USD, the agent's calls)"},
        "rangemode": "tozero",
    }
    layout["yaxis"] = {"range": [0, 1.05], "tickformat": ".0%", "title": {"text": "pass rate"}}
    return {"data": [frontier, points], "layout": layout}


def figures(comparison: Comparison) -> dict[str, dict[str, Any]]:
    """Every chart of the comparison page, by element id; a number that is not finite (a NaN
    cost) becomes null, which Plotly leaves out and JSON can hold."""
    charts = {"chart-pass-rate": pass_rate_figure(comparison), "chart-cost": cost_figure(comparison)}
    if len(comparison.arms) > 1:
        charts["chart-forest"] = forest_figure(comparison)
    return {name: finite(figure) for name, figure in charts.items()}


def _error_bars(arms: list[ArmSummary], value: str, low: str, high: str) -> dict[str, Any]:
    """Asymmetric error bars from each arm's interval (0 where it has none)."""
    above, below = [], []
    for arm in arms:
        centre, lo, hi = getattr(arm, value), getattr(arm, low), getattr(arm, high)
        known = None not in (centre, lo, hi)
        above.append(hi - centre if known else 0)
        below.append(centre - lo if known else 0)
    return {"type": "data", "symmetric": False, "array": above, "arrayminus": below}


def _interval_name(comparison: Comparison) -> str:
    return f"{round(comparison.confidence * 100)}% cluster-robust ({comparison.cluster})"


def _p_text(p_value: float | None) -> str:
    return "not tested" if p_value is None else f"{p_value:.3g}"


def _layout(title: str) -> dict[str, Any]:
    return {
        "title": {"text": title, "font": {"size": 15}},
        "font": FONT,
        "margin": {"l": 60, "r": 20, "t": 50, "b": 60},
        "height": 340,
        "showlegend": False,
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "#fff",
    }


def history_figure(series: dict[str, list[tuple[str, ArmSummary]]]) -> dict[str, Any]:
    """Each variant's pass rate run after run (`series`: variant -> [(run label, its arm)], oldest
    first), with its interval as error bars: one line per variant."""
    lines = []
    for variant, points in series.items():
        arms = [arm for _, arm in points]
        lines.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": escape(variant),
                "x": [escape(label) for label, _ in points],
                "y": [arm.pass_rate for arm in arms],
                "error_y": _error_bars(arms, "pass_rate", "low", "high"),
                "hovertemplate": f"{escape(variant)} · %{{x}}<br>%{{y:.1%}}<extra></extra>",
            }
        )
    layout = _layout("Pass rate by run (95% interval)")
    layout["yaxis"] = {"range": [0, 1.05], "tickformat": ".0%", "title": {"text": "pass rate"}}
    layout["xaxis"] = {"type": "category", "title": {"text": "run"}}
    return {"data": lines, "layout": layout}
