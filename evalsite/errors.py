"""The site's 404 and 500 pages: styled HTML, and JSON under /api/ (an API client reads no HTML)."""

import sys

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template.loader import get_template

from evalsite.db import unavailable
from evalsite.overload import unavailable_response


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": f"no API endpoint at {request.path}", "field": None}, status=404)
    return render(request, "404.html", status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    # No database connection, outside a view (a middleware's query): a 503, as in a view.
    if (exc := sys.exc_info()[1]) is not None and (why := unavailable(exc)):
        return unavailable_response(request, why)
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "server error; it has been logged", "field": None}, status=500)
    # No context processors or database: the error may be theirs.
    return HttpResponse(get_template("500.html").render(), status=500)
