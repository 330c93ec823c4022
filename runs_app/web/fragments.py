"""The run page's live parts (progress, variants, trials), rendered once per change of a run for
all of a web process's viewers: the run page itself and its streams.

A hundred people watching one run see the same parts; only the CSRF token of their forms
differs (a placeholder, put in per viewer). The streams woken by one change ask for the parts
at once: the first reads and renders, the others wait for its result. A page of a run still
going may get parts up to PAGE_STALE_SECONDS old: its stream sends the current ones as it
opens, so the page is right a moment later, and a run that changes a few times a second is
not rendered again for every page load. Parts of a running run are kept at most KEPT_SECONDS
(they also say which workers are there); a finished run's as long as its state holds.
"""

import threading
import time
from typing import NamedTuple
from urllib.parse import urlencode

from django.db.models import F
from django.middleware.csrf import get_token
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.safestring import mark_safe

from evalsite.db import give_back_connection
from evalsite.keyed_locks import KeyedLocks
from experiments_app.specs.gates import NON_INFERIORITY_MARGIN
from runs_app import control, live
from runs_app.analysis.load import comparison
from runs_app.models import Run, Trial
from runs_app.web.presenters import baseline_problem, run_progress_numbers, variant_rows
from runs_app.web.workers import worker_health

PARTS = ("progress", "variants", "trials")
RUN_TRIAL_ROWS = 50
TRIAL_ROW_FIELDS = (
    "run_id", "variant__slug", "variant__position", "task_version__task__slug", "replicate",
    "dataset_row_id", "status", "attempt", "score", "started_at", "finished_at", "duration_seconds",
    "input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens", "cost_usd",
    "error_category", "timed_out", "budget_exceeded", "stopped_early", "host",
)  # fmt: skip


# The trial table's orders (?sort=): launch order by default, so rows stay put while trials
# finish; each is served by an index of (run, ...) (see Trial.Meta).
TRIAL_SORTS = {
    "": ("launch order", ("pk",)),
    "finished": ("recently finished", (F("finished_at").desc(nulls_last=True), "pk")),
    "slowest": ("slowest", (F("duration_seconds").desc(nulls_last=True), "pk")),
}
# The pager's links in each order (the previous page, the next).
PAGER_WORDS = {
    "": ("← earlier", "later →"), "finished": ("← newer", "older →"), "slowest": ("← slower", "faster →"),
}  # fmt: skip

PAGE_STALE_SECONDS = 1.0
KEPT_SECONDS = 5.0
# A run's state is read once per notice for all of a process's streams of the run (a stream
# woken by the same notice, or re-checking within this long, reuses it).
STATE_REUSE_SECONDS = 0.2
CSRF_PLACEHOLDER = "__evalsite_csrf_token__"
MAX_KEPT = 256


class RunState(NamedTuple):
    status: str
    n_trials: int
    n_queued: int
    n_running: int
    n_passed: int
    n_failed: int
    n_error: int
    n_cancelled: int
    # Bumped by every change to its numbers (tallies, a quarantine): an ended run's parts are
    # rendered again after one.
    tally_version: int = 0

    @property
    def final(self) -> bool:
        return self.status in (Run.Status.FINISHED, Run.Status.CANCELLED)


def trial_rows(run: Run, filters: dict) -> tuple[list[Trial], bool]:
    """One page of the run's current trials, newest finished first; and whether more follow."""
    trials = Trial.objects.for_run(run).current().select_related("variant", "task_version__task")
    if filters.get("variant"):
        trials = trials.filter(variant__slug=filters["variant"])
    if filters.get("task"):
        trials = trials.filter(task_version__task__slug__icontains=filters["task"])
    if filters.get("status"):
        trials = trials.filter(status=filters["status"])
    if filters.get("category"):
        trials = trials.filter(error_category=filters["category"])
    start = ((filters.get("page") or 1) - 1) * RUN_TRIAL_ROWS
    # `pk` ascending, not descending: the (run, -finished_at) index then serves the whole
    # ORDER BY of "finished" and the LIMIT stops early (5 ms instead of 250 ms at 100,000 trials).
    ordered = trials.only(*TRIAL_ROW_FIELDS).order_by(*TRIAL_SORTS[filters.get("sort") or ""][1])
    rows = list(ordered[start : start + RUN_TRIAL_ROWS + 1])
    return rows[:RUN_TRIAL_ROWS], len(rows) > RUN_TRIAL_ROWS


def run_context(run: Run, filters: dict, now=None) -> dict:
    """Everything the live parts of the run page show."""
    trials, has_more = trial_rows(run, filters)
    query = {k: v for k, v in filters.items() if v and k != "page"}
    page = filters.get("page") or 1
    return {
        "run": run,
        "progress": run_progress_numbers(run, now or timezone.now()),
        "error_groups": control.error_groups(run) if run.n_error else [],
        "workers": worker_health(run, now or timezone.now()),
        "variant_rows": variant_rows(run),
        "quarantined": comparison([run], criteria=False).quarantined if run.n_trials else [],
        "baseline_problem": baseline_problem(run),
        "anytime_margin": NON_INFERIORITY_MARGIN,
        "trials": trials,
        "has_more": has_more,
        "page": page,
        "pager_words": PAGER_WORDS[filters.get("sort") or ""],
        "next_query": urlencode({**query, "page": page + 1}),
        "prev_query": urlencode({**query, "page": page - 1}) if page > 1 else "",
        "filter_query": filter_query(filters),
        "sort_query": urlencode({k: v for k, v in query.items() if k != "sort"}),
    }


def filter_query(filters: dict) -> str:
    """The trial table's filters as a query string (the stream and the polling fallback keep them)."""
    query = {k: v for k, v in filters.items() if v and k != "page"}
    page = filters.get("page") or 1
    return urlencode({**query, **({"page": page} if page > 1 else {})})


_lock = threading.Lock()
_states: dict[int, tuple[int, float, RunState | None]] = {}
_state_locks = KeyedLocks(before_wait=give_back_connection)
_parts: dict[tuple, tuple[RunState, float, dict]] = {}
_part_locks = KeyedLocks(before_wait=give_back_connection)


def run_state(run_id: int) -> RunState | None:
    """The run's counts and status (None once it is gone)."""
    version = live.hub().version(f"run:{run_id}")

    def kept() -> tuple | None:
        with _lock:
            hit = _states.get(run_id)
        if hit is not None and hit[0] == version and time.monotonic() - hit[1] < STATE_REUSE_SECONDS:
            return hit
        return None

    if (hit := kept()) is not None:
        return hit[2]
    with _state_locks(run_id):
        if (hit := kept()) is not None:
            return hit[2]
        now = time.monotonic()
        row = Run.objects.filter(pk=run_id).values_list(*RunState._fields).first()
        state = RunState(*row) if row is not None else None
        with _lock:
            if len(_states) >= MAX_KEPT:
                _states.clear()
            _states[run_id] = (version, now, state)
    return state


def live_parts(run_id: int, state: RunState, filters: dict, *, oob: bool) -> dict:
    """{"progress", "variants", "trials": html, "context": what they show} for the run in
    `state` (for a stream, `oob`: each part swaps itself in), its forms holding CSRF_PLACEHOLDER."""
    key = (run_id, oob, tuple(sorted((k, str(v)) for k, v in filters.items())))

    def kept() -> dict | None:
        with _lock:
            hit = _parts.get(key)
        if hit is None:
            return None
        age = time.monotonic() - hit[1]
        if state.final:
            return hit[2] if hit[0] == state else None
        # A running run's parts also show its workers, which change apart from its counts.
        same = hit[0] == state and age < KEPT_SECONDS
        return hit[2] if same or (not oob and age < PAGE_STALE_SECONDS) else None

    if (parts := kept()) is not None:
        return parts
    with _part_locks(key):
        if (parts := kept()) is not None:
            return parts
        with _lock:
            before = _parts.get(key)
        run = Run.objects.select_related("experiment").get(pk=run_id)
        context = {**run_context(run, filters), "oob": oob, "csrf_token": CSRF_PLACEHOLDER}
        parts = {"context": context}  # what they show, for the page around them
        for name in PARTS:
            # A trial table whose rows did not change (the page past the trials in flight) is
            # not rendered again: the same string, which a stream then knows it has sent.
            if name == "trials" and before and _rows(before[2]["context"]) == _rows(context):
                parts[name] = before[2][name]
            else:
                parts[name] = render_to_string(f"runs/run_detail.html#{name}", context)
        with _lock:
            if len(_parts) >= MAX_KEPT:
                _parts.clear()
            _parts[key] = (state, time.monotonic(), parts)
    return parts


# The fields of a trial the table's row shows that change while the run goes on.
ROW_SHOWS = (
    "pk", "status", "attempt", "score", "duration_seconds", "input_tokens", "output_tokens",
    "cache_read_tokens", "cache_creation_tokens", "cost_usd", "host", "timed_out", "budget_exceeded",
    "stopped_early", "error_category",
)  # fmt: skip


def _rows(context: dict) -> tuple:
    """What the trial table shows of its rows (its pager and links depend on the filters, which
    are part of the key)."""
    rows = tuple(tuple(getattr(trial, field) for field in ROW_SHOWS) for trial in context["trials"])
    return rows, context["has_more"]


def forget() -> None:
    """Drop every kept state and part (tests: run ids repeat across test databases)."""
    with _lock:
        _states.clear()
        _parts.clear()


def for_viewer(html: str, request=None, token: str | None = None) -> str:
    """A part with this viewer's CSRF token in its forms."""
    if token is None:
        token = get_token(request) if request is not None else ""
    return mark_safe(html.replace(CSRF_PLACEHOLDER, token))
