from urllib.parse import urlsplit

from django.conf import settings
from django.db import models
from django.db.models import Case, Count, IntegerField, OuterRef, Q, Subquery, Value, When
from django.urls import reverse
from django.utils import timezone

from experiments_app.models import Experiment, TaskVersion, Variant


class RunQuerySet(models.QuerySet):
    def listed(self):
        """Runs as the lists show them: with their experiment, without the large columns."""
        return self.select_related("experiment").defer(*self.model.BULKY_FIELDS)

    def running_first(self):
        """Queued and running runs first, then the others, newest first within each group."""
        live = Case(
            When(status__in=["queued", "running"], then=Value(0)),
            default=Value(1),
            output_field=IntegerField(),
        )
        return self.order_by(live, "-created_at")

    def last_good(self, experiment_id: int, before: "Run | None" = None):
        """The newest run of the experiment that ended well, launched before `before` (when given):
        finished, not cancelled, and every gate held (a run without gates: it finished). What
        "compare with the last good run" and an alert's link compare with."""
        runs = self.filter(experiment_id=experiment_id, status=Run.Status.FINISHED).exclude(
            gates_passed=False
        )
        if before is not None:
            runs = runs.filter(created_at__lte=before.created_at).exclude(pk=before.pk)
        return runs.order_by("-created_at", "-pk").first()

    def newest(self, count: int):
        """The `count` most recently launched runs (what a comparison of runs shows by default)."""
        return self.order_by("-created_at", "-pk")[:count]

    def mark_started(self, run_id: int) -> int:
        """A queued run becomes running when its first trial is claimed."""
        return self.filter(pk=run_id, status=Run.Status.QUEUED).update(
            status=Run.Status.RUNNING, started_at=timezone.now()
        )


def with_last_run(experiments):
    """Annotate each experiment with its newest run's id, status and counts (one query)."""
    newest = Run.objects.filter(experiment=OuterRef("pk")).order_by("-created_at", "-pk")
    names = ("pk", "status", "n_trials", "n_passed", "n_failed", "n_error", "created_at")
    return experiments.annotate(**{f"last_run_{name}": Subquery(newest.values(name)[:1]) for name in names})


class Run(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        FINISHED = "finished"
        CANCELLED = "cancelled"

    class Suite(models.TextChoices):
        """Where its `hooks.suite` stands (NONE: it has none)."""

        NONE = "", "no suite hooks"
        PENDING = "pending", "waiting for a worker"
        SETTING_UP = "setting_up", "setting up"
        READY = "ready", "ready"
        FAILED = "failed", "setup failed"
        TORN_DOWN = "torn_down", "torn down"

    experiment = models.ForeignKey(Experiment, on_delete=models.PROTECT, related_name="runs")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    config = models.JSONField(default=dict, help_text="Frozen experiment, variants and overrides")
    overrides = models.JSONField(default=list, blank=True, help_text="path=value strings")
    fingerprint = models.CharField(max_length=64, blank=True)
    max_parallel = models.PositiveIntegerField(default=4)
    sample_seed = models.BigIntegerField(null=True, blank=True)
    keep_artifacts = models.BooleanField(default=False)
    historical = models.BooleanField(default=False, help_text="Imported results: read-only")
    cancel_requested = models.BooleanField(default=False)
    # The code version it was launched on: its trials go only to workers running that version
    # (a rolling upgrade keeps one run's results comparable), unless any_code_version says so.
    code_version = models.CharField(max_length=64, blank=True)
    any_code_version = models.BooleanField(default=False)
    # Why the run stopped before its end, in words (fail-fast: the error every trial hit).
    stop_reason = models.TextField(blank=True)
    # hooks.suite: set up once on one worker host, whose workers then take every trial; the worker
    # holding it renews its lease, and teardown runs there once the run has ended.
    suite_status = models.CharField(max_length=16, choices=Suite.choices, blank=True, default=Suite.NONE)
    suite_host = models.CharField(max_length=200, blank=True)
    suite_dir = models.CharField(max_length=500, blank=True)  # on suite_host; trials mount it read-only
    suite_owner = models.CharField(max_length=200, blank=True)
    suite_lease_expires_at = models.DateTimeField(null=True, blank=True)
    suite_attempt = models.PositiveIntegerField(default=0)
    # Each setup and teardown command's output, as the run page shows it.
    suite_log = models.JSONField(default=list, blank=True)
    suite_error = models.TextField(blank=True)
    # Its UnitTally rows are complete (runs from before the tallies are rolled up when first read).
    tallied = models.BooleanField(default=False)
    # Bumped by every change to its tallies: a comparison computed at one version holds until the next.
    tally_version = models.PositiveBigIntegerField(default=0)
    # Counts are derived from trial outcomes (refresh_counts), never from exit codes.
    n_trials = models.PositiveIntegerField(default=0)
    n_queued = models.PositiveIntegerField(default=0)
    n_running = models.PositiveIntegerField(default=0)
    n_passed = models.PositiveIntegerField(default=0)
    n_failed = models.PositiveIntegerField(default=0)
    n_error = models.PositiveIntegerField(default=0)
    n_cancelled = models.PositiveIntegerField(default=0)
    suite_results = models.JSONField(default=list, blank=True, help_text="Dataset suite thresholds")
    # What its trials ran with, per variant and component: {variant id: {component: {fingerprint:
    # value}}}, kept as trials are stored (`rollup`), read by a comparison of several runs.
    components = models.JSONField(default=dict, blank=True)
    gates = models.JSONField(default=list, blank=True, help_text="The experiment's gates, frozen")
    gate_results = models.JSONField(default=list, blank=True, help_text="Each gate's verdict at run end")
    gates_passed = models.BooleanField(null=True)
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    # The schedule that launched it: its end may send that schedule's alert.
    schedule = models.ForeignKey(
        "Schedule", null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # Home page: running runs first, then recent ones.
            models.Index(fields=["status", "-created_at"], name="run_status_created_idx"),
            # Experiment page: its runs, newest first.
            models.Index(fields=["experiment", "-created_at"], name="run_experiment_created_idx"),
        ]

    # JSON the run lists and a run's control (counting, dispatching) never read: left unloaded.
    BULKY_FIELDS = ("config", "overrides", "suite_results", "gates", "gate_results", "suite_log")

    def __str__(self) -> str:
        return f"run {self.pk} of {self.experiment.slug}"

    def get_absolute_url(self) -> str:
        return reverse("run_detail", args=[self.pk])

    @property
    def is_final(self) -> bool:
        return self.status in (self.Status.FINISHED, self.Status.CANCELLED)

    @property
    def n_done(self) -> int:
        return self.n_passed + self.n_failed + self.n_error + self.n_cancelled

    def refresh_counts(self) -> int:
        """Recount this run's current trials by status and store the counts. Returns how many
        queued trials were already sent to a worker (dispatch counts them as busy slots)."""
        counts = (
            Trial.objects.for_run(self)
            .current()
            .aggregate(
                total=Count("pk"),
                sent=Count("pk", filter=Q(status=Trial.Status.QUEUED, dispatched_at__isnull=False)),
                **{status: Count("pk", filter=Q(status=status)) for status in Trial.Status.values},
            )
        )
        self.n_trials = counts["total"]
        for status in Trial.Status.values:
            setattr(self, f"n_{status}", counts[status])
        self.save(
            update_fields=[
                "n_trials",
                *(f"n_{status}" for status in Trial.Status.values),
            ]
        )
        return counts["sent"]


class TrialQuerySet(models.QuerySet):
    def for_run(self, run: Run):
        return self.filter(run=run)

    def current(self):
        """The current attempt of each trial slot (retries keep the old rows as history)."""
        # `IN (true)`, not `= true`: SQLite renders is_latest=True as a bare `is_latest`, which
        # cannot seek trial_comparison_idx (the comparison's GROUP BY then sorts: 140 ms
        # instead of 90 ms at 100,000 trials).
        return self.filter(is_latest__in=[True])

    def finished(self):
        return self.filter(status__in=Trial.FINAL_STATUSES)

    def pending(self):
        """Trials still to run: queued or running."""
        return self.filter(status__in=[Trial.Status.QUEUED, Trial.Status.RUNNING])


class Trial(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        PASSED = "passed"
        FAILED = "failed"
        ERROR = "error"
        CANCELLED = "cancelled"

    class EarlyStop(models.TextChoices):
        CRITERION_PASSED = "criterion_passed", "an armed criterion passed"
        CRITERION_FAILED = "criterion_failed", "an armed criterion failed"
        DECISION_BUDGET_EXCEEDED = "decision_budget_exceeded", "an armed criterion stayed undecided too long"

    FINAL_STATUSES = (Status.PASSED, Status.FAILED, Status.ERROR, Status.CANCELLED)

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="trials")
    task_version = models.ForeignKey(TaskVersion, on_delete=models.PROTECT, related_name="trials")
    variant = models.ForeignKey(Variant, on_delete=models.PROTECT, related_name="trials")
    replicate = models.PositiveIntegerField(default=0)
    dataset_row_id = models.CharField(max_length=200, blank=True)
    dataset_row = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    attempt = models.PositiveIntegerField(default=1)
    is_latest = models.BooleanField(default=True, help_text="False for attempts replaced by a retry")
    previous_attempt = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    dispatched_at = models.DateTimeField(null=True, blank=True, help_text="When an execute message was sent")
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # The worker host of its latest claim.
    host = models.CharField(max_length=200, blank=True)
    # The resolved configuration this trial runs with, and which layer set each field.
    config = models.JSONField(default=dict)
    lineage = models.JSONField(default=dict, blank=True)
    prompt = models.TextField(blank=True)
    config_fingerprint = models.CharField(max_length=64, blank=True)
    # What ran it, one fingerprint per component (agent, answerer, grader, environment: a mapping
    # a driver fills, e.g. a container's image digest): `engine.identity`.
    components = models.JSONField(default=dict, blank=True)
    score = models.FloatField(null=True, blank=True)
    queued_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    setup_seconds = models.FloatField(null=True, blank=True)
    agent_seconds = models.FloatField(null=True, blank=True)
    grading_seconds = models.FloatField(null=True, blank=True)
    duration_seconds = models.FloatField(null=True, blank=True)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cache_read_tokens = models.PositiveBigIntegerField(default=0)
    cache_creation_tokens = models.PositiveBigIntegerField(default=0)
    cost_usd = models.FloatField(default=0.0)
    turns = models.PositiveIntegerField(default=0)
    # The model calls the worker made for the trial besides the agent's, by role: {"answerer":
    # {input_tokens, output_tokens, ..., cost_usd, calls}, "judge": {...}}. The columns above are
    # the agent's; the two costs below are summed into the unit tallies.
    role_usage = models.JSONField(default=dict, blank=True)
    answerer_cost_usd = models.FloatField(default=0.0)
    judge_cost_usd = models.FloatField(default=0.0)
    error_category = models.CharField(max_length=50, blank=True)
    error_message = models.TextField(blank=True)
    timed_out = models.BooleanField(default=False)
    # What the agent changed of the task's protected paths (`integrity.protected`), with the diff;
    # "" when it changed none. A tampered trial fails.
    tampered = models.TextField(blank=True)
    # A container trial's image as its worker's engine names it (`sha256:...`): what the
    # environment was, for provenance and for telling runs apart. "" outside containers.
    image_digest = models.CharField(max_length=100, blank=True)
    budget_exceeded = models.CharField(
        max_length=30,
        blank=True,
        help_text="Which limit stopped the agent: tokens, usd, turns, max_tool_calls, disk...",
    )
    stopped_early = models.CharField(
        max_length=30,
        blank=True,
        choices=EarlyStop.choices,
        help_text="Why an armed criterion stopped the agent (coder-eval's early stop)",
    )
    # coder-eval's visible turns: tool calls, plus one for a final reply (run_limits.expected_turns).
    visible_turns = models.PositiveIntegerField(default=0)
    # What the criteria read of the agent's run ({"tool_calls": [...], "final_text": ...}), so
    # `manage.py evaluate` can grade the trial again with other criteria.
    trajectory = models.JSONField(null=True, blank=True)
    agent_exit_code = models.IntegerField(null=True, blank=True)
    agent_stdout = models.TextField(blank=True)
    agent_stderr = models.TextField(blank=True)
    diff = models.TextField(blank=True)
    diff_truncated = models.BooleanField(default=False)
    artifact = models.CharField(max_length=500, blank=True, help_text="Storage name of the tar.gz")

    objects = TrialQuerySet.as_manager()

    class Meta:
        ordering = ["pk"]
        indexes = [
            # Run page counts by status; dispatch: a run's queued trials not yet sent, breadth-
            # first over replicates (LIMIT the free slots), and those sent but not yet claimed.
            models.Index(
                fields=["run", "status", "dispatched_at", "replicate", "id"], name="trial_run_dispatch_idx"
            ),
            # Comparison and run-page aggregates per (run, variant, task), read from the index
            # alone: trial rows carry KBs of config, transcript and diff that SQLite would read.
            models.Index(
                fields=[
                    "run",
                    "is_latest",
                    "variant",
                    "task_version",
                    "status",
                    "score",
                    "duration_seconds",
                    "input_tokens",
                    "output_tokens",
                    "cache_read_tokens",
                    "cache_creation_tokens",
                    "cost_usd",
                    "config_fingerprint",
                    "dataset_row_id",
                    "id",
                ],
                name="trial_comparison_idx",
            ),  # fmt: skip
            # Reaper: running trials whose lease expired.
            models.Index(fields=["status", "lease_expires_at"], name="trial_status_lease_idx"),
            # Run page trial table, newest finished first.
            models.Index(fields=["run", "-finished_at"], name="trial_run_finished_idx"),
            # Run page trial table in launch order (the default: rows stay put as trials finish).
            models.Index(fields=["run", "id"], name="trial_run_launch_idx"),
            # Run page trial table, slowest first.
            models.Index(fields=["run", "-duration_seconds"], name="trial_run_duration_idx"),
        ]

    def __str__(self) -> str:
        return f"trial {self.pk} ({self.status})"

    def get_absolute_url(self) -> str:
        return reverse("trial_detail", args=[self.run_id, self.pk])

    @property
    def is_final(self) -> bool:
        return self.status in self.FINAL_STATUSES

    @property
    def turns_over_expected(self) -> tuple[int, int] | None:
        """(visible turns, expected) when the trial took more than run_limits.expected_turns."""
        expected = (self.config.get("run_limits") or {}).get("expected_turns")
        if isinstance(expected, int) and self.visible_turns > expected:
            return self.visible_turns, expected
        return None

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_creation_tokens

    @property
    def label(self) -> str:
        """`task[row]#replicate`: the trial's name in reports, JUnit and exports (needs the task)."""
        row = f"[{self.dataset_row_id}]" if self.dataset_row_id else ""
        return f"{self.task_version.task.slug}{row}#{self.replicate}"


class CriterionResult(models.Model):
    trial = models.ForeignKey(Trial, on_delete=models.CASCADE, related_name="criterion_results")
    index = models.PositiveIntegerField()
    type = models.CharField(max_length=50)
    description = models.TextField(blank=True)
    score = models.FloatField()
    passed = models.BooleanField()
    weight = models.FloatField(default=1.0)
    pass_threshold = models.FloatField(default=1.0)
    gating = models.BooleanField(default=True)
    details = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["trial", "index"]
        constraints = [
            # Serves the trial page's ordered criterion list; one result per criterion.
            models.UniqueConstraint(fields=["trial", "index"], name="criterionresult_trial_index_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.type} #{self.index}: {'pass' if self.passed else 'fail'}"


class UnitTally(models.Model):
    """The current trials of one unit (task version, dataset row) in one variant of a run, summed:
    what the comparison, the gates and the reports read instead of the trials themselves.
    Written by `analysis.rollup` only; every change to a run's trials is followed by it."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tallies", db_index=False)
    variant = models.ForeignKey(Variant, on_delete=models.CASCADE, related_name="+", db_index=False)
    task_version = models.ForeignKey(TaskVersion, on_delete=models.CASCADE, related_name="+", db_index=False)
    dataset_row_id = models.CharField(max_length=200, blank=True)
    total = models.PositiveIntegerField(default=0)
    passed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    agent_errors = models.PositiveIntegerField(default=0)
    cancelled = models.PositiveIntegerField(default=0)
    score_sum = models.FloatField(default=0.0)
    score_n = models.PositiveIntegerField(default=0)
    duration_sum = models.FloatField(default=0.0)
    duration_n = models.PositiveIntegerField(default=0)
    tokens = models.PositiveBigIntegerField(default=0)
    cost = models.FloatField(default=0.0)  # the agent's
    answerer_cost = models.FloatField(default=0.0)
    judge_cost = models.FloatField(default=0.0)
    first_trial_id = models.BigIntegerField(null=True)
    fingerprint_min = models.CharField(max_length=64, blank=True)
    fingerprint_max = models.CharField(max_length=64, blank=True)
    dataset_rows = models.PositiveIntegerField(default=0)
    tampered = models.PositiveIntegerField(default=0)
    # "#1 file_exists" -> [passes, graded]: each criterion over the unit's graded trials.
    criteria = models.JSONField(default=dict)

    class Meta:
        constraints = [
            # One row per unit; also serves reading a run's tallies (run first) and replacing a unit's.
            models.UniqueConstraint(
                fields=["run", "variant", "task_version", "dataset_row_id"], name="unittally_unit_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} variant {self.variant_id} task version {self.task_version_id}"


class TrialEvent(models.Model):
    class Kind(models.TextChoices):
        PHASE = "phase"
        MESSAGE = "message"
        TOOL_CALL = "tool_call"
        TOOL_RESULT = "tool_result"
        OUTPUT = "output"
        USAGE = "usage"
        ERROR = "error"
        SYSTEM = "system"

    trial = models.ForeignKey(Trial, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    at = models.DateTimeField()
    kind = models.CharField(max_length=20, choices=Kind.choices)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["trial", "seq"]
        constraints = [
            # Serves the transcript (events of a trial in order) and the live stream's "after seq N".
            models.UniqueConstraint(fields=["trial", "seq"], name="trialevent_trial_seq_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.seq}"


class ApiToken(models.Model):
    """A personal API token. Only its sha256 is stored; the token is shown once, at creation."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, help_text="The token's first characters, to recognise it")
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class Worker(models.Model):
    """A Celery worker process, as it last reported itself (the workers page, the run page's
    banner, launch pre-flight): its host, how many trials it runs at once, its code and agent
    CLI versions, the model providers it holds a key for, and whether it takes container trials."""

    name = models.CharField(max_length=200, unique=True)
    hostname = models.CharField(max_length=200, blank=True)
    slots = models.PositiveIntegerField(default=0)
    code_version = models.CharField(max_length=64, blank=True)
    agent_versions = models.JSONField(default=dict, blank=True)
    # {"containers": true, "engine": "docker 20.10.24", "images": [...], "missing": [...]} or
    # {"containers": false, "reason": "..."} (engine.hosts.container_engine).
    capabilities = models.JSONField(default=dict, blank=True)
    # The names of the providers (`specs.providers`) whose key or token is in its environment:
    # never the keys themselves.
    providers = models.JSONField(default=list, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField()
    # Its first report since it last failed to report (a database outage): from then to
    # last_seen_at it reached the database without a break (the reaper's evidence).
    reachable_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-last_seen_at"]

    def __str__(self) -> str:
        return self.name


def shown_url(url: str) -> str:
    """A webhook's address as pages and records show it: its scheme and host only. A chat
    webhook carries its secret in the path (whoever holds the URL may post to the channel)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/…" if parts.netloc else "(a webhook)"


class ScheduleQuerySet(models.QuerySet):
    def due(self, now):
        """Enabled schedules whose next launch time has come."""
        return self.filter(enabled=True, next_run_at__lte=now)


class Schedule(models.Model):
    """Runs of an experiment launched at the times a cron expression names (Celery beat checks
    `due` schedules, `runs_app.scheduling`); each run's end may send an alert by e-mail and/or
    webhook (`runs_app.alerts`), decided by the run's gates."""

    class AlertOn(models.TextChoices):
        FAILURE = "failure", "when a gate fails, or the run stops early or cannot start"
        ALWAYS = "always", "after every run"

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="schedules")
    cron = models.CharField(max_length=100, help_text="minute hour day-of-month month day-of-week")
    overrides = models.JSONField(default=list, blank=True, help_text="path=value strings for each run")
    enabled = models.BooleanField(default=True)
    alert_on = models.CharField(max_length=16, choices=AlertOn.choices, default=AlertOn.FAILURE)
    emails = models.JSONField(default=list, blank=True)
    webhook_url = models.URLField(max_length=500, blank=True)
    next_run_at = models.DateTimeField(null=True, blank=True)
    # Why its last launch did not happen (pre-flight, a launch error), in words; "" once one did.
    last_error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ScheduleQuerySet.as_manager()

    class Meta:
        ordering = ["experiment", "pk"]
        indexes = [
            # Beat's tick: enabled schedules whose next launch time has come.
            models.Index(fields=["enabled", "next_run_at"], name="schedule_due_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.experiment.slug} at {self.cron}"

    @property
    def webhook_shown(self) -> str:
        return shown_url(self.webhook_url) if self.webhook_url else ""


class Alert(models.Model):
    """One alert sent (or tried) for a scheduled run, on one channel: at most one per run and
    channel, so a run that two workers finish alerts once."""

    class Channel(models.TextChoices):
        EMAIL = "email"
        WEBHOOK = "webhook"

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="alerts")
    # None: the run could not be launched (that is the alert).
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE, related_name="alerts")
    channel = models.CharField(max_length=16, choices=Channel.choices)
    subject = models.TextField()
    delivered = models.BooleanField(default=False)
    detail = models.TextField(blank=True, help_text="To whom, or why it could not be delivered")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            # One alert per run and channel; also serves a run's alerts (run first).
            models.UniqueConstraint(fields=["run", "channel"], name="alert_run_channel_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.channel} alert: {self.subject}"


class TrialNote(models.Model):
    """A person's label and/or note on a trial (triage: "grader bug", "flaky", why it failed)."""

    trial = models.ForeignKey(Trial, on_delete=models.CASCADE, related_name="notes")
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    label = models.CharField(max_length=40, blank=True)
    text = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "pk"]
        indexes = [
            # A trial's notes in order (trial page, unit view, the failures page's labels).
            models.Index(fields=["trial", "created_at"], name="trialnote_trial_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.label or 'note'} on trial {self.trial_id}"
