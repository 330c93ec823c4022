"""An experiment's history: each variant's figures run after run (the comparison's numbers for
each run), "compare with the last good run", and its scheduled runs with their alerts."""

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.validators import validate_email
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from experiments_app.models import Experiment
from experiments_app.specs.resolve import OverrideError, parse_overrides
from runs_app import scheduling
from runs_app.analysis.load import comparison
from runs_app.analysis.stats import charts
from runs_app.models import Alert, Run, Schedule
from runs_app.web.experiments import get_experiment_for_user

HISTORY_RUNS = 20  # the latest runs the history shows
ALERTS_SHOWN = 10


class ScheduleForm(forms.Form):
    cron = forms.CharField(
        max_length=100,
        label="When",
        initial="0 3 * * *",
        help_text="Cron: minute hour day-of-month month day-of-week, e.g. 0 3 * * * (03:00 every day), or "
        "@nightly, @hourly, @weekly",
    )
    overrides = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false", "class": "code"}),
        help_text="One path=value per line for each run, e.g. repeats=3",
    )
    alert_on = forms.ChoiceField(choices=Schedule.AlertOn.choices, label="Alert", initial="failure")
    emails = forms.CharField(required=False, max_length=2000, help_text="Addresses, comma-separated")
    webhook_url = forms.URLField(
        required=False, max_length=500, assume_scheme="https", label="Webhook",
        help_text="A JSON POST (with a `text` field chat webhooks show) to this address",
    )  # fmt: skip

    def __init__(self, *args: Any, user: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.user = user

    def clean_webhook_url(self) -> str:
        url = self.cleaned_data["webhook_url"]
        # The worker posts from inside the site's network, and the page shows what answered: a
        # member could probe internal hosts with it. Staff choose where alerts are posted.
        if url and not (self.user is not None and self.user.is_staff):
            raise forms.ValidationError(
                "Only staff may set a webhook (it is posted from inside your network)."
            )
        return url

    def clean_cron(self) -> str:
        cron = " ".join(self.cleaned_data["cron"].split())
        try:
            scheduling.parse_cron(cron)
        except scheduling.ScheduleError as exc:
            raise forms.ValidationError(str(exc)) from None
        return cron

    def clean_overrides(self) -> list[str]:
        lines = [line.strip() for line in self.cleaned_data["overrides"].splitlines() if line.strip()]
        try:
            parse_overrides(lines)
        except OverrideError as exc:
            raise forms.ValidationError(str(exc)) from None
        except RecursionError:
            raise forms.ValidationError("a value is nested too deeply") from None
        return lines

    def clean_emails(self) -> list[str]:
        addresses = [part.strip() for part in self.cleaned_data["emails"].replace(";", ",").split(",")]
        addresses = [address for address in addresses if address]
        for address in addresses:
            validate_email(address)
        return addresses

    def clean(self) -> dict:
        data = super().clean()
        if not self.errors and not data.get("emails") and not data.get("webhook_url"):
            raise forms.ValidationError("Say where its alerts go: an e-mail address, a webhook, or both.")
        return data


@login_required
@require_GET
def experiment_history(request: HttpRequest, slug: str) -> HttpResponse:
    experiment = get_experiment_for_user(request, slug)
    return render(request, "runs/history.html", _history_context(experiment, ScheduleForm()))


def _history_context(experiment: Experiment, form: ScheduleForm) -> dict[str, Any]:
    runs = list(
        Run.objects.select_related("experiment")
        .filter(experiment=experiment, n_trials__gt=0)
        .order_by("-created_at", "-pk")[:HISTORY_RUNS]
    )
    runs.reverse()  # oldest first, as the chart reads
    variants, series, quarantined = variant_history(runs)
    latest = runs[-1] if runs else None
    schedules = list(experiment.schedules.select_related("created_by").order_by("pk"))
    return {
        "experiment": experiment,
        "runs": runs,
        "variants": variants,
        "quarantined": quarantined,
        "chart": {
            "id": "chart-history",
            "data_id": "chart-history-data",
            "figure": charts.history_figure(series),
        },
        "latest": latest,
        "last_good": Run.objects.last_good(experiment.pk, before=latest) if latest else None,
        "schedules": schedules,
        "alerts": Alert.objects.filter(schedule__experiment=experiment).select_related("run")[:ALERTS_SHOWN],
        "form": form,
        "now": timezone.now(),
    }


def variant_history(runs: list[Run]) -> tuple[dict[str, list[dict]], dict[str, list], list[dict]]:
    """Per variant, a row per run (newest first) with the comparison's figures for it, each with
    a link to compare its run with the last good one before it; the chart's series; and the
    quarantined tasks the figures leave out."""
    rows: dict[str, list[dict]] = {}
    series: dict[str, list] = {}
    quarantined: dict[str, dict] = {}
    last_good: Run | None = None
    for run in runs:
        # Per run, without its tests (final=False): the rates and intervals are the comparison's.
        result = comparison([run], criteria=False, final=False)
        quarantined.update((entry["task"], entry) for entry in result.quarantined)
        for arm in result.arms:
            rows.setdefault(arm.variant_slug, []).append(_row(run, arm, last_good))
            series.setdefault(arm.variant_slug, []).append((f"#{run.pk}", arm))
        if run.status == Run.Status.FINISHED and run.gates_passed is not False:
            last_good = run
    newest_first = {variant: list(reversed(found)) for variant, found in rows.items()}
    return newest_first, series, [quarantined[task] for task in sorted(quarantined)]


def _row(run: Run, arm, last_good: Run | None) -> dict:
    """One run of one variant: its arm of the run's comparison (the template formats its
    figures) and the comparison with the last good run before it."""
    compare = ""
    if last_good is not None:
        url = reverse("experiment_compare", args=[run.experiment.slug])
        compare = f"{url}?runs={last_good.pk},{run.pk}"
    return {"run": run, "arm": arm, "last_good": last_good, "compare_with_good": compare}


@login_required
@require_POST
def schedule_create(request: HttpRequest, slug: str) -> HttpResponse:
    experiment = get_experiment_for_user(request, slug)
    form = ScheduleForm(request.POST, user=request.user)
    if not form.is_valid():
        return render(request, "runs/history.html", _history_context(experiment, form), status=400)
    data = form.cleaned_data
    schedule = Schedule.objects.create(
        experiment=experiment, cron=data["cron"], overrides=data["overrides"], alert_on=data["alert_on"],
        emails=data["emails"], webhook_url=data["webhook_url"], created_by=request.user,
        next_run_at=scheduling.next_time(data["cron"], timezone.now()),
    )  # fmt: skip
    messages.success(request, f"Scheduled: the next run starts at {schedule.next_run_at:%Y-%m-%d %H:%M} UTC.")
    return redirect("experiment_history", slug=experiment.slug)


@login_required
@require_POST
def schedule_action(request: HttpRequest, schedule_id: int, action: str) -> HttpResponse:
    """Pause, resume, run now or delete a schedule (its author or staff)."""
    schedule = get_object_or_404(Schedule.objects.select_related("experiment"), pk=schedule_id)
    try:
        scheduling.ensure_may_change(schedule, request.user)
    except PermissionError as refusal:
        raise PermissionDenied(str(refusal)) from None
    slug = schedule.experiment.slug
    if action == "delete":
        schedule.delete()
        messages.success(request, "Schedule deleted; the runs it launched are kept.")
    elif action in ("pause", "resume"):
        schedule.enabled = action == "resume"
        if schedule.enabled:  # from now on, not the times it missed while paused
            schedule.next_run_at = scheduling.next_time(schedule.cron, timezone.now())
        schedule.save(update_fields=["enabled", "next_run_at"])
        messages.success(request, f"Schedule {'resumed' if schedule.enabled else 'paused'}.")
    elif action == "run-now":
        Schedule.objects.filter(pk=schedule.pk).update(next_run_at=timezone.now(), enabled=True)
        tick = f"{settings.SCHEDULE_TICK_SECONDS:g}"
        messages.success(request, f"The scheduled run starts at the scheduler's next tick (within {tick} s).")
    else:
        messages.error(request, f"Unknown action {action!r}.")
    return redirect("experiment_history", slug=slug)
