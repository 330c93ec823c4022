"""Triage writes: labels and notes on trials, and quarantining a broken task from every
comparison (with who may do each). What the comparison leaves out is decided in one place,
`analysis.load`; a quarantine bumps the tally version of every run holding the task, so no
comparison computed before it is shown after it, and tells their open pages."""

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from experiments_app.models import Quarantine, Task
from runs_app import live
from runs_app.models import Run, Trial, TrialNote


class NotAllowed(Exception):
    """This person may not do this (the message says who may)."""


def add_note(trial: Trial, user, label: str, text: str) -> TrialNote:
    """Any member may label a trial or note why it failed; the note keeps who and when."""
    label, text = " ".join(label.split())[:40], text.strip()
    if not label and not text:
        raise ValueError("give a label, a note, or both")
    return TrialNote.objects.create(trial=trial, author=user, label=label, text=text)


def delete_note(note: TrialNote, user) -> None:
    if not (user.is_staff or note.author_id == user.pk):
        raise NotAllowed("only its author, or staff, may delete a note")
    note.delete()


def may_quarantine(user) -> bool:
    """Staff: a quarantine changes every comparison, gate and report that holds the task."""
    return bool(user.is_staff)


def quarantine(task: Task, reason: str, user) -> Quarantine:
    if not may_quarantine(user):
        raise NotAllowed("only staff may quarantine a task: it leaves every comparison")
    reason = reason.strip()
    if not reason:
        raise ValueError("say why the task is broken: the reason is shown wherever it is left out")
    with transaction.atomic():
        found = Quarantine.objects.active().select_for_update().filter(task=task).first()
        if found is not None:
            return found
        made = Quarantine.objects.create(task=task, reason=reason, created_by=user)
        _touch_runs_of(task)
    return made


def lift(task: Task, user) -> int:
    """End the task's quarantine: it counts again everywhere. Returns how many were lifted."""
    if not may_quarantine(user):
        raise NotAllowed("only staff may lift a quarantine")
    with transaction.atomic():
        active = Quarantine.objects.active().filter(task=task)
        lifted = active.update(lifted_at=timezone.now(), lifted_by=user)
        if lifted:
            _touch_runs_of(task)
    return lifted


def _touch_runs_of(task: Task) -> None:
    """Every run whose numbers hold the task computes them afresh (see the module)."""
    runs = list(Run.objects.filter(tallies__task_version__task=task).values_list("pk", flat=True).distinct())
    Run.objects.filter(pk__in=runs).update(tally_version=F("tally_version") + 1)
    for run_id in runs:
        live.publish(run_id)  # once the change commits
