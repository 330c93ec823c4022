from django.urls import path  # noqa: F401

# The HTTP API (django-ninja) mounts here.
urlpatterns = []
