"""The run page's live updates: one Server-Sent Events stream, and the polling fallback.

The stream waits on the web process's one listener (`runs_app.live`): a worker's change to the
run wakes it, it checks the run's counts and status, and sends the page's live fragments
(progress, variants, trials) as out-of-band swaps when they changed. It holds no database
connection while it waits (each check returns its connection at once), and re-checks every
few seconds in case a notice was missed. It ends once the run is final.
"""

import logging
import time
from collections.abc import AsyncIterator, Iterator

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.core.handlers.asgi import ASGIRequest
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.middleware.csrf import get_token
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from runs_app import live
from runs_app.models import Trial, TrialEvent
from runs_app.web.fragments import PARTS, RunState, for_viewer, live_parts, run_state
from runs_app.web.presenters import TranscriptFolder
from runs_app.web.runs import get_run_for_user, trial_filters

logger = logging.getLogger(__name__)

# Without a notice, a stream still checks this often (a missed notice costs at most this).
STREAM_CHECK_SECONDS = 5.0
# A comment line now and then lets proxies keep the connection and lets a WSGI server notice
# a browser that left (the write fails).
STREAM_KEEPALIVE_SECONDS = 15.0
# One connection's lifetime; the browser reconnects by itself, so a tab left open holds no
# server thread for hours.
STREAM_MAX_SECONDS = 600.0


def run_stream_update(
    run_id: int,
    last_state: RunState | None,
    filters: dict | None = None,
    request: HttpRequest | None = None,
    csrf_token: str | None = None,
    sent: dict | None = None,
) -> tuple[str | None, RunState | None]:
    """One check of the run page's stream: the out-of-band fragments to send when the run's
    counts or status changed since `last_state` (None when nothing changed), and the new state.
    The state is None when the run no longer exists. `sent` holds what this stream sent of
    each part: a part unchanged since is not sent again. With `sent`, parts that change while
    the counts do not (the banners: no worker, the broker unreachable) are sent too, within
    fragments.KEPT_SECONDS."""
    state = run_state(run_id)
    if state is None:
        return None, None
    if state == last_state and sent is None:
        return None, state
    parts = live_parts(run_id, state, filters or {}, oob=True)
    # (A kept part is the very same string: `!=` then costs nothing.)
    changed = [parts[name] for name in PARTS if sent is None or sent.get(name) != parts[name]]
    if sent is not None:
        sent.update({name: parts[name] for name in PARTS})
    if not changed:
        return None, state
    return for_viewer("".join(changed), request, csrf_token), state


def sse_event(name: str, data: str) -> bytes:
    """One Server-Sent Event; every line of `data` gets its own `data:` field."""
    lines = "".join(f"data: {line}\n" for line in (data.splitlines() or [""]))
    return f"event: {name}\n{lines}\n".encode()


class RunStream:
    """The run page's event stream, one check at a time, for the sync (WSGI) and async (ASGI)
    generators below: it ends once the run is final."""

    def __init__(self, run_id: int, filters: dict, request: HttpRequest | None = None):
        self.run_id, self.filters, self.request = run_id, filters, request
        self.csrf_token = get_token(request) if request is not None else ""
        self.state: RunState | None = None
        self.sent: dict[str, str] = {}
        self.done = False
        self.started = self.last_sent = time.monotonic()

    def step(self) -> bytes:
        html, self.state = run_stream_update(
            self.run_id, self.state, self.filters, csrf_token=self.csrf_token, sent=self.sent
        )
        now = time.monotonic()
        out = b""
        if html is not None:
            out, self.last_sent = sse_event("update", html), now
        if self.state is None or self.state.final:
            # The page closes its EventSource on "done"; otherwise it would reconnect forever.
            out += sse_event("done", "end")
            self.done = True
        elif now - self.started > STREAM_MAX_SECONDS:
            self.done = True
        elif not out and now - self.last_sent > STREAM_KEEPALIVE_SECONDS:
            out, self.last_sent = b": keep-alive\n\n", now
        return out


def _checked(stream: "RunStream | TrialStream") -> bytes:
    """One check, its database connection given back at once: an idle stream holds none. A
    check that finds no connection (a busy pool, a database outage) sends nothing: the stream
    rides it out and checks again at the next notice or STREAM_CHECK_SECONDS."""
    try:
        return stream.step()
    except DatabaseError as exc:
        logger.info("stream check skipped: %s", exc)
        return b""
    finally:
        if not connection.in_atomic_block:  # (a test's transaction is not ours to end)
            connection.close()


@login_required
@require_GET
def run_stream(request: HttpRequest, run_id: int) -> StreamingHttpResponse:
    """The run page's one stream. Under ASGI (uvicorn) an async generator, so a waiting stream
    holds no thread; under WSGI (the dev server, the test client) a sync one. Each server
    would otherwise read the other kind to its end before sending anything."""
    run = get_run_for_user(request, run_id)
    _, filters = trial_filters(request)
    stream = RunStream(run.pk, filters, request)
    key = f"run:{stream.run_id}"
    events = _async_loop(stream, key) if isinstance(request, ASGIRequest) else _sync_loop(stream, key)
    return _streaming(events)


def _streaming(events) -> StreamingHttpResponse:
    """The response of a stream; the view's own connection is given back first (the request
    ends only when the stream does, and Django returns connections at a request's end)."""
    if not connection.in_atomic_block:
        connection.close()
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx would buffer the stream
    return response


class TrialStream:
    """The trial page's transcript, streamed: the events after `after`, as they are written,
    until the trial ends (then an "ended" note and "done")."""

    def __init__(self, trial_id: int, after: int, request: HttpRequest | None = None):
        self.trial_id, self.after, self.request = trial_id, after, request
        self.done = False
        self.last_sent = time.monotonic()
        self.folder: TranscriptFolder | None = None

    def step(self) -> bytes:
        status = Trial.objects.filter(pk=self.trial_id).values_list("status", flat=True).first()
        if self.folder is None:
            # Folded as the page folded what it shows (a tool's output then joins its call there).
            folder = TranscriptFolder()
            folder.add(list(TrialEvent.objects.filter(trial_id=self.trial_id, seq__lte=self.after)))
            self.folder = folder
        events = list(
            TrialEvent.objects.filter(trial_id=self.trial_id, seq__gt=self.after).order_by("seq")[:500]
        )
        out = b""
        if events:
            self.after = events[-1].seq
            new, changed = self.folder.add(events)
            html = render_to_string(
                "runs/trial_detail.html#event_items",
                {"events": new + changed, "replaced": changed, "streamed": True},
                request=self.request,
            )
            out = sse_event("events", html)
        if status is None or status in Trial.FINAL_STATUSES:
            if len(events) < 500:  # every event sent: say it ended, then close
                note = f'· {status or "gone"}: <a href="">reload</a> for its criteria and diff'
                out += sse_event("ended", note) + sse_event("done", "end")
                self.done = True
        elif not out and time.monotonic() - self.last_sent > STREAM_KEEPALIVE_SECONDS:
            out = b": keep-alive\n\n"
        if out:
            self.last_sent = time.monotonic()
        return out


def _sync_loop(stream, key: str) -> Iterator[bytes]:
    listener = live.hub()
    yield b"retry: 2000\n\n"
    while True:
        since = listener.version(key)
        chunk = _checked(stream)
        if chunk:
            yield chunk
        if stream.done:
            return
        listener.wait_sync(key, STREAM_CHECK_SECONDS, since=since)


async def _async_loop(stream, key: str) -> AsyncIterator[bytes]:
    listener = live.hub()
    # Off the request's own thread: checks of many streams run side by side in the pool.
    check = sync_to_async(_checked, thread_sensitive=False)
    yield b"retry: 2000\n\n"
    while True:
        since = listener.version(key)
        chunk = await check(stream)
        if chunk:
            yield chunk
        if stream.done:
            return
        await listener.wait(key, STREAM_CHECK_SECONDS, since=since)


@login_required
@require_GET
def trial_stream(request: HttpRequest, run_id: int, trial_id: int) -> StreamingHttpResponse:
    get_run_for_user(request, run_id)
    trial = get_object_or_404(Trial.objects.only("pk"), pk=trial_id, run_id=run_id)
    try:
        after = max(0, int(request.GET.get("after", 0)))
    except ValueError:
        after = 0
    stream = TrialStream(trial.pk, after, request)
    key = f"trial:{stream.trial_id}"
    events = _async_loop(stream, key) if isinstance(request, ASGIRequest) else _sync_loop(stream, key)
    return _streaming(events)


@login_required
@require_GET
def run_progress(request: HttpRequest, run_id: int) -> HttpResponse:
    """Polling fallback when the stream is unavailable: the same fragments; 286 stops htmx polling."""
    run = get_run_for_user(request, run_id)
    _, filters = trial_filters(request)
    html, state = run_stream_update(run.pk, None, filters, request)
    return HttpResponse(html, status=286 if state is None or state.final else 200)
