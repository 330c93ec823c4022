from django.urls import path  # noqa: F401

# Comparison pages and downloads.
urlpatterns = []
