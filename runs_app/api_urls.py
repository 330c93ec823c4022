from django.urls import path

from runs_app.api import api

# The HTTP API (django-ninja): schema at api/openapi.json, docs at api/docs.
urlpatterns = [
    path("", api.urls),
]
