"""Failure triage pages: one unit's trials side by side across variants, a run's failures
grouped by failing criterion and by error, labels and notes on trials, quarantining a task."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from experiments_app.models import Quarantine, Task
from runs_app import control, triage
from runs_app.analysis import triage as found
from runs_app.analysis.load import comparison
from runs_app.models import Trial, TrialNote
from runs_app.web.runs import get_run_for_user

# Labels offered when noting a trial (any other label may be typed).
COMMON_LABELS = ("flaky", "grader bug", "task bug", "infrastructure", "agent mistake", "needs a look")
GROUPS_SHOWN = 30


class UnitForm(forms.Form):
    row = forms.CharField(required=False, max_length=200)  # the dataset row ("" for a plain task)
    rep = forms.IntegerField(required=False, min_value=0)  # the replicate shown in full


class NoteForm(forms.Form):
    label = forms.CharField(
        required=False,
        max_length=40,
        widget=forms.TextInput(attrs={"list": "note-labels", "autocomplete": "off"}),
    )
    text = forms.CharField(
        required=False, max_length=10_000, widget=forms.Textarea(attrs={"rows": 2}), label="Note"
    )
    next = forms.CharField(required=False, max_length=2000, widget=forms.HiddenInput)


class QuarantineForm(forms.Form):
    reason = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))


@login_required
@require_GET
def unit_view(request: HttpRequest, run_id: int, task: str) -> HttpResponse:
    run = get_run_for_user(request, run_id)
    form = UnitForm(request.GET)
    options = form.cleaned_data if form.is_valid() else {}
    trials = list(found.unit_trials(run, task, options.get("row") or ""))
    if not trials and not options.get("row"):  # a dataset task: its first row
        trials = list(found.unit_trials(run, task, found.first_row(run, task)))
    if not trials:
        raise Http404(f"run #{run.pk} has no trial of {task}")
    columns, divergence = found.unit_columns(trials, options.get("rep"))
    ctx = {
        "run": run,
        "task": trials[0].task_version.task,
        "row": trials[0].dataset_row_id,
        "columns": columns,
        "divergence": divergence,
        "steps_shown": found.STEPS_SHOWN,
        "steps_slice": f":{found.STEPS_SHOWN}",
        "note_form": NoteForm(initial={"next": request.get_full_path()}),
        "labels": COMMON_LABELS,
        "quarantine": Quarantine.objects.active().filter(task=trials[0].task_version.task).first(),
    }
    return render(request, "runs/unit.html", ctx)


@login_required
@require_GET
def run_failures(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for_user(request, run_id)
    ctx = {
        "run": run,
        "criterion_groups": found.criterion_groups(run)[:GROUPS_SHOWN],
        "error_groups": found.error_groups(run, control.ERROR_GROUP_CHARS)[:GROUPS_SHOWN],
        "quarantined": comparison([run], criteria=False).quarantined if run.n_trials else [],
    }
    return render(request, "runs/failures.html", ctx)


@login_required
@require_POST
def trial_note_create(request: HttpRequest, run_id: int, trial_id: int) -> HttpResponse:
    trial = get_object_or_404(Trial, pk=trial_id, run_id=run_id)
    form = NoteForm(request.POST)
    if form.is_valid():
        try:
            triage.add_note(trial, request.user, form.cleaned_data["label"], form.cleaned_data["text"])
            messages.success(request, f"Noted on trial #{trial.pk}.")
        except ValueError as problem:
            messages.error(request, f"Nothing noted: {problem}.")
    else:
        messages.error(
            request, "Nothing noted: " + "; ".join(e for errors in form.errors.values() for e in errors)
        )
    return _back(request, reverse("trial_detail", args=[run_id, trial_id]))


@login_required
@require_POST
def trial_note_delete(request: HttpRequest, note_id: int) -> HttpResponse:
    note = get_object_or_404(TrialNote.objects.select_related("trial"), pk=note_id)
    try:
        triage.delete_note(note, request.user)
    except triage.NotAllowed as refusal:
        raise PermissionDenied(str(refusal)) from None
    messages.success(request, "Note deleted.")
    return _back(request, reverse("trial_detail", args=[note.trial.run_id, note.trial_id]))


@login_required
@require_POST
def task_quarantine(request: HttpRequest, slug: str) -> HttpResponse:
    """Quarantine the task (staff) with a reason, or lift its quarantine (`lift` in the form)."""
    task = get_object_or_404(Task, slug=slug)
    form = QuarantineForm(request.POST)
    try:
        if "lift" in request.POST:
            triage.lift(task, request.user)
            messages.success(request, f"{task.slug} counts again in every comparison.")
        elif form.is_valid():
            triage.quarantine(task, form.cleaned_data["reason"], request.user)
            messages.success(request, f"{task.slug} is left out of every comparison, with your reason.")
        else:
            messages.error(
                request, "Say why the task is broken: the reason is shown wherever it is left out."
            )
    except triage.NotAllowed as refusal:
        raise PermissionDenied(str(refusal)) from None
    return _back(request, reverse("task_detail", args=[task.slug]))


def _back(request: HttpRequest, fallback: str) -> HttpResponse:
    """Back to the page the form was on (a local address only), else `fallback`."""
    target = request.POST.get("next") or ""
    if url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return redirect(target)
    return redirect(fallback)
