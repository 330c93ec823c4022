from django.urls import path

from runs_app import compare_views

# Comparison pages; `?format=csv|json&table=summary|trials` on either gives the downloads.
urlpatterns = [
    path("runs/<int:run_id>/compare/", compare_views.run_compare, name="run_compare"),
    path("experiments/<slug:slug>/compare/", compare_views.experiment_compare, name="experiment_compare"),
]
