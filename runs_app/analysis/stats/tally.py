"""The one rule for counting outcomes (no Django).

pass rate = passed / (passed + failed + agent errors). An error the agent caused (it crashed, ran
out of turns or budget, overflowed its context: `AGENT_ERROR_CATEGORIES`) is the agent failing
the task, so it counts as a fail. An infrastructure error (the sandbox, the model API, the
grader, a lost worker) says nothing about the agent: it is left out of the rate, counted apart,
and the comparison tests whether the arms' shares of them differ. Cancelled and unfinished trials
are left out. Every page, the gates, the reports and the API count through `Tally`.
"""

from __future__ import annotations

from dataclasses import dataclass

from runs_app.engine.outcome import AGENT_ERROR_CATEGORIES

__all__ = ["AGENT_ERROR_CATEGORIES", "Tally", "pass_rate"]


def pass_rate(passed: int, failed: int) -> float | None:
    """passed / (passed + failed); None when nothing was graded. `failed` includes agent errors."""
    graded = passed + failed
    return passed / graded if graded else None


@dataclass(frozen=True)
class Tally:
    passed: int = 0
    failed: int = 0
    errors: int = 0  # every error, agent-caused or not
    agent_errors: int = 0  # the errors that count as fails

    @property
    def graded(self) -> int:
        """The denominator of the pass rate."""
        return self.passed + self.failed + self.agent_errors

    @property
    def infra_errors(self) -> int:
        return self.errors - self.agent_errors

    @property
    def finished(self) -> int:
        """Trials that reached an outcome other than cancelled."""
        return self.passed + self.failed + self.errors

    @property
    def rate(self) -> float | None:
        return pass_rate(self.passed, self.failed + self.agent_errors)

    @property
    def rate_if_errors_fail(self) -> float | None:
        """The bound beside the rate: every error counted as a fail."""
        return pass_rate(self.passed, self.failed + self.errors)

    @property
    def error_share(self) -> float | None:
        return self.errors / self.finished if self.finished else None
