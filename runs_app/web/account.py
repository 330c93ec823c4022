"""The account settings page: a user's own API tokens (create, revoke)."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from runs_app.models import ApiToken
from runs_app.tokens import create_token, revoke_token


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What the token is for, e.g. “CI on repo X”")


def _get_token_for_user(request: HttpRequest, token_id: int) -> ApiToken:
    # Another user's token is a 404, so its existence does not leak either.
    return get_object_or_404(ApiToken, pk=token_id, user=request.user)


def _render_settings(request: HttpRequest, form: TokenForm, new_token: str = "", status: int = 200):
    tokens = ApiToken.objects.filter(user=request.user).order_by("revoked_at", "-created_at")
    context = {"form": form, "tokens": tokens, "new_token": new_token}
    return render(request, "account/settings.html", context, status=status)


@login_required
@require_GET
def account_settings(request: HttpRequest) -> HttpResponse:
    return _render_settings(request, TokenForm())


@login_required
@require_POST
def token_create(request: HttpRequest) -> HttpResponse:
    form = TokenForm(request.POST)
    if not form.is_valid():
        return _render_settings(request, form, status=400)
    _, raw = create_token(request.user, form.cleaned_data["name"])
    # Rendered, not redirected: the raw token exists only in this response and is never stored.
    return _render_settings(request, TokenForm(), new_token=raw)


@login_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    token = _get_token_for_user(request, token_id)
    revoke_token(token)
    messages.success(request, f"Token “{token.name}” revoked.")
    return redirect("account_settings")
