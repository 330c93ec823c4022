from django.contrib import admin

from runs_app.models import CriterionResult, Run, Trial, TrialEvent, Worker


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("pk", "experiment", "status", "n_trials", "n_passed", "n_failed", "n_error", "created_at")
    list_filter = ("status", "experiment")
    readonly_fields = ("config", "fingerprint", "created_at", "started_at", "finished_at", "started_by")
    list_select_related = ("experiment",)


class CriterionResultInline(admin.TabularInline):
    model = CriterionResult
    extra = 0
    can_delete = False
    fields = ("index", "type", "description", "score", "passed", "weight", "gating", "error")
    readonly_fields = fields


@admin.register(Trial)
class TrialAdmin(admin.ModelAdmin):
    list_display = ("pk", "run", "variant", "task_version", "replicate", "status", "attempt", "score")
    list_filter = ("status", "error_category")
    list_select_related = ("run__experiment", "variant__experiment", "task_version__task")
    raw_id_fields = ("run", "task_version", "variant", "previous_attempt")
    readonly_fields = ("config", "lineage", "config_fingerprint", "diff", "agent_stdout", "agent_stderr")
    inlines = [CriterionResultInline]


@admin.register(TrialEvent)
class TrialEventAdmin(admin.ModelAdmin):
    list_display = ("trial", "seq", "kind", "at")
    list_filter = ("kind",)
    raw_id_fields = ("trial",)


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ("name", "hostname", "last_seen_at")
