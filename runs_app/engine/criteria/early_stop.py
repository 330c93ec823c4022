"""coder-eval's early stop: armed criteria decided while the agent runs (no Django).

A `stop_early:` block on a `command_executed` or `skill_triggered` criterion arms it
(`run_limits.stop_early: false` disarms them all). After each tool call the `Watcher` asks every
armed criterion for a live verdict on the trajectory so far, and stops the agent once the result
cannot change:

- a fail-stop when an armed criterion failed (a `max_count` exceeded, or `decide_within` tool
  calls passed with the criterion undecided) and the best score the armed set can still reach
  is below `run_limits.stop_early_gate_threshold`; held while a criterion that may still pass
  is undecided;
- a pass-stop when the criteria with `on_pass: stop` have passed enough to meet the threshold,
  held while another criterion that may still pass is undecided.

A trigger an instance can never decide is inert (`command_executed` with `max_count` set can only
fail live; without `max_count` and with `min_count > 0` it can only pass; a `skill_triggered`
whose row expects its skill can only pass, a distractor only fail). Verdicts latch once decided. An
early-stopped trial gates on the armed subset only (`armed_gate_passed`); unarmed criteria are
still graded and shown. The rules and reason names are coder-eval's
(`orchestration/early_stop.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runs_app.engine.criteria.commands import engaged_skills, matching_calls

CRITERION_PASSED = "criterion_passed"
CRITERION_FAILED = "criterion_failed"
DECISION_BUDGET_EXCEEDED = "decision_budget_exceeded"
UNDECIDED, PASS, FAIL = "undecided", "pass", "fail"


@dataclass(frozen=True)
class EarlyStop:
    reason: str
    criterion_index: int
    description: str
    tool_call_index: int
    gate_threshold: float

    def event(self) -> dict[str, Any]:
        return {
            "text": f"stopped early ({self.reason.replace('_', ' ')}) by criterion "
            f"{self.criterion_index + 1}{': ' + self.description if self.description else ''} "
            f"after {self.tool_call_index} tool calls",
            "early_stop": self.reason,
            "criterion_index": self.criterion_index,
            "tool_call_index": self.tool_call_index,
            "gate_threshold": self.gate_threshold,
        }


LIVE_TYPES = ("command_executed", "skill_triggered")


def armed(criterion: dict) -> bool:
    return criterion.get("type") in LIVE_TYPES and criterion.get("stop_early") is not None


def gate_threshold(config: dict) -> float:
    return float((config.get("run_limits") or {}).get("stop_early_gate_threshold", 1.0))


def armed_gate_passed(criteria: list[dict], results: list[Any], threshold: float) -> bool:
    """coder-eval's gate of an early-stopped trial: each armed criterion counts as passed or not,
    weighted; the trial passes when that share reaches the threshold (1.0 = all armed passed)."""
    pairs = [(c, r) for c, r in zip(criteria, results, strict=True) if armed(c)]
    total = sum(float(c.get("weight", 1.0)) for c, _ in pairs)
    if total <= 0:
        return False
    return sum(float(c.get("weight", 1.0)) for c, r in pairs if r.passed) / total >= threshold


def _polarities(criterion: dict) -> frozenset[str]:
    if criterion.get("type") == "skill_triggered":
        return frozenset({PASS if _expects_skill(criterion) else FAIL})
    if criterion.get("max_count") is not None:
        return frozenset({FAIL})
    return frozenset({PASS}) if criterion.get("min_count", 1) > 0 else frozenset()


def _expects_skill(criterion: dict) -> bool:
    return criterion.get("expected_skill") == criterion.get("skill_name")


def live_verdict(criterion: dict, calls: list[dict]) -> str:
    if criterion.get("type") == "skill_triggered":
        # Any engagement decides: its absence never can be known before the end.
        if criterion.get("skill_name") not in engaged_skills(calls):
            return UNDECIDED
        return PASS if _expects_skill(criterion) else FAIL
    count = len(matching_calls(criterion, calls))
    max_count, min_count = criterion.get("max_count"), criterion.get("min_count", 1)
    if max_count is not None and count > max_count:
        return FAIL
    if max_count is None and min_count > 0 and count >= min_count:
        return PASS
    return UNDECIDED


class Watcher:
    def __init__(self, criteria: list[dict], threshold: float) -> None:
        self.armed = [(i, c) for i, c in enumerate(criteria) if armed(c)]
        self.threshold = threshold
        self.weights = [float(c.get("weight", 1.0)) for _, c in self.armed]
        self.decidable = [_polarities(c) for _, c in self.armed]
        policies = [c["stop_early"] for _, c in self.armed]
        pairs = list(zip(policies, self.decidable, strict=True))
        self.pass_trigger = [p.get("on_pass", "continue") == "stop" and PASS in pol for p, pol in pairs]
        self.fail_trigger = [FAIL in pol for pol in self.decidable]
        self.budget = [p.get("decide_within") if PASS in pol else None for p, pol in pairs]
        self.latched = [UNDECIDED] * len(self.armed)
        self.expired = [False] * len(self.armed)
        self.previous = [UNDECIDED] * len(self.armed)
        self.stopped: EarlyStop | None = None

    @classmethod
    def for_config(cls, config: dict) -> Watcher | None:
        """A watcher when some criterion is armed and run_limits.stop_early is not false."""
        if (config.get("run_limits") or {}).get("stop_early") is False:
            return None
        criteria = config.get("success_criteria") or []
        if not any(armed(c) for c in criteria):
            return None
        return cls(criteria, gate_threshold(config))

    def observe(self, calls: list[dict]) -> EarlyStop | None:
        """Judge the trajectory so far (`calls` as graded); the stop, once one fires."""
        if self.stopped is None:
            self.stopped = self._judge(calls)
        return self.stopped

    def _verdicts(self, calls: list[dict]) -> list[str]:
        verdicts = []
        for k, (_, criterion) in enumerate(self.armed):
            verdict = self.latched[k]
            if verdict == UNDECIDED:
                verdict = live_verdict(criterion, calls)
                budget = self.budget[k]
                if verdict == UNDECIDED and budget is not None and len(calls) >= budget:
                    verdict, self.expired[k] = FAIL, True
                self.latched[k] = verdict
            verdicts.append(verdict)
        return verdicts

    def _judge(self, calls: list[dict]) -> EarlyStop | None:
        verdicts = self._verdicts(calls)
        decidable = zip(verdicts, self.decidable, strict=True)
        may_pass_undecided = [v == UNDECIDED and PASS in pol for v, pol in decidable]
        if not any(may_pass_undecided):
            failed = [k for k, v in enumerate(verdicts) if v == FAIL]
            native = [k for k in failed if self.fail_trigger[k] and not self.expired[k]]
            timed_out = [k for k in failed if self.expired[k]]
            ceiling = 1 - sum(self.weights[k] for k in failed) / sum(self.weights)
            if (native or timed_out) and ceiling < self.threshold:
                reason = CRITERION_FAILED if native else DECISION_BUDGET_EXCEEDED
                return self._fire(reason, (native or timed_out)[0], len(calls))
        stoppers = [k for k, trigger in enumerate(self.pass_trigger) if trigger]
        held = any(undecided and not self.pass_trigger[k] for k, undecided in enumerate(may_pass_undecided))
        weight = sum(self.weights[k] for k in stoppers)
        if stoppers and not held and weight > 0:
            floor = sum(self.weights[k] for k in stoppers if verdicts[k] == PASS) / weight
            if floor >= self.threshold:
                flipped = [k for k in stoppers if verdicts[k] != self.previous[k]]
                return self._fire(CRITERION_PASSED, (flipped or stoppers)[-1], len(calls))
        self.previous = verdicts
        return None

    def _fire(self, reason: str, k: int, tool_calls: int) -> EarlyStop:
        index, criterion = self.armed[k]
        return EarlyStop(reason, index, str(criterion.get("description") or ""), tool_calls, self.threshold)
