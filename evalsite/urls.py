from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from runs_app.api import api

urlpatterns = [
    # Browsers ask for it unprompted (the API's docs, a PDF viewer); the site's icon is an SVG.
    path(
        "favicon.ico",
        RedirectView.as_view(url=f"/{settings.STATIC_URL.strip('/')}/favicon.svg", permanent=True),
        name="favicon",
    ),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    # The HTTP API (django-ninja): schema at api/openapi.json, docs at api/docs.
    path("api/", api.urls),
    # First: its `experiments/new/` must win over runs_app's `experiments/<slug>/`.
    path("", include("experiments_app.urls")),
    path("", include("runs_app.web.urls")),
]

handler404 = "evalsite.errors.not_found"
handler500 = "evalsite.errors.server_error"
