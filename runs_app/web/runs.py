"""Run pages: home, the run list, the run page (made live by `stream`), and the run actions.

Cancel and retry go through `control`, which decides who may control a run.
"""

import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import F
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.middleware.csrf import get_token
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from experiments_app.models import Experiment
from runs_app import control
from runs_app.analysis.coder_eval_run import export_run
from runs_app.analysis.harbor_job import export_job
from runs_app.launching import LaunchError, launch_run, rerun_options
from runs_app.models import Run, Trial, with_last_run
from runs_app.web.fragments import (
    PARTS,
    TRIAL_SORTS,
    for_viewer,
    live_parts,
    run_state,
)
from runs_app.web.presenters import LISTS, attach_last_run_rates, attach_variant_rates

RUN_LIST_ROWS = 50


class TrialFilterForm(forms.Form):
    # `status`, as in the API's trial list: one name for a trial's outcome everywhere.
    variant = forms.SlugField(required=False, max_length=200)
    task = forms.CharField(required=False, max_length=200)
    status = forms.ChoiceField(required=False, choices=[("", "any"), *Trial.Status.choices])
    category = forms.CharField(required=False, max_length=50, label="Error category")
    sort = forms.ChoiceField(
        required=False, choices=[(key, label) for key, (label, _) in TRIAL_SORTS.items()]
    )
    page = forms.IntegerField(required=False, min_value=1)


class RunFilterForm(forms.Form):
    status = forms.ChoiceField(required=False, choices=[("", "any"), *Run.Status.choices])
    experiment = forms.SlugField(required=False, max_length=200)
    page = forms.IntegerField(required=False, min_value=1)


def get_run_for_user(request: HttpRequest, run_id: int) -> Run:
    # Every signed-in member may see every run and launch a new one from it (a team tool);
    # who may control it is control.ensure_controllable's to say.
    return get_object_or_404(Run.objects.select_related("experiment"), pk=run_id)


# --- home and run list --------------------------------------------------------------------------


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    def lists() -> dict:
        runs = attach_variant_rates(list(Run.objects.listed().running_first()[:15]))
        latest = F("last_run_created_at").desc(nulls_last=True)
        experiments = attach_last_run_rates(
            list(with_last_run(Experiment.objects.all()).order_by(latest, "slug")[:20])
        )
        return {"runs": runs, "experiments": experiments}

    return render(request, "runs/home.html", LISTS.get("home", lists))


@login_required
@require_GET
def run_list(request: HttpRequest) -> HttpResponse:
    form = RunFilterForm(request.GET)
    filters = form.cleaned_data if form.is_valid() else {}
    runs = Run.objects.listed().select_related("started_by")
    if filters.get("status"):
        runs = runs.filter(status=filters["status"])
    if filters.get("experiment"):
        runs = runs.filter(experiment__slug=filters["experiment"])

    def listed():
        page = Paginator(runs.order_by("-created_at", "-pk"), RUN_LIST_ROWS).get_page(filters.get("page"))
        page.object_list = attach_variant_rates(list(page.object_list))
        page.has_other_pages()  # the runs counted now, once for everyone who looks within the second
        return page

    page = LISTS.get(("runs", *sorted((k, str(v)) for k, v in filters.items())), listed)
    query = urlencode({k: v for k, v in filters.items() if v and k != "page"})
    return render(request, "runs/run_list.html", {"form": form, "page": page, "query": query})


# --- the run page -----------------------------------------------------------------------------


def trial_filters(request: HttpRequest) -> tuple[TrialFilterForm, dict]:
    form = TrialFilterForm(request.GET)
    return form, (form.cleaned_data if form.is_valid() else {})


@login_required
@require_GET
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for_user(request, run_id)
    form, filters = trial_filters(request)
    parts = live_parts(run.pk, run_state(run.pk), filters, oob=False)
    token = get_token(request)
    shown = {name: for_viewer(parts[name], token=token) for name in PARTS}
    context = {**parts["context"], "run": run, "parts": shown, "filter_form": form}
    context["last_good"] = Run.objects.last_good(run.experiment_id, before=run)
    return render(request, "runs/run_detail.html", context)


# --- run actions --------------------------------------------------------------------------


def _refused(request: HttpRequest, refusal: control.ControlRefused) -> None:
    if refusal.forbidden:
        raise PermissionDenied(str(refusal))
    messages.info(request, f"{str(refusal)[:1].upper()}{str(refusal)[1:]}.")


@login_required
@require_POST
def run_cancel(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for_user(request, run_id)
    try:
        control.cancel_run(run, request.user)
    except control.ControlRefused as refusal:
        _refused(request, refusal)
    else:
        messages.success(request, f"Cancelled run #{run.pk}: running trials stop within a second.")
    return redirect(run)


def _counted_action(request: HttpRequest, run_id: int, action) -> tuple[Run, int | None]:
    """Run a control action that returns a count; None when it was refused (and said so)."""
    run = get_run_for_user(request, run_id)
    try:
        return run, action(run, request.user)
    except control.ControlRefused as refusal:
        _refused(request, refusal)
        return run, None


@login_required
@require_POST
def run_resume(request: HttpRequest, run_id: int) -> HttpResponse:
    run, count = _counted_action(request, run_id, control.resume_run)
    if count is not None:
        messages.success(request, f"Resumed: {count} trial{'s' if count != 1 else ''} to run.")
    return redirect(run)


@login_required
@require_POST
def run_any_version(request: HttpRequest, run_id: int) -> HttpResponse:
    run, count = _counted_action(request, run_id, control.allow_any_code_version)
    if count is not None:
        messages.success(request, f"Workers of any code version may now run its {count} waiting trials.")
    return redirect(run)


@login_required
@require_POST
def run_retry(request: HttpRequest, run_id: int) -> HttpResponse:
    run, count = _counted_action(request, run_id, control.retry_errors)
    if count:
        messages.success(request, f"Retrying {count} errored trial{'s' if count != 1 else ''}.")
    elif count == 0:
        messages.info(request, "No errored trials to retry.")
    return redirect(run)


@login_required
@require_POST
def run_rerun(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for_user(request, run_id)
    try:
        new = launch_run(run.experiment, user=request.user, options=rerun_options(run))
    except LaunchError as exc:
        for problem in exc.problems[:20]:
            messages.error(request, f"Cannot re-run: {problem}")
        return redirect(run)
    messages.success(
        request,
        f"Run #{new.pk} launched: the tasks and options of run #{run.pk}, with the tasks' current "
        "versions and the experiment's current variants.",
    )
    return redirect(new)


# The run's exports as a zip: the folder layouts the management commands write.
EXPORTS = {"harbor-job": export_job, "coder-eval-run": export_run}


@login_required
@require_GET
def run_export(request: HttpRequest, run_id: int, layout: str) -> FileResponse:
    """A finished run as Harbor's job directory or coder-eval's run directory, zipped."""
    run = get_run_for_user(request, run_id)
    if layout not in EXPORTS:
        raise Http404(f"no export named {layout}")
    if not run.is_final:
        raise Http404("the run has not ended: export it once it has")
    name = f"run-{run.pk}-{layout}"
    with tempfile.TemporaryDirectory(prefix="evalsite-export-") as scratch:
        EXPORTS[layout](run, Path(scratch) / name)
        archive = shutil.make_archive(str(Path(scratch) / name), "zip", scratch, name)
        # Opened before the folder goes: the open file outlives its name.
        handle = open(archive, "rb")  # noqa: SIM115
    return FileResponse(handle, as_attachment=True, filename=f"{name}.zip", content_type="application/zip")
