"""The criteria graded inside a trial's container (`sandbox.driver: docker`): `verifier`,
Harbor's tests/test.sh and its reward file. The runner runs the script (`run_verifier` of the
grading context) and this family reads its rewards: one result per key of reward.json, each
with an equal share of the criterion's weight (`split_rewards`), or the one number of
reward.txt. Pure Python, no Django.
"""

from __future__ import annotations

import dataclasses

from runs_app.engine.criteria.base import (
    CriterionConfigError,
    CriterionResult,
    CriterionType,
    GradingContext,
    allow_only,
)

VERIFIER_FIELDS = {"tests_dir", "script", "timeout", "env", "user"}


def check_verifier(params: dict) -> None:
    allow_only(params, "verifier", VERIFIER_FIELDS)
    timeout = params.get("timeout", 600)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise CriterionConfigError(f"verifier: 'timeout' must be a number of seconds > 0, got {timeout!r}")
    env = params.get("env") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise CriterionConfigError("verifier: 'env' must map variable names to strings")


def evaluate_verifier(params: dict, ctx: GradingContext) -> tuple[float, dict]:
    """The script's rewards (by name, in details) and their mean as the criterion's score (the
    one number of reward.txt; `split_rewards` makes reward.json's keys results of their own)."""
    if ctx.run_verifier is None:
        raise RuntimeError("a verifier runs only inside the trial's container (sandbox.driver: docker)")
    rewards, details = ctx.run_verifier(params)
    return sum(rewards.values()) / len(rewards), {**details, "rewards": rewards}


def split_rewards(result: CriterionResult, epsilon: float) -> list[CriterionResult]:
    """A verifier's result as one result per reward of its reward.json (each named by its key,
    with the criterion's threshold and gating and an equal share of its weight); reward.txt's
    single "reward" stays one result."""
    rewards = result.details.get("rewards") if result.error is None else None
    if not isinstance(rewards, dict) or list(rewards) == ["reward"] or not result.details.get("reward_json"):
        return [result]
    share = result.weight / len(rewards)
    parts = []
    for name, score in rewards.items():
        details = {"reward": name, **{k: v for k, v in result.details.items() if k != "rewards"}}
        parts.append(
            dataclasses.replace(
                result,
                description=f"{result.description}: {name}" if result.description else name,
                score=float(score),
                passed=float(score) + epsilon >= result.pass_threshold,
                weight=share,
                details=details,
            )
        )
    return parts


CRITERIA = [CriterionType("verifier", check_verifier, evaluate_verifier)]
