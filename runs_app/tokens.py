"""Personal API tokens: created once (the raw token is shown to its owner a single time),
stored only as a sha256, checked on every API request and download, revoked by their owner or
an admin.
"""

import hashlib
import secrets
from datetime import timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.deprecation import MiddlewareMixin

from runs_app.models import ApiToken

TOKEN_PREFIX = "evs_"
PREFIX_LENGTH = 12  # ApiToken.prefix: "evs_" plus 8 random characters, enough to tell tokens apart
# A token used again within this window keeps its last_used_at: one write per request would
# make every API call take SQLite's write lock.
LAST_USED_PRECISION = timedelta(minutes=1)


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def create_token(user: AbstractBaseUser, name: str) -> tuple[ApiToken, str]:
    """Create a token for `user`; return it with the raw token, which is never stored."""
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user, name=name, prefix=raw[:PREFIX_LENGTH], key_hash=hash_token(raw)
    )
    return token, raw


def verify_token(raw: str) -> ApiToken | None:
    """The live token matching `raw` (not revoked, its user active), or None."""
    if not raw or not raw.startswith(TOKEN_PREFIX) or len(raw) > 200:
        return None
    token = (
        ApiToken.objects.select_related("user")
        .filter(key_hash=hash_token(raw), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if token is not None:
        _touch(token)
    return token


def revoke_token(token: ApiToken) -> None:
    """Revoke `token` (idempotent: the first revocation time is kept)."""
    now = timezone.now()
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now)
    token.refresh_from_db(fields=["revoked_at"])


def _touch(token: ApiToken) -> None:
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_PRECISION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now


class TokenDownloads(MiddlewareMixin):
    """A personal token opens the site's downloads as it opens the API: a GET (or HEAD) carrying
    `Authorization: Bearer <token>` acts as the token's user, so a pipeline fetches a comparison's
    JSON or CSV, a trial's workspace or an experiment's zip with the token it calls the API with,
    instead of being sent to the sign-in page. It never signs anyone in (no session), and a page
    that changes something (a POST) still needs a session and its CSRF token. A bad token is a
    401, not the sign-in page. The API checks its own tokens."""

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        scheme, _, raw = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or request.method not in ("GET", "HEAD"):
            return None
        if request.path.startswith(reverse("api:api-root")):
            return None
        token = verify_token(raw.strip())
        if token is None:
            response = JsonResponse({"detail": "invalid or revoked API token", "field": None}, status=401)
            response["WWW-Authenticate"] = "Bearer"
            return response
        request.user = token.user
        return None
