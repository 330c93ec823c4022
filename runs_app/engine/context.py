"""What every phase of one trial shares: the trial and its resolved config, its transcript, its
lease, the secret values to redact, and what the worker's own model calls (the roles) spent."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from experiments_app.specs.agent_kinds import DEFAULT_KIND
from runs_app.engine.gateway import roles
from runs_app.engine.leases import Heartbeat
from runs_app.engine.outcome import Outcome
from runs_app.models import Trial, TrialEvent


class Transcript(Protocol):
    """A trial's events as the phases write them (`recording.Recorder`; a re-grade keeps them)."""

    def add(self, kind: str, data: dict[str, Any]) -> None: ...

    def phase(self, name: str, flush: bool = False, **data: Any) -> None: ...

    def flush_if_due(self) -> None: ...


@dataclass
class TrialContext:
    trial: Trial
    config: dict
    recorder: Transcript
    heartbeat: Heartbeat | None
    # Every secret value a phase handled (keys the gateways hold, agent secrets): redacted from
    # whatever is stored. The recorder holds the same list.
    secret_values: list[str] = field(default_factory=list)
    # Tokens and cost of the model calls the worker made for the trial itself, by role
    # (answerer, judge); the agent's are the trial's own columns.
    role_usage: dict[str, dict] = field(default_factory=dict)

    def agent_kind(self) -> str:
        return (self.config.get("agent") or {}).get("type") or DEFAULT_KIND

    def budget(self, role: str) -> dict:
        return (self.config.get("budgets") or {}).get(role) or {}

    def stop_reason(self) -> str | None:
        """Polled while a command runs: the events that waited long enough are written, and a
        cancel or a lost lease stops the command."""
        self.recorder.flush_if_due()
        return self.heartbeat.stop_reason() if self.heartbeat is not None else None

    def account(self, client: roles.RoleClient) -> None:
        """A role's calls into the transcript and its totals onto the trial."""
        for call in client.drain():
            self.recorder.add(TrialEvent.Kind.USAGE, call)
        totals = roles.usage_summary(client.totals())
        previous = self.role_usage.get(client.role)
        if previous:  # the judge of every turn (check_criteria), then the last
            totals = {key: previous.get(key, 0) + value for key, value in totals.items()}
        self.role_usage[client.role] = totals


def stopped(reason: str) -> Outcome:
    """The outcome of a trial stopped by its run's cancel, or by a lost lease."""
    if reason == "cancelled":
        return Outcome(Trial.Status.CANCELLED, "cancelled", "the run was cancelled")
    return Outcome(Trial.Status.ERROR, "lost", "this worker lost the trial's lease")
