"""Scheduled runs: when a schedule's cron expression fires, Celery beat's tick
(`tasks.launch_scheduled_runs`, every SCHEDULE_TICK_SECONDS) launches a run of its experiment.

1. `launch_due(now)` claims each due schedule with a conditional UPDATE of its next launch time
   (exactly one row changed: this tick owns it), so two beats, or a slow tick, never launch a
   schedule twice for one time.
2. The launch is checked as a person's would be (pre-flight): a run whose variants no live
   worker can serve is not started; the schedule records why and alerts (`alerts`).
3. The run's end sends the schedule's alert when its gates decide so (`alerts.alert_run`).
"""

import logging
from datetime import datetime

from celery.schedules import crontab
from django.db import transaction
from django.utils import timezone

from runs_app import alerts, preflight
from runs_app.launching import LaunchError, LaunchOptions, launch_run
from runs_app.models import Run, Schedule

logger = logging.getLogger(__name__)

FIELDS = ("minute", "hour", "day of month", "month", "day of week")
SHORTHANDS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@nightly": "0 3 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
}


class ScheduleError(ValueError):
    """A cron expression that cannot be read; the message says which field and why."""


def parse_cron(text: str) -> crontab:
    """Five fields (minute hour day-of-month month day-of-week, as cron reads them) or a
    shorthand (@nightly: 03:00 every day), in the site's time zone (TIME_ZONE)."""
    text = SHORTHANDS.get(text.strip().lower(), text.strip())
    parts = text.split()
    if len(parts) != len(FIELDS):
        raise ScheduleError(
            f"expected 5 fields ({', '.join(FIELDS)}), e.g. '0 3 * * *' for 03:00 every day; got {len(parts)}"
        )
    minute, hour, day_of_month, month, day_of_week = parts
    try:
        return crontab(
            minute=minute, hour=hour, day_of_month=day_of_month, month_of_year=month, day_of_week=day_of_week
        )
    except ValueError as exc:
        raise ScheduleError(f"{text!r}: {exc}") from None


def next_time(cron: str, after: datetime) -> datetime:
    """The first time strictly after `after` (a whole minute) at which `cron` fires."""
    # Celery's delta from a last run at `after` to the next (its `remaining_estimate` counts
    # from the clock instead).
    start, delta, _ = parse_cron(cron).remaining_delta(after)
    return start + delta


def launch_due(now: datetime | None = None) -> list[Run]:
    """Launch a run of every schedule whose time has come (see the module's steps)."""
    now = now or timezone.now()
    launched = []
    for schedule in Schedule.objects.due(now).select_related("experiment", "created_by"):
        claimed = Schedule.objects.filter(pk=schedule.pk, next_run_at=schedule.next_run_at).update(
            next_run_at=next_time(schedule.cron, max(now, schedule.next_run_at))
        )
        if claimed != 1:
            continue  # another tick has it
        run = launch(schedule)
        if run is not None:
            launched.append(run)
    return launched


def launch(schedule: Schedule) -> Run | None:
    """Launch the schedule's run now, as its author would; None when pre-flight or the launch
    refused it (recorded on the schedule, and alerted)."""
    options = LaunchOptions(overrides=list(schedule.overrides))
    try:
        problems = preflight.check(schedule.experiment, options).problems
        if problems:
            raise LaunchError([f"pre-flight: {row.line}" for row in problems])
        with transaction.atomic():
            run = launch_run(schedule.experiment, user=schedule.created_by, options=options)
            Run.objects.filter(pk=run.pk).update(schedule=schedule)
            Schedule.objects.filter(pk=schedule.pk).update(last_error="")
    except LaunchError as exc:
        why = "; ".join(exc.problems[:10])
        Schedule.objects.filter(pk=schedule.pk).update(last_error=why)
        logger.warning("schedule %s of %s did not launch: %s", schedule.pk, schedule.experiment.slug, why)
        alerts.alert_not_launched(schedule, why)
        return None
    logger.info("schedule %s launched run %s of %s", schedule.pk, run.pk, schedule.experiment.slug)
    return run


def ensure_may_change(schedule: Schedule, user) -> None:
    """Who may change, pause, run now or delete a schedule: its author, or staff."""
    if not (user.is_staff or (schedule.created_by_id is not None and schedule.created_by_id == user.pk)):
        raise PermissionError("only the person who made this schedule, or staff, may change it")
