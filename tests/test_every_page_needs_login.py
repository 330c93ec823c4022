"""Walk every URL pattern: an anonymous visitor gets the login page (or a 401 from the API)."""

import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

SAMPLE_ARGS = {"int": "1", "slug": "demo", "str": "demo", "path": "demo"}
PUBLIC = {"login", "logout", "favicon"}


def _patterns(resolver: URLResolver, prefix: str = ""):
    for entry in resolver.url_patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            if route.startswith("admin/"):
                continue  # the admin has its own login, tested elsewhere
            yield from _patterns(entry, route)
        elif isinstance(entry, URLPattern):
            yield route, entry.name


def _sample(match: re.Match) -> str:
    converter, name = match.group(1), match.group(2)
    return "1" if name.endswith("id") else SAMPLE_ARGS.get(converter or "str", "1")


def _concrete(route: str) -> str:
    route = re.sub(r"<(?:(\w+):)?(\w+)>", _sample, route)
    return "/" + route.lstrip("^").rstrip("$")


ROUTES = sorted(set(_patterns(get_resolver())))


def test_the_walk_finds_the_dashboard_and_the_api():
    urls = {_concrete(route) for route, _ in ROUTES}
    assert {"/", "/runs/1/", "/runs/1/compare/", "/account/", "/api/runs/1"} <= urls


@pytest.mark.django_db
@pytest.mark.parametrize(("route", "name"), ROUTES)
def test_every_page_needs_a_login(client, route, name):
    if name in PUBLIC or route.endswith("openapi.json"):
        return  # the login page itself, and the public API schema (it describes, holds no data)
    url = _concrete(route)
    for method in (client.get, client.post):
        response = method(url)
        if url.startswith("/api/") and not url.startswith("/api/docs"):
            # 404: the API's bare root, which serves nothing.
            assert response.status_code in (401, 404, 405), (method.__name__, url, response.status_code)
        else:
            assert response.status_code in (302, 405), (method.__name__, url, response.status_code)
            if response.status_code == 302:
                assert response["Location"].startswith("/login/"), (url, response["Location"])
