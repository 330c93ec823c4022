from django.urls import path

from experiments_app import views

urlpatterns = [
    path("experiments/", views.experiment_list, name="experiment_list"),
    path("experiments/<slug:slug>/", views.experiment_detail, name="experiment_detail"),
]
