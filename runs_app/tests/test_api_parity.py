"""What the site shows, the API gives: runs listed and filtered, comparisons as the pages' JSON,
the same token on every download, docs in the user's words."""

import json
import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from runs_app.models import Run
from runs_app.tests.web.builders import finish_run, launched_run, smoke_experiment
from runs_app.tokens import create_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def token(member):
    return create_token(member, "ci")[1]


def get(client, url: str, token: str | None = None, **params):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return client.get(url, params, **headers)


@pytest.fixture
def three_runs(member):
    experiment = smoke_experiment()
    first = finish_run(launched_run(member, experiment), ["passed", "failed"])
    second = finish_run(launched_run(member, experiment), ["passed", "passed", "failed"])
    third = launched_run(member, experiment)  # still queued
    Run.objects.filter(pk=first.pk).update(created_at=timezone.now() - timedelta(days=3))
    return first, second, third


def test_it_lists_runs_newest_first_with_their_counts(client, token, three_runs):
    first, second, third = three_runs

    response = get(client, "/api/runs", token)

    assert response.status_code == 200
    data = response.json()
    assert data["count"] == 3 and data["next_page"] is None
    assert [item["id"] for item in data["items"]] == [third.pk, second.pk, first.pk]
    item = data["items"][1]
    assert item["experiment"] == "smoke" and item["status"] == "finished"
    assert item["counts"]["passed"] == second.n_passed and item["started_by"] == "bob"
    assert item["comparison_url"] == f"/api/runs/{second.pk}/comparison"


def test_it_filters_runs_by_experiment_status_and_date(client, token, three_runs):
    first, second, third = three_runs
    ids = lambda **params: [item["id"] for item in get(client, "/api/runs", token, **params).json()["items"]]  # noqa: E731

    assert ids(status="queued") == [third.pk]
    assert ids(status="finished") == [second.pk, first.pk]
    assert ids(experiment="nope") == []
    assert ids(experiment="smoke", status="finished") == [second.pk, first.pk]
    today = timezone.localdate()
    assert ids(since=today.isoformat()) == [third.pk, second.pk]
    assert ids(until=(today - timedelta(days=1)).isoformat()) == [first.pk]
    assert ids(since=(timezone.now() - timedelta(days=4)).isoformat()) == [third.pk, second.pk, first.pk]
    page = get(client, "/api/runs", token, page_size=2).json()
    assert page["next_page"] == 2 and len(page["items"]) == 2
    assert get(client, "/api/runs", token, status="bogus").status_code == 422
    assert get(client, "/api/runs").status_code == 401


def test_a_runs_comparison_is_the_pages_json_download(client, token, three_runs):
    _, second, _ = three_runs

    api = get(client, f"/api/runs/{second.pk}/comparison", token)
    page = get(client, reverse("run_compare", args=[second.pk]), token, format="json")

    assert api.status_code == 200 and page.status_code == 200
    assert api.json() == json.loads(page.content)
    data = api.json()
    assert data["baseline"] == "no-op" and [arm["arm"] for arm in data["arms"]] == ["reference", "no-op"]
    rebased = get(client, f"/api/runs/{second.pk}/comparison", token, baseline="reference")
    assert rebased.json()["baseline"] == "reference"
    refused = get(client, f"/api/runs/{second.pk}/comparison", token, baseline="nobody")
    assert refused.status_code == 400 and refused.json()["field"] == "baseline"
    assert "arms: reference, no-op" in refused.json()["detail"]


def test_a_comparison_of_runs_is_the_pages_json_download(client, token, three_runs):
    first, second, third = three_runs
    url = f"/api/experiments/smoke/comparison?runs={first.pk}&runs={second.pk}"

    api = get(client, url, token)
    page = get(client, reverse("experiment_compare", args=["smoke"]), token, runs=f"{first.pk},{second.pk}",
               format="json")  # fmt: skip

    assert api.status_code == 200, api.content
    assert api.json() == json.loads(page.content)
    assert [run["id"] for run in api.json()["runs"]] == [first.pk, second.pk]
    assert f"reference@{first.pk}" in {arm["arm"] for arm in api.json()["arms"]}
    latest = get(client, "/api/experiments/smoke/comparison", token).json()
    assert [run["id"] for run in latest["runs"]] == [second.pk, third.pk]
    missing = get(client, "/api/experiments/smoke/comparison?runs=999999", token)
    assert missing.status_code == 404 and "not runs of smoke: 999999" in missing.json()["detail"]


def test_a_token_opens_every_download_but_never_a_session(client, token, three_runs):
    _, second, _ = three_runs
    compare = reverse("run_compare", args=[second.pk])

    assert get(client, compare, format="json").status_code == 302  # no token: the sign-in page
    for fmt, table in (("json", "summary"), ("csv", "summary"), ("csv", "trials"), ("json", "trials")):
        response = get(client, compare, token, format=fmt, table=table)
        assert response.status_code == 200, (fmt, table)
        assert "attachment" in response["Content-Disposition"]
    assert get(client, reverse("experiment_yaml", args=["smoke"]), token).status_code == 200
    assert "sessionid" not in client.cookies

    bad = get(client, compare, "evs_not-a-token", format="json")
    assert bad.status_code == 401 and bad["WWW-Authenticate"] == "Bearer"
    assert bad.json()["detail"] == "invalid or revoked API token"
    # A token changes nothing: a POST still needs a signed-in session (and its CSRF token).
    cancel = client.post(reverse("run_cancel", args=[second.pk]), HTTP_AUTHORIZATION=f"Bearer {token}")
    assert cancel.status_code == 302 and cancel["Location"].startswith(reverse("login"))


INTERNAL = re.compile(
    r"runs_app|experiments_app|\w+\.py\b|ensure_controllable|rollup|\btall(y|ies)\b|django|ninja|to_dict"
)


def test_the_api_docs_speak_the_users_words(client, member):
    schema = client.get("/api/openapi.json").content.decode()

    assert not INTERNAL.findall(schema), sorted(set(INTERNAL.findall(schema)))
    operations = json.loads(schema)["paths"]
    new = {"/api/runs", "/api/runs/{run_id}/comparison", "/api/experiments/{slug}/comparison"}
    assert new <= set(operations)
    assert operations["/api/runs"]["get"]["operationId"] == "list_runs"


def test_every_page_links_the_api_docs(member_client):
    page = member_client.get(reverse("home")).content.decode()

    assert f'href="{reverse("api:openapi-view")}"' in page and ">API</a>" in page
