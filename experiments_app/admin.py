from django import forms
from django.contrib import admin, messages
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse

from experiments_app.definitions import ImportFailed, export_tasks_zip, import_upload
from experiments_app.models import Experiment, Task, TaskSet, TaskVersion, Variant


class TagFilter(admin.SimpleListFilter):
    title = "tag"
    parameter_name = "tag"

    def lookups(self, request, model_admin):
        tags = sorted({tag for tags in Task.objects.values_list("tags", flat=True) for tag in tags})
        return [(tag, tag) for tag in tags]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.with_tags([self.value()], [])
        return queryset


class ValidationFilter(admin.SimpleListFilter):
    title = "validation"
    parameter_name = "validation"

    def lookups(self, request, model_admin):
        return [("clean", "clean"), ("warnings", "has warnings")]

    def queryset(self, request, queryset):
        if self.value() == "clean":
            return queryset.filter(warnings=[])
        if self.value() == "warnings":
            return queryset.exclude(warnings=[])
        return queryset


class ChooseSetForm(forms.Form):
    task_set = forms.ModelChoiceField(queryset=TaskSet.objects.all(), required=False)
    new_set = forms.SlugField(required=False, help_text="…or create a new set with this name")

    def clean(self):
        data = super().clean()
        if not data.get("task_set") and not data.get("new_set"):
            raise forms.ValidationError("Choose a task set or name a new one.")
        return data


class UploadForm(forms.Form):
    file = forms.FileField(
        help_text="A task YAML file, or a .zip of a task folder (or a whole suite): coder-eval YAML tasks "
        "and Harbor task folders (task.toml, instruction.md, ...)"
    )
    task_set = forms.SlugField(required=False, help_text="Also add the imported tasks to this set")


class TaskVersionInline(admin.TabularInline):
    model = TaskVersion
    fields = ("number", "bundle", "yaml_path", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ("slug", "description", "tag_list", "version", "short_digest", "skip", "warning_count")
    list_filter = (TagFilter, "task_sets", ValidationFilter, "skip")
    search_fields = ("slug", "description", "prompt")
    # Curation edits only; the spec changes through YAML import, which makes a new version.
    fields = (
        "slug", "description", "tags", "skip", "version", "bundle", "source_path", "prompt",
        "source_yaml", "warnings", "created_at", "updated_at",
    )  # fmt: skip
    readonly_fields = (
        "slug", "version", "bundle", "source_path", "prompt", "source_yaml", "warnings",
        "created_at", "updated_at",
    )  # fmt: skip
    inlines = [TaskVersionInline]
    actions = ["add_to_set", "remove_from_set", "export_as_yaml"]
    change_list_template = "admin/experiments_app/task/change_list.html"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("bundle")

    @admin.display(description="tags")
    def tag_list(self, task: Task) -> str:
        return ", ".join(task.tags)

    @admin.display(description="digest")
    def short_digest(self, task: Task) -> str:
        return task.bundle_id[:12]

    @admin.display(description="warnings")
    def warning_count(self, task: Task) -> int:
        return len(task.warnings)

    def has_add_permission(self, request):
        return False  # tasks arrive through the upload form or `manage.py import_tasks`

    def get_urls(self):
        upload = path(
            "upload/", self.admin_site.admin_view(self.upload_view), name="experiments_app_task_upload"
        )
        return [upload, *super().get_urls()]

    def upload_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_change_permission(request):
            return redirect("admin:index")
        form = UploadForm(request.POST or None, request.FILES or None)
        errors: list[str] = []
        if request.method == "POST" and form.is_valid():
            try:
                report = import_upload(form.cleaned_data["file"], form.cleaned_data["task_set"] or None)
            except ImportFailed as exc:
                errors = exc.issues
            else:
                for warning in report.warnings:
                    messages.warning(request, warning)
                messages.success(request, f"Imported: {report.summary()}")
                return redirect("admin:experiments_app_task_changelist")
        context = {**self.admin_site.each_context(request), "form": form, "errors": errors, "opts": self.opts}
        context["title"] = "Import tasks"
        return render(request, "admin/experiments_app/task/upload.html", context)

    @admin.action(description="Add selected tasks to a task set")
    def add_to_set(self, request, queryset):
        return self._choose_set(request, queryset, "add_to_set", add=True)

    @admin.action(description="Remove selected tasks from a task set")
    def remove_from_set(self, request, queryset):
        return self._choose_set(request, queryset, "remove_from_set", add=False)

    def _choose_set(self, request, queryset, action: str, add: bool):
        form = ChooseSetForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            task_set = form.cleaned_data["task_set"]
            if task_set is None:
                task_set, _ = TaskSet.objects.get_or_create(name=form.cleaned_data["new_set"])
            if add:
                task_set.tasks.add(*queryset)
            else:
                task_set.tasks.remove(*queryset)
            verb = "Added" if add else "Removed"
            prep = "to" if add else "from"
            self.message_user(request, f"{verb} {queryset.count()} task(s) {prep} {task_set.name}.")
            return None
        context = {
            **self.admin_site.each_context(request),
            "form": form,
            "tasks": queryset,
            "action": action,
            "title": "Add tasks to a set" if add else "Remove tasks from a set",
            "opts": self.opts,
        }
        return render(request, "admin/experiments_app/task/choose_set.html", context)

    @admin.action(description="Export selected tasks as YAML (zip)")
    def export_as_yaml(self, request, queryset):
        response = HttpResponse(export_tasks_zip(queryset), content_type="application/zip")
        response["Content-Disposition"] = 'attachment; filename="tasks.zip"'
        return response


class TaskInline(admin.TabularInline):
    model = TaskSet.tasks.through
    autocomplete_fields = ("task",)
    extra = 0
    verbose_name = "task"
    verbose_name_plural = "tasks"


@admin.register(TaskSet)
class TaskSetAdmin(admin.ModelAdmin):
    list_display = ("name", "description", "task_count")
    search_fields = ("name", "description")
    exclude = ("tasks",)
    inlines = [TaskInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(n_tasks=Count("tasks"))

    @admin.display(description="tasks", ordering="n_tasks")
    def task_count(self, task_set: TaskSet) -> int:
        return task_set.n_tasks


class VariantInline(admin.StackedInline):
    model = Variant
    extra = 0
    fields = (
        "slug",
        "description",
        "position",
        "agent",
        "prompt_mutations",
        "run_limits",
        "repeats",
        "overrides",
    )


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = ("slug", "description", "repeats", "max_parallel", "baseline")
    search_fields = ("slug", "description")
    filter_horizontal = ("task_sets",)
    readonly_fields = ("bundle", "yaml_path", "source_yaml", "created_at", "updated_at")
    inlines = [VariantInline]

    def view_on_site(self, experiment: Experiment) -> str:
        return reverse("experiment_detail", args=[experiment.slug])
