from django.contrib import admin

from runs_app.models import ApiToken, CriterionResult, Run, Trial, TrialEvent, Worker
from runs_app.tokens import revoke_token


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


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "prefix", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    list_select_related = ("user",)
    search_fields = ("name", "prefix", "user__username")
    # Tokens are created by their owner on the account page (the raw token is shown only there).
    readonly_fields = ("user", "prefix", "key_hash", "created_at", "last_used_at", "revoked_at")
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset) -> None:
        for token in queryset.filter(revoked_at__isnull=True):
            revoke_token(token)
        self.message_user(request, "Tokens revoked.")
