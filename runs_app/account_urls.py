from django.urls import path

from runs_app import account_views

# Included at "account/" by evalsite/urls.py.
urlpatterns = [
    path("", account_views.account_settings, name="account_settings"),
    path("tokens/", account_views.token_create, name="token_create"),
    path("tokens/<int:token_id>/revoke/", account_views.token_revoke, name="token_revoke"),
]
