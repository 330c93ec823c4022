"""Unknown pages: a styled 404 for people, JSON for API clients; an empty API body is a 400."""

import pytest


@pytest.mark.django_db
def test_an_unknown_page_is_the_sites_404_and_an_unknown_api_path_answers_json(member_client, client):
    page = member_client.get("/no/such/page/")
    api = client.get("/api/no/such/endpoint")

    assert page.status_code == 404 and "Back to the dashboard" in page.content.decode()
    assert api.status_code == 404 and api["Content-Type"] == "application/json"
    assert "no API endpoint at /api/no/such/endpoint" in api.json()["detail"]


@pytest.mark.django_db
def test_an_api_post_without_a_body_is_a_400_that_says_what_is_missing(member):
    from django.test import Client

    from runs_app.tests.web.builders import smoke_experiment
    from runs_app.tokens import create_token

    _, token = create_token(member, "t")
    url = f"/api/experiments/{smoke_experiment().slug}/runs"
    response = Client().generic("POST", url, b"", HTTP_AUTHORIZATION=f"Bearer {token}")  # as `curl -X POST`

    assert response.status_code == 400, response.content
    assert "needs a JSON body" in response.json()["detail"]


def test_the_site_has_a_favicon():
    from django.conf import settings

    assert (settings.BASE_DIR / "static" / "favicon.svg").is_file()


@pytest.mark.django_db
def test_logins_are_throttled_after_repeated_wrong_passwords(client, member, settings):
    from django.urls import reverse

    member.set_password("right-password-1")
    member.save()
    url = reverse("login")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert client.post(url, {"username": member.username, "password": "wrong"}).status_code == 200
    assert client.post(url, {"username": member.username, "password": "wrong"}).status_code == 429

    locked = client.post(url, {"username": member.username, "password": "right-password-1"})

    assert locked.status_code == 429 and "Too many failed logins" in locked.content.decode()


@pytest.mark.django_db
def test_pages_carry_a_content_security_policy_without_inline_script(member_client):
    policy = member_client.get("/")["Content-Security-Policy"]

    assert "script-src 'self'" in policy and "'unsafe-eval'" not in policy
    assert "frame-ancestors 'none'" in policy and "object-src 'none'" in policy


@pytest.mark.django_db
def test_the_favicon_is_found_where_browsers_look_for_it(client):
    response = client.get("/favicon.ico", follow=True)

    assert response.status_code == 200 and response.redirect_chain == [("/static/favicon.svg", 301)]
    assert response["Content-Type"].startswith("image/svg+xml")
    response.close()
