from django.urls import path

from runs_app import views

urlpatterns = [
    path("", views.home, name="home"),
    path("runs/", views.run_list, name="run_list"),
    path("runs/<int:run_id>/", views.run_detail, name="run_detail"),
    path("runs/<int:run_id>/stream/", views.run_stream, name="run_stream"),
    path("runs/<int:run_id>/progress/", views.run_progress, name="run_progress"),
    path("runs/<int:run_id>/cancel/", views.run_cancel, name="run_cancel"),
    path("runs/<int:run_id>/retry/", views.run_retry, name="run_retry"),
    path("runs/<int:run_id>/rerun/", views.run_rerun, name="run_rerun"),
    path("runs/<int:run_id>/trials/<int:trial_id>/", views.trial_detail, name="trial_detail"),
]
