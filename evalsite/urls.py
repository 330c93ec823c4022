from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from runs_app.api import api

urlpatterns = [
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
