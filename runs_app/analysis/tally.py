"""The one rule for counting outcomes (no Django).

pass rate = passed / (passed + failed). An `error` trial (infrastructure or grader failure) is
never a fail and is counted apart; cancelled and unfinished trials are left out. Every page, the
gates, the reports and the API count through `Tally` or `pass_rate`.
"""

from __future__ import annotations

from dataclasses import dataclass

from runs_app.analysis.stats import wilson_interval


def pass_rate(passed: int, failed: int) -> float | None:
    """passed / (passed + failed); None when nothing was graded."""
    graded = passed + failed
    return passed / graded if graded else None


@dataclass(frozen=True)
class Tally:
    passed: int = 0
    failed: int = 0
    errors: int = 0

    @property
    def graded(self) -> int:
        """The denominator of the pass rate."""
        return self.passed + self.failed

    @property
    def finished(self) -> int:
        """Trials that reached an outcome other than cancelled."""
        return self.graded + self.errors

    @property
    def rate(self) -> float | None:
        return pass_rate(self.passed, self.failed)

    @property
    def error_share(self) -> float | None:
        return self.errors / self.finished if self.finished else None

    def interval(self, confidence: float = 0.95) -> tuple[float, float] | None:
        """Wilson's interval of the pooled rate (the trials as independent draws)."""
        return wilson_interval(self.passed, self.graded, confidence) if self.graded else None
