"""API tokens: creation, verification, revocation, the account page and the admin."""

import hashlib

import pytest
from django.urls import reverse

from runs_app.models import ApiToken
from runs_app.tokens import create_token, revoke_token, verify_token

pytestmark = pytest.mark.django_db


def test_it_stores_only_the_sha256_of_a_new_token(member):
    token, raw = create_token(member, "ci")
    token.refresh_from_db()
    assert token.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert raw.startswith(token.prefix) and len(token.prefix) == 12
    stored = " ".join(str(v) for v in ApiToken.objects.values_list().get(pk=token.pk))
    assert raw not in stored


def test_it_makes_a_different_token_each_time(member):
    raws = {create_token(member, "x")[1] for _ in range(5)}
    assert len(raws) == 5


def test_it_verifies_a_live_token_and_records_its_use(member):
    token, raw = create_token(member, "ci")
    found = verify_token(raw)
    assert found == token and found.user == member
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_it_rejects_a_wrong_a_revoked_and_an_inactive_users_token(member, outsider):
    _, raw = create_token(member, "ci")
    assert verify_token(raw[:-1] + ("A" if raw[-1] != "A" else "B")) is None
    assert verify_token("") is None
    revoked, revoked_raw = create_token(member, "old")
    revoke_token(revoked)
    assert verify_token(revoked_raw) is None
    _, outsider_raw = create_token(outsider, "mine")
    outsider.is_active = False
    outsider.save(update_fields=["is_active"])
    assert verify_token(outsider_raw) is None
    assert verify_token(raw) is not None


def test_it_keeps_the_first_revocation_time(member):
    token, _ = create_token(member, "ci")
    revoke_token(token)
    first = token.revoked_at
    revoke_token(token)
    assert token.revoked_at == first


def test_it_requires_login_for_the_account_page(client):
    response = client.get(reverse("account_settings"))
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_it_lists_only_the_users_own_tokens(member_client, member, outsider):
    create_token(member, "bobs-ci-token")
    _, outsider_raw = create_token(outsider, "carols-secret-project")
    outsider_token = ApiToken.objects.get(user=outsider)
    page = member_client.get(reverse("account_settings")).content.decode()
    assert "bobs-ci-token" in page
    assert "carols-secret-project" not in page
    assert outsider_token.prefix not in page and "carol@example.com" not in page


def test_it_shows_a_new_token_once(member_client, member):
    response = member_client.post(reverse("token_create"), {"name": "pipeline"})
    assert response.status_code == 200
    raw = response.context["new_token"]
    assert raw in response.content.decode()
    assert verify_token(raw).user == member
    again = member_client.get(reverse("account_settings")).content.decode()
    assert "pipeline" in again and raw not in again


def test_it_rejects_a_token_without_a_name(member_client, member):
    response = member_client.post(reverse("token_create"), {"name": ""})
    assert response.status_code == 400
    assert not ApiToken.objects.filter(user=member).exists()


def test_it_revokes_the_users_own_token(member_client, member):
    token, raw = create_token(member, "ci")
    response = member_client.post(reverse("token_revoke", args=[token.pk]))
    assert response.status_code == 302
    assert verify_token(raw) is None


def test_it_cannot_revoke_another_users_token(member_client, outsider):
    token, raw = create_token(outsider, "carols")
    response = member_client.post(reverse("token_revoke", args=[token.pk]))
    assert response.status_code == 404
    assert verify_token(raw) is not None


def test_it_revokes_tokens_from_the_admin(admin_client, member):
    token, raw = create_token(member, "ci")
    url = reverse("admin:runs_app_apitoken_changelist")
    response = admin_client.post(url, {"action": "revoke", "_selected_action": [token.pk]})
    assert response.status_code == 302
    assert verify_token(raw) is None


def test_it_shows_the_hash_read_only_in_the_admin(admin_client, member):
    token, _ = create_token(member, "ci")
    page = admin_client.get(reverse("admin:runs_app_apitoken_change", args=[token.pk])).content.decode()
    assert token.key_hash in page
    assert 'name="key_hash"' not in page
