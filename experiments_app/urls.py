from django.urls import path

from experiments_app import views

# Set-up pages. The experiment list, page and launch (pages that show runs) are runs_app's;
# evalsite/urls.py includes these first, so "new" is never taken for an experiment ID.
urlpatterns = [
    path("experiments/new/", views.experiment_create, name="experiment_create"),
    path("experiments/new/upload/", views.experiment_import, name="experiment_import"),
    path(
        "experiments/new/matching-tasks/", views.experiment_matching_tasks, name="experiment_matching_tasks"
    ),
    path("experiments/<slug:slug>/edit/", views.experiment_edit, name="experiment_edit"),
    path("experiments/<slug:slug>/duplicate/", views.experiment_duplicate, name="experiment_duplicate"),
    path("experiments/<slug:slug>/yaml/", views.experiment_yaml, name="experiment_yaml"),
    path("experiments/<slug:slug>/bundle/", views.experiment_bundle, name="experiment_bundle"),
    path("task-sets/", views.taskset_list, name="taskset_list"),
    path("task-sets/new/", views.taskset_create, name="taskset_create"),
    path("task-sets/<slug:name>/", views.taskset_detail, name="taskset_detail"),
    path("task-sets/<slug:name>/edit/", views.taskset_edit, name="taskset_edit"),
    path("task-sets/<slug:name>/upload/", views.taskset_upload, name="taskset_upload"),
    path("task-sets/<slug:name>/export/", views.taskset_export, name="taskset_export"),
    path("tasks/", views.task_list, name="task_list"),
    path("tasks/<str:slug>/", views.task_detail, name="task_detail"),  # task ids may hold dots
]
