"""When the site cannot serve a request now, it says so: 503 with Retry-After, never a 500.

Three places answer that way, with one page (`503.html`, JSON under /api/):

- `Admission`, around the ASGI application: at most WEB_MAX_IN_FLIGHT requests of a web process
  run at once, the others wait their turn in order for up to WEB_QUEUE_SECONDS, then are shed
  ("busy"). Past the database pool's size, more threads only queue for its connections (each
  holding a thread and its memory) and the slowest then fail with the pool's timeout: measured
  on 2 web processes, 50 viewers back to back and 50 live streams gave 151 errors in 414 page
  loads before. Live streams and static files are not counted (a stream holds no connection
  while it waits; whitenoise reads no database).
- `UnavailableMiddleware`: a view that could not get a database connection ("busy": the pool's
  timeout; "unreachable": the database is down, said at once by `evalsite.postgresql.pool`).
- `evalsite.errors.server_error`, for the same errors raised outside a view (a middleware).
"""

import asyncio
import json
import logging
import time

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.template.loader import get_template

from evalsite.db import unavailable

logger = logging.getLogger(__name__)

# Seconds a client is asked to wait before trying again.
RETRY_AFTER = {"busy": 2, "unreachable": 5}
MESSAGES = {
    "busy": "evalsite is busy: more people are loading pages than it serves at once. "
    "Try again in a moment (this page reloads by itself).",
    "unreachable": "evalsite cannot reach its database. Pages come back by themselves within "
    "seconds of the database returning (this page reloads by itself); running trials keep going "
    "and report their results once it is back.",
}
# Shed requests are logged at most this often (a line per request would add to the load).
LOG_EVERY_SECONDS = 10.0


def unavailable_page(why: str, api: bool) -> tuple[bytes, str]:
    """The body and content type of the 503 answer for `why` ("busy" or "unreachable")."""
    if api:
        return json.dumps({"detail": MESSAGES[why], "field": None}).encode(), "application/json"
    html = get_template("503.html").render({"why": why, "message": MESSAGES[why], "retry": RETRY_AFTER[why]})
    return html.encode(), "text/html; charset=utf-8"


def unavailable_response(request: HttpRequest, why: str) -> HttpResponse:
    body, content_type = unavailable_page(why, request.path.startswith("/api/"))
    response = HttpResponse(body, status=503, content_type=content_type)
    response["Retry-After"] = str(RETRY_AFTER[why])
    response["Cache-Control"] = "no-store"
    return response


class UnavailableMiddleware:
    """A view's "no database connection now" becomes the 503 page."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        why = unavailable(exception)
        if why is None:
            return None
        logger.warning("503 %s for %s: %s", why, request.path, exception)
        return unavailable_response(request, why)


class Admission:
    """The ASGI application, with at most `limit` requests in it at once (see the module)."""

    def __init__(self, app, limit: int, wait_seconds: float) -> None:
        self.app, self.limit, self.wait_seconds = app, limit, wait_seconds
        self._slots: asyncio.Semaphore | None = None
        self._shed = 0
        self._logged_at = 0.0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or _exempt(scope["path"]):
            await self.app(scope, receive, send)
            return
        if self._slots is None:  # made in the server's event loop
            self._slots = asyncio.Semaphore(self.limit)
        try:
            await asyncio.wait_for(self._slots.acquire(), self.wait_seconds)
        except TimeoutError:
            await self._refuse(scope, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self._slots.release()

    async def _refuse(self, scope, send) -> None:
        self._shed += 1
        if time.monotonic() - self._logged_at > LOG_EVERY_SECONDS:
            logger.warning(
                "busy: %d requests shed (more than %d at once waited %g s; WEB_MAX_IN_FLIGHT)",
                self._shed, self.limit, self.wait_seconds,
            )  # fmt: skip
            self._logged_at, self._shed = time.monotonic(), 0
        body, content_type = unavailable_page("busy", scope["path"].startswith("/api/"))
        headers = [
            (b"content-type", content_type.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(RETRY_AFTER["busy"]).encode()),
            (b"cache-control", b"no-store"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _exempt(path: str) -> bool:
    return path.endswith("/stream/") or path.startswith("/" + settings.STATIC_URL.lstrip("/"))
