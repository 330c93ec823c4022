from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.urls import reverse

from experiments_app.specs.task import TASK_ID_RE


class Bundle(models.Model):
    """A task's (or an experiment's) YAML plus every file it references.

    Content-addressed: the sha256 of the canonical uncompressed bundle is the
    primary key, so identical content is stored once and never changes.
    """

    digest = models.CharField(max_length=64, primary_key=True)
    data = models.BinaryField()
    size = models.PositiveBigIntegerField(help_text="Uncompressed size in bytes")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"bundle {self.digest[:12]} ({self.size} bytes)"


class TaskSet(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    tasks = models.ManyToManyField("Task", related_name="task_sets", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Archived sets are left out of the task-set list (experiments keep using them).
    archived = models.BooleanField(default=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class TaskQuerySet(models.QuerySet):
    def active(self):
        """Tasks a run may select: not marked `skip`."""
        return self.filter(skip=False)

    def with_tags(self, include: list[str], exclude: list[str]):
        """Tasks carrying any of `include` (all tasks when empty) and none of `exclude`.

        Tags live in a JSON list; matching happens in Python because JSON
        containment is not portable between SQLite and PostgreSQL. Task counts
        are in the thousands, which keeps this cheap.
        """
        include_set, exclude_set = set(include), set(exclude)
        ids = [
            pk
            for pk, tags in self.values_list("pk", "tags")
            if (not include_set or include_set & set(tags)) and not exclude_set & set(tags)
        ]
        return self.filter(pk__in=ids)


class Task(models.Model):
    """The current state of a task; every imported change becomes a TaskVersion."""

    # What a new version sets on its task (bulk imports update exactly these).
    VERSIONED_FIELDS = (
        "description", "prompt", "tags", "skip", "spec", "source_yaml", "source_path", "bundle",
        "version", "warnings",
    )  # fmt: skip

    slug = models.CharField(
        max_length=200,
        unique=True,
        validators=[RegexValidator(TASK_ID_RE, "letters, digits, '-', '_' and single dots inside")],
        help_text="coder-eval task_id",
    )
    description = models.TextField(blank=True)
    prompt = models.TextField(blank=True)
    tags = models.JSONField(default=list, blank=True)
    skip = models.BooleanField(default=False)
    spec = models.JSONField(default=dict, help_text="The validated task spec")
    source_yaml = models.TextField()
    source_path = models.CharField(max_length=1000, blank=True)
    bundle = models.ForeignKey(Bundle, on_delete=models.PROTECT, related_name="+")
    version = models.PositiveIntegerField(default=1)
    warnings = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TaskQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    @property
    def digest(self) -> str:
        return self.bundle_id

    @property
    def is_valid(self) -> bool:
        return not self.warnings

    def current_version(self) -> "TaskVersion":
        return self.versions.get(number=self.version)

    def add_version(
        self, *, spec: dict, prompt: str, source_yaml: str, yaml_path: str, bundle_id: str,
        source_path: str = "", dataset_rows: list | None = None, description: str = "",
        tags: list[str] | None = None, skip: bool = False, warnings: list[str] | None = None,
    ) -> "TaskVersion":  # fmt: skip
        """The one place a TaskVersion is made: the next number (1 for a new task), and this
        task's fields set to the new version's, so `version` always names the newest one.
        Returns the version unsaved: the caller saves both (imports do it in bulk)."""
        self.version = 1 if self._state.adding else self.version + 1
        self.spec, self.prompt, self.source_yaml, self.source_path = spec, prompt, source_yaml, source_path
        self.bundle_id, self.description, self.skip = bundle_id, description, skip
        self.tags, self.warnings = list(tags or []), list(warnings or [])
        return TaskVersion(
            task=self, number=self.version, spec=spec, prompt=prompt, source_yaml=source_yaml,
            yaml_path=yaml_path, bundle_id=bundle_id, dataset_rows=list(dataset_rows or []),
        )  # fmt: skip


class TaskVersion(models.Model):
    """An immutable snapshot of a task: runs point here, so editing a task never changes a past run."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    spec = models.JSONField()
    prompt = models.TextField(blank=True)
    source_yaml = models.TextField()
    yaml_path = models.CharField(max_length=1000, help_text="Path of the YAML inside the bundle")
    bundle = models.ForeignKey(Bundle, on_delete=models.PROTECT, related_name="task_versions")
    dataset_rows = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["task", "-number"]
        constraints = [
            # Serves "version N of task T" lookups and keeps numbering unique.
            models.UniqueConstraint(fields=["task", "number"], name="taskversion_task_number_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.task.slug} v{self.number}"

    @property
    def digest(self) -> str:
        return self.bundle_id


class ExperimentQuerySet(models.QuerySet):
    def with_variants(self):
        """Experiments with their baseline and variants loaded (lists and the API)."""
        return self.select_related("baseline").prefetch_related("variants")


class Experiment(models.Model):
    slug = models.SlugField(max_length=200, unique=True, help_text="coder-eval experiment_id")
    name = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    defaults = models.JSONField(default=dict, blank=True, help_text="Layer applied under every task")
    task_sets = models.ManyToManyField(TaskSet, related_name="experiments", blank=True)
    include_tags = models.JSONField(default=list, blank=True)
    exclude_tags = models.JSONField(default=list, blank=True)
    repeats = models.PositiveIntegerField(default=1)
    max_parallel = models.PositiveIntegerField(default=4)
    baseline = models.ForeignKey(
        "Variant", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    gates = models.JSONField(default=list, blank=True)
    source_yaml = models.TextField(blank=True)
    yaml_path = models.CharField(max_length=1000, blank=True, help_text="Path of the YAML inside the bundle")
    bundle = models.ForeignKey(Bundle, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ExperimentQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name or self.slug

    def get_absolute_url(self) -> str:
        return reverse("experiment_detail", args=[self.slug])

    def selected_tasks(self, include_skipped: bool = False):
        """The tasks a run of this experiment covers: its task sets (all tasks when
        none), narrowed by include/exclude tags."""
        tasks = Task.objects.all()
        if not include_skipped:
            tasks = tasks.active()
        set_ids = list(self.task_sets.values_list("pk", flat=True))
        if set_ids:
            tasks = tasks.filter(task_sets__in=set_ids).distinct()
        return tasks.with_tags(self.include_tags, self.exclude_tags).order_by("slug")


class Variant(models.Model):
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="variants")
    slug = models.SlugField(max_length=200, help_text="coder-eval variant_id")
    description = models.TextField(blank=True)
    position = models.PositiveIntegerField(default=0)
    agent = models.JSONField(default=dict, blank=True)
    prompt_mutations = models.JSONField(default=list, blank=True)
    run_limits = models.JSONField(default=dict, blank=True)
    repeats = models.PositiveIntegerField(null=True, blank=True, help_text="Overrides the experiment's")
    overrides = models.JSONField(
        default=dict, blank=True, help_text="Other task-level fields this variant sets"
    )

    class Meta:
        ordering = ["experiment", "position", "pk"]
        constraints = [
            # Serves variant lookup by slug inside an experiment (URLs, YAML import).
            models.UniqueConstraint(fields=["experiment", "slug"], name="variant_experiment_slug_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.experiment.slug}/{self.slug}"

    def effective_repeats(self) -> int:
        return self.repeats or self.experiment.repeats

    def layer(self) -> dict:
        """This variant as a resolution layer (the shape of a task config fragment)."""
        data = dict(self.overrides)
        if self.agent:
            data["agent"] = self.agent
        if self.run_limits:
            data["run_limits"] = self.run_limits
        if self.prompt_mutations:
            data["prompt_mutations"] = self.prompt_mutations
        return data


class QuarantineQuerySet(models.QuerySet):
    def active(self):
        """Quarantines in force (not lifted)."""
        return self.filter(lifted_at__isnull=True)


class Quarantine(models.Model):
    """A task set aside as broken: left out of every comparison (pass rates, gates, reports),
    with its reason shown wherever it is left out, until lifted. Runs still run it."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="quarantines")
    reason = models.TextField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    lifted_at = models.DateTimeField(null=True, blank=True)
    lifted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    objects = QuarantineQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            # At most one quarantine in force per task; serves "is this task quarantined".
            models.UniqueConstraint(
                fields=["task"], condition=Q(lifted_at__isnull=True), name="quarantine_one_active_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task.slug} quarantined: {self.reason}"
