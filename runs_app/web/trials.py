"""The trial page: criteria, the transcript, the diff, timings, the resolved config, attempts."""

import json

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.files.storage import default_storage
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from runs_app.analysis.atif import AtifError, ImportRefused, import_trajectory, may_import, trial_trajectory
from runs_app.models import Trial
from runs_app.web.presenters import as_text, config_for_kind, transcript_rows
from runs_app.web.triage import COMMON_LABELS

TRANSCRIPT_LIMIT = 2000


@login_required
@require_GET
def trial_detail(request: HttpRequest, run_id: int, trial_id: int) -> HttpResponse:
    trial = get_object_or_404(
        Trial.objects.select_related("run__experiment", "variant", "task_version__task"),
        pk=trial_id,
        run_id=run_id,
    )
    events = list(trial.events.all()[: TRANSCRIPT_LIMIT + 1])
    attempts = (
        Trial.objects.filter(
            run_id=trial.run_id,
            task_version_id=trial.task_version_id,
            variant_id=trial.variant_id,
            replicate=trial.replicate,
            dataset_row_id=trial.dataset_row_id,
        )  # fmt: skip
        .exclude(pk=trial.pk)
        .only("run_id", "status", "attempt", "is_latest", "finished_at", "error_category", "error_message")
        .order_by("-attempt", "-pk")
    )
    shown_config, hidden_keys = config_for_kind(trial.config or {}, trial.lineage)
    ctx = {
        "trial": trial,
        "run": trial.run,
        "criteria": trial.criterion_results.all(),
        "events": transcript_rows(events[:TRANSCRIPT_LIMIT]),
        "events_truncated": len(events) > TRANSCRIPT_LIMIT,
        "last_seq": events[-1].seq if events else 0,
        "attempts": attempts,
        "config_yaml": as_text(shown_config) if trial.config else "",
        "config_hidden": hidden_keys,
        "lineage": sorted(trial.lineage.items()),
        "run_url": reverse("run_detail", args=[trial.run_id]),
        "waited": (trial.started_at - trial.queued_at) if trial.started_at else None,
        "dialog": (trial.trajectory or {}).get("dialog") or [],
        "role_usage": [(role, usage) for role, usage in sorted(trial.role_usage.items()) if role != "agent"],
        "notes": trial.notes.select_related("author"),
        "labels": COMMON_LABELS,
        "atif_form": AtifForm() if may_import(trial, request.user) else None,
    }
    return render(request, "runs/trial_detail.html", ctx)


@login_required
@require_GET
def trial_artifact(request: HttpRequest, run_id: int, trial_id: int) -> FileResponse:
    """The trial's kept workspace (a run launched with keep_artifacts), from the configured storage:
    the web host reads what any worker host stored (docs/deploy.md)."""
    trial = get_object_or_404(Trial.objects.only("artifact", "attempt"), pk=trial_id, run_id=run_id)
    if not trial.artifact:
        raise Http404("this trial kept no workspace")
    name = f"run-{run_id}-trial-{trial_id}-attempt-{trial.attempt}.tar.gz"
    return FileResponse(
        default_storage.open(trial.artifact, "rb"),
        as_attachment=True,
        filename=name,
        content_type="application/gzip",
    )


@login_required
@require_GET
def trial_atif(request: HttpRequest, run_id: int, trial_id: int) -> HttpResponse:
    """The trial's transcript as an ATIF trajectory (trajectory.json)."""
    trial = get_object_or_404(Trial, pk=trial_id, run_id=run_id)
    response = HttpResponse(
        json.dumps(trial_trajectory(trial), indent=2) + "\n", content_type="application/json"
    )
    response["Content-Disposition"] = f'attachment; filename="run-{run_id}-trial-{trial_id}-trajectory.json"'
    return response


class AtifForm(forms.Form):
    file = forms.FileField(label="ATIF trajectory.json", max_length=255)


MAX_ATIF_BYTES = 20 * 1024 * 1024


@login_required
@require_POST
def trial_atif_import(request: HttpRequest, run_id: int, trial_id: int) -> HttpResponse:
    """An ATIF file as the transcript of a trial of an imported run (the service checks who may)."""
    trial = get_object_or_404(Trial.objects.select_related("run"), pk=trial_id, run_id=run_id)
    form = AtifForm(request.POST, request.FILES)
    if not form.is_valid():
        messages.error(request, "Import: choose an ATIF trajectory.json file.")
        return redirect(trial)
    upload = form.cleaned_data["file"]
    if upload.size > MAX_ATIF_BYTES:
        messages.error(request, f"Import: {upload.name} is larger than {MAX_ATIF_BYTES // 2**20} MB.")
        return redirect(trial)
    try:
        written = import_trajectory(trial, upload.read(), user=request.user, name=upload.name)
    except ImportRefused as exc:
        if exc.forbidden:
            return HttpResponseForbidden(str(exc))
        messages.error(request, f"Import refused: {exc}")
    except AtifError as exc:
        messages.error(request, "Nothing imported: " + " · ".join(exc.problems[:10]))
    else:
        messages.success(request, f"Imported {upload.name}: {written} transcript events.")
    return redirect(trial)
