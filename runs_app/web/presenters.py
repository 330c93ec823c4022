"""What the run and trial pages show, as plain rows: counts, progress and transcript lines.

Agent output is untrusted: these rows carry it as plain strings, and templates render it with
auto-escaping only (no |safe, no mark_safe).
"""

from dataclasses import dataclass
from datetime import datetime

import yaml
from django.db.models import Count, Sum

from evalsite.db import give_back_connection
from evalsite.keyed_locks import Recent
from experiments_app.models import Variant
from experiments_app.specs import agent_kinds
from runs_app.analysis import load, rollup
from runs_app.analysis.load import comparison
from runs_app.analysis.stats.comparison import ArmSummary
from runs_app.models import Run, Trial, TrialEvent, UnitTally

# The lists a team's viewers all load (home, runs, experiments), computed at most once a second
# per web process: a hundred viewers cost one set of queries a second, and a list is at most a
# second behind.
LISTS = Recent(1.0, before_wait=give_back_connection)


@dataclass
class VariantRow:
    variant: Variant
    total: int
    queued: int
    running: int
    passed: int
    failed: int
    error: int
    cancelled: int
    tokens: int
    cost: float
    is_baseline: bool = False
    arm: ArmSummary | None = None  # the comparison's figures: the same on every page

    @property
    def ran(self) -> int:
        """Trials that reached an outcome (a cancelled one never ran: "72/72 done" of a run
        cancelled after 6 said nothing)."""
        return self.passed + self.failed + self.error

    @property
    def pass_rate(self) -> float | None:
        return self.arm.pass_rate if self.arm else None

    @property
    def interval(self) -> tuple[float, float] | None:
        if self.arm is None or self.arm.low is None:
            return None
        return (self.arm.low, self.arm.high)

    @property
    def sequence(self) -> tuple[float, float] | None:
        """The rate's anytime-valid interval over the units finished so far (None before one)."""
        if self.arm is None or not self.arm.cs_units:
            return None
        return (self.arm.cs_low, self.arm.cs_high)

    @property
    def versus(self):
        return self.arm.versus if self.arm else None

    @property
    def bar(self) -> dict | None:
        """The interval band and the estimate as percentages, for the small inline chart."""
        if self.interval is None:
            return None
        low, high = self.interval
        return {"low": round(100 * low, 1), "width": round(100 * (high - low), 1),
                "rate": round(100 * self.pass_rate, 1)}  # fmt: skip


def variant_rows(run: Run) -> list[VariantRow]:
    """Per-variant counts, tokens and cost of the run's current trials, with the comparison's
    rate and interval for each: summed from the unit tallies, with the running trials (at most
    the run's slots) counted apart."""
    rollup.ensure([run])
    sums = ("total", "passed", "failed", "errors", "cancelled", "tokens", "cost")
    stats = {
        row.pop("variant_id"): row
        for row in UnitTally.objects.filter(run=run)
        .values("variant_id")
        .annotate(**{name: Sum(name) for name in sums})
        .order_by()
    }
    running = dict(
        Trial.objects.for_run(run).current().filter(status=Trial.Status.RUNNING)
        .values("variant_id").annotate(n=Count("pk")).values_list("variant_id", "n").order_by()
    ) if run.n_running else {}  # fmt: skip
    baseline = (run.config or {}).get("baseline")
    variants = Variant.objects.filter(pk__in=stats).order_by("position", "pk")
    arms = {arm.variant_slug: arm for arm in comparison([run], criteria=False).arms} if stats else {}
    rows = []
    for v in variants:
        counts = stats[v.pk]
        n_running = running.get(v.pk, 0)
        ended = counts["passed"] + counts["failed"] + counts["errors"] + counts["cancelled"]
        rows.append(
            VariantRow(
                variant=v,
                total=counts["total"],
                queued=counts["total"] - ended - n_running,
                running=n_running,
                passed=counts["passed"],
                failed=counts["failed"],
                error=counts["errors"],
                cancelled=counts["cancelled"],
                tokens=counts["tokens"] or 0,
                cost=counts["cost"] or 0.0,
                is_baseline=v.slug == baseline,
                arm=arms.get(v.slug),
            )  # fmt: skip
        )
    return rows


def baseline_problem(run: Run) -> str:
    """Why the run page compares no variant with the baseline (the comparison's words), or ""."""
    if not run.n_trials:
        return ""
    return comparison([run], criteria=False).baseline_problem


def run_progress_numbers(run: Run, now: datetime) -> dict:
    """Percentages for the progress bar, elapsed time and a linear ETA."""
    total = run.n_trials
    done = run.n_done

    def share(n: int) -> float:
        return round(100 * n / total, 2) if total else 0.0

    started = run.started_at or run.created_at
    elapsed = (run.finished_at or now) - started if started else None
    eta = None
    if elapsed is not None and done and not run.is_final and done < total:
        eta = elapsed * ((total - done) / done)
    return {
        "percent": int(100 * done / total) if total else (100 if run.is_final else 0),
        "segments": [
            (status, share(getattr(run, f"n_{status}")))
            for status in ("passed", "failed", "error", "cancelled", "running")
        ],  # fmt: skip
        "elapsed": elapsed,
        "eta": eta,
        "started": started,
    }


@dataclass
class EventRow:
    """One transcript line, ready to show: every field is plain text (escaped when rendered)."""

    seq: int
    at: datetime
    kind: str
    title: str
    text: str = ""
    body: str = ""
    css: str = ""


def as_text(value) -> str:
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, sort_keys=False, allow_unicode=True, default_flow_style=False).strip()


def _usage_part(key: str, value) -> str:
    if "usd" in key and isinstance(value, int | float):
        return f"cost ${value:.4f}"
    return f"{key.replace('_', ' ')} {value}"


# A simulated conversation's milestones: (title, text) for each.
CONVERSATION_NOTES = {
    "turn": lambda data: (f"turn {data.get('turn')}", ""),
    "criteria_checked": lambda data: (
        f"criteria after turn {data.get('turn')}",
        "passed" if data.get("passed") else "not passed",
    ),
    "conversation_end": lambda data: (
        "conversation ended",
        f"{str(data.get('reason', '')).replace('_', ' ')} after {data.get('turns')} turns",
    ),
}


def event_row(event: TrialEvent) -> EventRow:
    """How one event reads in the transcript; long parts go in `body`, shown collapsed."""
    data = event.data if isinstance(event.data, dict) else {"value": event.data}
    row = EventRow(event.seq, event.at, event.kind, event.kind.replace("_", " "))
    kind = event.kind
    if kind == TrialEvent.Kind.PHASE:
        row.title = str(data.get("phase", "phase"))
        row.text = ", ".join(f"{k}: {v}" for k, v in data.items() if k != "phase" and v not in ("", None))
    elif kind == TrialEvent.Kind.MESSAGE and data.get("role") == "user":  # a simulated user's reply
        row.title = (
            f"user, step {data['atif_step']}"  # an imported ATIF trajectory's user step
            if "atif_step" in data
            else f"user ({data.get('answerer') or 'simulated'}), turn {data.get('turn', '?')}"
        )
        row.text, row.css = as_text(data.get("text", "")), "user"
    elif kind == TrialEvent.Kind.MESSAGE:
        thinking = bool(data.get("thinking") or data.get("reasoning"))
        row.title, row.text = ("thinking" if thinking else "agent"), as_text(data.get("text", ""))
        row.css = "thinking" if thinking else ""
    elif kind == TrialEvent.Kind.TOOL_CALL:
        tool_input = data.get("input") or {}
        preview = tool_input.get("command") if isinstance(tool_input, dict) else None
        row.title, row.text = str(data.get("name", "tool")), as_text(preview or tool_input)[:200]
        row.body = as_text(tool_input)
    elif kind == TrialEvent.Kind.TOOL_RESULT:
        row.title = f"{data.get('name', 'tool')} result" + (" (error)" if data.get("is_error") else "")
        row.body = as_text(data.get("output", ""))
        row.text = row.body[:200]
        row.css = "is-error" if data.get("is_error") else ""
    elif kind == TrialEvent.Kind.OUTPUT and "command" in data:
        row.title = f"{data.get('step', 'command')}: {data.get('command', '')}"
        row.text = "timed out" if data.get("timed_out") else f"exit {data.get('exit_code')}"
        row.body = (
            "\n".join(part for part in (data.get("stdout", ""), data.get("stderr", "")) if part)
            or "(no output)"
        )
    elif kind == TrialEvent.Kind.USAGE:
        parts = [_usage_part(k, v) for k, v in data.items() if v not in (None, 0, "") and k != "role"]
        row.text = " · ".join(parts) or "nothing reported"
        if data.get("role"):  # the answerer's or the judge's call, not the agent's
            row.text = f"{data['role']}: {row.text}"
    elif kind == TrialEvent.Kind.ERROR:
        row.title = str(data.get("category") or "error")
        row.text = as_text(data.get("message", data))
    elif kind == TrialEvent.Kind.SYSTEM and data.get("subtype") in CONVERSATION_NOTES:
        row.title, row.text = CONVERSATION_NOTES[data["subtype"]](data)
    else:  # output lines, system notes, anything new
        text = data.get("text") or data.get("message")
        row.title = str(data.get("subtype") or kind)
        row.text = as_text(text) if text is not None else ""
        rest = {k: v for k, v in data.items() if k not in ("text", "message", "subtype", "atif_step")}
        row.body = as_text(rest) if rest and kind != TrialEvent.Kind.OUTPUT else ""
    return row


class TranscriptFolder:
    """The transcript as read, built event by event (the trial page, and its live stream batch
    by batch): an event that repeats the one before it of its kind word for word (the agent's
    last usage report and the run's total, an error the stream and the outcome both state) is
    shown once; a tool's output goes into its call's item; usage is one summary item.

    `add(events)` returns the new items and the items shown before that changed (a call that
    got its output, the usage summary): the stream sends those again to replace them."""

    def __init__(self) -> None:
        self.last_text: dict[str, str] = {}
        self.calls: dict[str, EventRow] = {}
        self.model_calls: list[str] = []
        self.usage: EventRow | None = None
        self.summary: EventRow | None = None

    def add(self, events: list[TrialEvent]) -> tuple[list[EventRow], list[EventRow]]:
        new: list[EventRow] = []
        changed: list[EventRow] = []
        usage_changed = False
        for event in events:
            row = event_row(event)
            if row.kind == TrialEvent.Kind.USAGE:
                if isinstance(event.data, dict) and event.data.get("source") == "gateway":
                    self.model_calls.append(row.text)
                else:
                    self.usage = row
                usage_changed = True
                continue
            if row.kind == TrialEvent.Kind.ERROR and self.last_text.get(row.kind) == row.text:
                continue
            self.last_text[row.kind] = row.text
            call_id = str(event.data.get("id") or "") if isinstance(event.data, dict) else ""
            if row.kind == TrialEvent.Kind.TOOL_CALL and call_id:
                self.calls[call_id] = row
            elif row.kind == TrialEvent.Kind.TOOL_RESULT and call_id in self.calls:
                call = self.calls.pop(call_id)
                failed = "(error)" in row.title
                label = "error" if failed else "output"
                call.body = f"{call.body}\n\n── {label} ──\n{row.body or '(no output)'}".strip()
                call.css = (call.css + " is-error").strip() if failed else call.css
                call.title += " → error" if failed else ""
                if not any(call is row for row in new):
                    changed.append(call)
                continue
            new.append(row)
        if usage_changed:
            fresh = self.summary is None
            self.summary = self._usage_summary(events[-1])
            (new if fresh else changed).append(self.summary)
        return new, changed

    def _usage_summary(self, last: TrialEvent) -> EventRow:
        base = self.usage or EventRow(last.seq, last.at, TrialEvent.Kind.USAGE, "usage")
        # The item's id is "event-usage" whatever its seq (the template), so a stream replaces it.
        summary = EventRow(base.seq, base.at, TrialEvent.Kind.USAGE, "usage", base.text, base.body, base.css)
        if self.model_calls:
            summary.text = summary.text or f"{len(self.model_calls)} model calls"
            summary.body = "\n".join(f"call {i}: {text}" for i, text in enumerate(self.model_calls, 1))
        return summary


def transcript_rows(events: list[TrialEvent]) -> list[EventRow]:
    """The whole transcript folded (see TranscriptFolder), the usage summary last."""
    folder = TranscriptFolder()
    new, _ = folder.add(events)
    return [row for row in new if row is not folder.summary] + ([folder.summary] if folder.summary else [])


def config_for_kind(config: dict, lineage: dict | None = None) -> tuple[dict, list[str]]:
    """The resolved config with only the agent options its kind reads, and the keys left out.
    The builtin layer's agent options are Claude Code's defaults: they reach every kind's config
    (coder-eval resolves so, and the fingerprint covers them), where they mean nothing; so they
    are left out of another kind's, `model` too (a command agent showed a Claude model)."""
    agent = config.get("agent")
    kind = agent.get("type") if isinstance(agent, dict) else None
    if kind not in agent_kinds.KIND_OPTIONS:
        return config, []
    read = agent_kinds.COMMON_OPTIONS | agent_kinds.KIND_OPTIONS[kind]
    builtin = set()
    if kind != agent_kinds.DEFAULT_KIND:
        builtin = {key for key in agent if key != "type" and (lineage or {}).get(f"agent.{key}") == "builtin"}
    kept = {k: v for k, v in agent.items() if k in read and k not in builtin}
    return {**config, "agent": kept}, sorted(set(agent) - set(kept))


def attach_variant_rates(runs: list[Run]) -> list[Run]:
    """Set `run.variant_rates` = [(variant, rate, graded units)] on each run, in one query: the
    comparison's figure per variant (`load.variant_rates`), never one rate pooled over arms that
    differ on purpose."""
    rollup.ensure(runs)
    rates = load.variant_rates([run.pk for run in runs])
    for run in runs:
        run.variant_rates = rates[run.pk]
    return runs


def attach_last_run_rates(experiments: list) -> list:
    """Set `experiment.last_run_rates` (as `attach_variant_rates`) for experiments annotated
    `with_last_run`."""
    ids = [experiment.last_run_pk for experiment in experiments if experiment.last_run_pk]
    runs = {run.pk: run for run in attach_variant_rates(list(Run.objects.filter(pk__in=ids)))}
    for experiment in experiments:
        run = runs.get(experiment.last_run_pk)
        experiment.last_run_rates = run.variant_rates if run is not None else []
    return experiments
