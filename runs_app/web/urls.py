"""Every page of runs_app (evalsite/urls.py includes experiments_app's set-up pages first)."""

from django.urls import path

from runs_app.web import account, compare, experiments, history, runs, stream, triage, trials, workers

urlpatterns = [
    path("", runs.home, name="home"),
    path("runs/", runs.run_list, name="run_list"),
    path("runs/<int:run_id>/", runs.run_detail, name="run_detail"),
    path("runs/<int:run_id>/stream/", stream.run_stream, name="run_stream"),
    path("runs/<int:run_id>/progress/", stream.run_progress, name="run_progress"),
    path("runs/<int:run_id>/cancel/", runs.run_cancel, name="run_cancel"),
    path("runs/<int:run_id>/retry/", runs.run_retry, name="run_retry"),
    path("runs/<int:run_id>/resume/", runs.run_resume, name="run_resume"),
    path("runs/<int:run_id>/rerun/", runs.run_rerun, name="run_rerun"),
    path("runs/<int:run_id>/any-version/", runs.run_any_version, name="run_any_version"),
    path("runs/<int:run_id>/export/<slug:layout>.zip", runs.run_export, name="run_export"),
    path("runs/<int:run_id>/trials/<int:trial_id>/", trials.trial_detail, name="trial_detail"),
    path(
        "runs/<int:run_id>/trials/<int:trial_id>/notes/", triage.trial_note_create, name="trial_note_create"
    ),
    path("notes/<int:note_id>/delete/", triage.trial_note_delete, name="trial_note_delete"),
    path("runs/<int:run_id>/units/<str:task>/", triage.unit_view, name="unit_view"),
    path("runs/<int:run_id>/failures/", triage.run_failures, name="run_failures"),
    path("tasks/<str:slug>/quarantine/", triage.task_quarantine, name="task_quarantine"),
    path("runs/<int:run_id>/trials/<int:trial_id>/artifact/", trials.trial_artifact, name="trial_artifact"),
    path("runs/<int:run_id>/trials/<int:trial_id>/trajectory.json", trials.trial_atif, name="trial_atif"),
    path(
        "runs/<int:run_id>/trials/<int:trial_id>/trajectory/import/",
        trials.trial_atif_import,
        name="trial_atif_import",
    ),
    path("runs/<int:run_id>/trials/<int:trial_id>/stream/", stream.trial_stream, name="trial_stream"),
    # Comparison pages; `?format=csv|json&table=summary|trials` on either gives the downloads.
    path("runs/<int:run_id>/compare/", compare.run_compare, name="run_compare"),
    path("experiments/", experiments.experiment_list, name="experiment_list"),
    path("experiments/<slug:slug>/", experiments.experiment_detail, name="experiment_detail"),
    path("experiments/<slug:slug>/launch/", experiments.experiment_launch, name="experiment_launch"),
    path("experiments/<slug:slug>/compare/", compare.experiment_compare, name="experiment_compare"),
    path("experiments/<slug:slug>/history/", history.experiment_history, name="experiment_history"),
    path("experiments/<slug:slug>/schedules/", history.schedule_create, name="schedule_create"),
    path("schedules/<int:schedule_id>/<slug:action>/", history.schedule_action, name="schedule_action"),
    path("workers/", workers.worker_list, name="worker_list"),
    path("account/", account.account_settings, name="account_settings"),
    path("account/tokens/", account.token_create, name="token_create"),
    path("account/tokens/<int:token_id>/revoke/", account.token_revoke, name="token_revoke"),
]
