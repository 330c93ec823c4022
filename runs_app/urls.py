from django.urls import path

from runs_app import views

urlpatterns = [
    path("", views.home, name="home"),
    path("runs/<int:run_id>/", views.run_detail, name="run_detail"),
    path("runs/<int:run_id>/trials/<int:trial_id>/", views.trial_detail, name="trial_detail"),
]
