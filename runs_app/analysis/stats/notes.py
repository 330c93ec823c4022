"""What a comparison says in words beside its numbers: warnings, and why a test was not run.

Pure (no Django); `analysis.compare` calls it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from runs_app.analysis.stats.comparison import Arm, ArmSummary, Comparison, ComparisonData, Unit

# Below this many clusters an interval leans on its floor and the t quantile's width.
FEW_CLUSTERS = 10
# Warnings list this many names, then "and N more".
LISTED = 10


def untested_reason(data: ComparisonData, baseline: Arm, arm: Arm, units: list[Unit]) -> str:
    """Why no test compares `arm` with `baseline`, or "" when one is valid.

    Across two runs a difference may come from what changed between them rather than from
    the variant: a new version of a task, or the same variant run with another configuration.
    """
    if arm.run_id == baseline.run_id:
        return ""
    changed = sorted(
        {
            unit.task.slug
            for unit in units
            if data.digests.get((arm.run_id, unit.task.task_id))
            and data.digests.get((baseline.run_id, unit.task.task_id))
            and data.digests[(arm.run_id, unit.task.task_id)]
            != data.digests[(baseline.run_id, unit.task.task_id)]
        }
    )
    if changed:
        return (
            f"tasks changed between run #{baseline.run_id} and run #{arm.run_id} ({_names(changed)}): "
            "the difference is shown, not tested"
        )
    if arm.variant_slug == baseline.variant_slug:
        differ = sorted(
            {
                unit.label
                for unit in units
                if _fingerprints(data, baseline, unit)
                and _fingerprints(data, arm, unit)
                and _fingerprints(data, baseline, unit) != _fingerprints(data, arm, unit)
            }
        )
        if differ:
            return (
                f"{arm.variant_slug} ran with another configuration in run #{arm.run_id} "
                f"({_names(differ)}): the difference is shown, not tested"
            )
    return ""


def decision_words(decided: str, baseline: str, alpha: float, margin: float) -> str:
    """What a Δ's anytime-valid interval lets a team do, in words (`compare.decision`)."""
    stop = f"the run may stop now with its error rate still at most {alpha:g}"
    return {
        "better": f"decided: better than {baseline} ({stop})",
        "worse": f"decided: worse than {baseline} ({stop})",
        "not worse": f"decided: not worse than {baseline} by {margin * 100:g} pp or more ({stop})",
    }.get(decided, "undecided: keep it running")


def anytime_words(arm: ArmSummary, baseline: str, confidence: float) -> str:
    """An arm's anytime-valid intervals (confidence sequences) in one line: what a team watching
    a run that is still going may read and stop on (`evalrun`, reports)."""
    level = f"{round(confidence * 100)}%"
    text = (
        f"{arm.label}: pass rate in [{arm.cs_low:.1%}, {arm.cs_high:.1%}] ({level} anytime-valid, "
        f"{arm.cs_units} finished unit{'s' if arm.cs_units != 1 else ''})"
    )
    versus = arm.versus
    if versus is not None:
        text += (
            f"; Δ vs {baseline} in [{versus.cs_low * 100:+.1f}, {versus.cs_high * 100:+.1f}] pp "
            f"({versus.cs_units} paired unit{'s' if versus.cs_units != 1 else ''}): "
            + decision_words(versus.decided, baseline, 1 - confidence, versus.margin)
        )
    return text


def baseline_problem(data: ComparisonData, missing: str, baseline: ArmSummary | None) -> str:
    """Why nothing can be compared with the baseline: it has no trial in the runs compared, or
    none of its trials was graded. "" when it can be."""
    run = data.runs[0].pk if data.runs else None
    if missing:
        return (
            f"The baseline, {missing}, has no trial in run #{run}: no variant is compared with it, and "
            "none with another in its place. Choose a baseline in the form above, or run it."
        )
    if baseline is None or baseline.units:
        return ""
    ended = [
        f"{count} {what}"
        for count, what in (
            (baseline.infra_errors, "ended in infrastructure errors"),
            (baseline.cancelled, "cancelled"),
            (baseline.pending, "not finished"),
        )
        if count
    ]
    return (
        f"The baseline, {baseline.label}, has no graded trial ({', '.join(ended) or 'no trial'}): no Δ "
        "can be computed against it. Retry its errors or finish it, or choose another baseline."
    )


def warnings(data: ComparisonData, result: Comparison, units: list[Unit]) -> list[str]:
    notes = [result.baseline_problem] if result.baseline_problem else []
    for run in data.runs:
        if not run.is_final:
            notes.append(
                f"Run #{run.pk} is {run.status}: these figures will change as trials finish; "
                "p-values are shown once it has ended."
            )
    for arm in result.arms:
        if arm.not_comparable:
            notes.append(
                f"Not comparable: in {arm.label}, trials of {_names(arm.not_comparable)} ran with "
                "different configurations (their fingerprints differ)."
            )
        if 0 < arm.clusters < FEW_CLUSTERS:
            notes.append(
                f"{arm.label} has {arm.clusters} cluster{'s' if arm.clusters != 1 else ''} "
                f"({result.cluster}): with fewer than {FEW_CLUSTERS} the interval rests on few "
                "independent draws; add tasks to narrow it."
            )
        versus = arm.versus
        if (
            versus
            and versus.errors_differ
            and versus.delta_if_errors_fail is not None
            and versus.delta_if_errors_fail_low is not None
            and versus.delta_if_errors_fail_high is not None
        ):
            low, high = versus.delta_if_errors_fail_low * 100, versus.delta_if_errors_fail_high * 100
            notes.append(
                f"{arm.label} hits infrastructure errors on {versus.arm_error_share:.0%} of its trials "
                f"against {versus.baseline_error_share:.0%} for the baseline (sign-flip p = "
                f"{versus.error_p:.2g}): its pass rate leaves out different trials. With every error "
                f"counted as a fail, Δ is {versus.delta_if_errors_fail * 100:+.1f} pp "
                f"[{low:+.1f}, {high:+.1f}]."
            )
        if versus and versus.untested and data.runs and all(run.is_final for run in data.runs):
            notes.append(f"{arm.label} against the baseline: {versus.untested}.")
    if len(data.runs) > 1:
        notes += _changes_between_runs(data, units)
    return notes


def _changes_between_runs(data: ComparisonData, units: list[Unit]) -> list[str]:
    """Tasks whose bundle, or whose resolved config and grader, differ between the runs."""
    first = data.runs[0].pk
    task_changed: dict[int, set[str]] = defaultdict(set)
    config_changed: dict[int, set[str]] = defaultdict(set)
    arms_by_slug = defaultdict(list)
    for arm in data.arms:
        arms_by_slug[arm.variant_slug].append(arm)
    for run in data.runs[1:]:
        for unit in units:
            task = unit.task
            old, new = data.digests.get((first, task.task_id)), data.digests.get((run.pk, task.task_id))
            if old and new and old != new:
                task_changed[run.pk].add(task.slug)
                continue
            for same in arms_by_slug.values():
                before = next((a for a in same if a.run_id == first), None)
                after = next((a for a in same if a.run_id == run.pk), None)
                if before and after and _fingerprints(data, before, unit) != _fingerprints(data, after, unit):
                    config_changed[run.pk].add(task.slug)
                    break
    found = [
        f"Task changed between run #{first} and run #{run_id}: {_names(sorted(slugs))} (a new task "
        "version: its prompt, files or grader differ)."
        for run_id, slugs in task_changed.items()
    ]
    found += [
        f"Configuration or grader changed between run #{first} and run #{run_id} for "
        f"{_names(sorted(slugs))} (same task version, different trial fingerprints)."
        for run_id, slugs in config_changed.items()
    ]
    return found + _identity_changes(data, arms_by_slug)


def _identity_changes(data: ComparisonData, arms_by_slug: dict[str, list[Arm]]) -> list[str]:
    """What ran a variant's trials, component by component, where it differs between the first
    run and another (lux's run identity): "agent: claude-code 2.1.190 -> claude-code 2.1.197"."""
    first = data.runs[0].pk
    found = []
    for slug, same in arms_by_slug.items():
        before = next((a for a in same if a.run_id == first), None)
        for after in (a for a in same if a.run_id != first):
            if before is None:
                continue
            old = data.components.get((first, before.variant_id)) or {}
            new = data.components.get((after.run_id, after.variant_id)) or {}
            changes = [
                _component_change(name, old[name], new[name])
                for name in sorted(set(old) & set(new))
                if set(old[name]) != set(new[name])
            ]
            if changes:
                found.append(
                    f"What ran {slug} changed between run #{first} and run #{after.run_id}: "
                    + "; ".join(changes)
                    + "."
                )
    return found


def _component_change(name: str, old: dict[str, Any], new: dict[str, Any]) -> str:
    """One component's values before and after; a mapping (the environment) by its keys."""
    if all(isinstance(v, dict) for v in [*old.values(), *new.values()]):
        keys = sorted({key for value in [*old.values(), *new.values()] for key in value})
        parts = []
        for key in keys:
            was = sorted({str(value.get(key, "none")) for value in old.values()})
            now = sorted({str(value.get(key, "none")) for value in new.values()})
            if was != now:
                parts.append(f"{name}.{key}: {' | '.join(was)} -> {' | '.join(now)}")
        return "; ".join(parts) or f"{name} changed"
    was, now = sorted(map(str, old.values())), sorted(map(str, new.values()))
    return f"{name}: {' | '.join(was)} -> {' | '.join(now)}"


def _fingerprints(data: ComparisonData, arm: Arm, unit: Unit) -> tuple[str, str] | None:
    cell = data.cells.get((arm.key, *unit.key))
    return cell.fingerprints if cell else None


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:LISTED])
    return shown if len(names) <= LISTED else f"{shown} and {len(names) - LISTED} more"
