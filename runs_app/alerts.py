"""Alerts of scheduled runs: whether a run's end (or a launch that did not happen) calls for one,
and sending it by e-mail (Django's mail backend: EMAIL_HOST, DEFAULT_FROM_EMAIL) and/or to a
webhook (a JSON POST, with a `text` field that chat webhooks show), with a link to the comparison
with the last good run.

The run's gates decide: a failed gate, or a run that stopped before its end, alerts; a schedule
set to alert "always" also reports runs that went well. Each (run, channel) alerts at most once
(`Alert`'s constraint), whichever worker finishes the run.
"""

import json
import logging
import urllib.error
import urllib.request
from urllib.parse import urlencode

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.urls import reverse

from runs_app.models import Alert, Run, Schedule, shown_url

logger = logging.getLogger(__name__)


def reason(run: Run, schedule: Schedule) -> str | None:
    """Why this run's end alerts, in words; None when it does not."""
    if run.status == Run.Status.CANCELLED:
        return f"stopped before its end: {run.stop_reason or 'cancelled'}"
    failed = [result for result in run.gate_results or [] if not result.get("passed")]
    if run.gates_passed is False:
        names = ", ".join(str(result.get("name") or result.get("type") or "gate") for result in failed)
        return f"{len(failed)} gate{'s' if len(failed) != 1 else ''} failed: {names}"
    if schedule.alert_on == Schedule.AlertOn.ALWAYS:
        return "finished, every gate held" if run.gates_passed else "finished (the experiment has no gates)"
    return None


def comparison_url(run: Run) -> str:
    """The comparison with the last good run before it (else the run's own comparison), in full."""
    good = Run.objects.last_good(run.experiment_id, before=run)
    if good is None:
        return settings.SITE_URL + reverse("run_compare", args=[run.pk])
    query = urlencode({"runs": f"{good.pk},{run.pk}"})
    return f"{settings.SITE_URL}{reverse('experiment_compare', args=[run.experiment.slug])}?{query}"


def alert_run(run_id: int) -> list[Alert]:
    """Send the alert of a scheduled run that has ended, if its gates call for one."""
    run = Run.objects.select_related("experiment", "schedule").filter(pk=run_id).first()
    if run is None or run.schedule is None or not run.is_final:
        return []
    why = reason(run, run.schedule)
    if why is None:
        return []
    subject = f"[evalsite] {run.experiment.slug}: scheduled run #{run.pk} {why}"
    link = comparison_url(run)
    lines = [
        f"Run #{run.pk} of {run.experiment.slug} (schedule '{run.schedule.cron}') {why}.",
        "",
        f"Trials: {run.n_passed} passed, {run.n_failed} failed, {run.n_error} errors, "
        f"{run.n_cancelled} cancelled of {run.n_trials}.",
        *(
            f"Gate {'held' if result.get('passed') else 'FAILED'}: {result.get('name', 'gate')}: "
            f"{result.get('detail', '')}"
            for result in run.gate_results or []
        ),
        "",
        f"Compare: {link}",
        f"Run: {settings.SITE_URL}{run.get_absolute_url()}",
    ]
    payload = {
        "event": "run_ended",
        "experiment": run.experiment.slug,
        "run": run.pk,
        "status": run.status,
        "gates_passed": run.gates_passed,
        "gates": run.gate_results,
        "reason": why,
        "run_url": settings.SITE_URL + run.get_absolute_url(),
        "comparison_url": link,
    }
    return _send(run.schedule, run, subject, "\n".join(lines), payload)


def alert_not_launched(schedule: Schedule, why: str) -> list[Alert]:
    """A scheduled run that did not start alerts whatever the schedule's setting."""
    subject = f"[evalsite] {schedule.experiment.slug}: the scheduled run did not start"
    url = settings.SITE_URL + schedule.experiment.get_absolute_url()
    body = f"The run scheduled at '{schedule.cron}' was not launched: {why}\n\nExperiment: {url}"
    payload = {"event": "run_not_launched", "experiment": schedule.experiment.slug, "reason": why, "url": url}
    return _send(schedule, None, subject, body, payload)


def _send(schedule: Schedule, run: Run | None, subject: str, body: str, payload: dict) -> list[Alert]:
    sent = []
    if schedule.emails:
        sent += _once(schedule, run, Alert.Channel.EMAIL, subject, lambda: _email(schedule, subject, body))
    if schedule.webhook_url:
        message = {**payload, "text": f"{subject}\n{body}"}
        sent += _once(
            schedule, run, Alert.Channel.WEBHOOK, subject, lambda: _post(schedule.webhook_url, message)
        )
    return sent


def _once(schedule: Schedule, run: Run | None, channel: str, subject: str, deliver) -> list[Alert]:
    """Claim the (run, channel) alert, then deliver it and record how that went."""
    try:
        with transaction.atomic():
            alert = Alert.objects.create(schedule=schedule, run=run, channel=channel, subject=subject[:1000])
    except IntegrityError:
        return []  # another worker alerts for this run
    try:
        alert.detail, alert.delivered = deliver(), True
    except Exception as exc:  # a mail server or webhook down: said on the schedule, never a crash
        alert.detail = f"not delivered: {exc}"[:2000]
        logger.warning("alert %s (%s) not delivered: %s", alert.pk, channel, exc)
    alert.save(update_fields=["detail", "delivered"])
    return [alert]


def _email(schedule: Schedule, subject: str, body: str) -> str:
    send_mail(subject[:250], body, settings.DEFAULT_FROM_EMAIL, list(schedule.emails))
    return f"sent to {', '.join(schedule.emails)}"


def _post(url: str, message: dict) -> str:
    request = urllib.request.Request(
        url,
        data=json.dumps(message, default=str).encode(),
        headers={"Content-Type": "application/json", "User-Agent": "evalsite-alerts"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=settings.ALERT_WEBHOOK_TIMEOUT) as response:
            return f"posted to {shown_url(url)}: HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{shown_url(url)} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        # The reason only: its text may hold the address, secret path and all.
        reason = getattr(exc, "reason", exc)
        raise RuntimeError(f"{shown_url(url)} could not be reached ({type(reason).__name__})") from None
