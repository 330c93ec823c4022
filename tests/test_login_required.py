import pytest
from django.urls import reverse


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url",
    [
        "/",
        "/experiments/",
        "/experiments/demo/",
        "/runs/1/",
        "/runs/1/trials/1/",
    ],
)
def test_it_redirects_anonymous_users_to_login(client, url):
    response = client.get(url)

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


@pytest.mark.django_db
def test_it_serves_the_login_page(client):
    response = client.get(reverse("login"))

    assert response.status_code == 200
    assert b'name="password"' in response.content
    assert b"csrfmiddlewaretoken" in response.content


@pytest.mark.django_db
def test_it_shows_the_home_page_to_a_member(member_client):
    response = member_client.get("/")

    assert response.status_code == 200
    assert b"Recent runs" in response.content and b"No runs yet" in response.content


@pytest.mark.django_db
def test_it_keeps_the_admin_behind_staff_login(member_client):
    response = member_client.get("/admin/")

    assert response.status_code == 302
