"""Grading a trial: its success criteria on the finished workspace and the agent's trace, in the
trial's sandbox, with the judge's model calls through a gateway of their own.

Used after the agent (`runner`), between the turns of a simulated conversation
(`check_criteria`) and by a re-grade (`regrade`): each hands in what the agent left (`AgentTrace`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from runs_app.engine import criteria, trial_container
from runs_app.engine.context import TrialContext
from runs_app.engine.criteria import early_stop
from runs_app.engine.criteria.early_stop import EarlyStop
from runs_app.engine.criteria.judge import CallRefused, is_judge_failure
from runs_app.engine.gateway import roles
from runs_app.engine.judge_agent import JudgeAgentRunner
from runs_app.engine.outcome import Outcome
from runs_app.engine.sandbox import workspace
from runs_app.engine.trial_sandbox import TrialSandbox
from runs_app.models import Trial

# The final reply kept with the trajectory criteria read (for `evaluate` to grade it again).
FINAL_TEXT_CAP = 100_000
# What a criterion's glob path never finds, unless the pattern names it: coder-eval's default
# list (its resources/default_ignore_patterns.yaml), which is the workspace's plus the folder of
# its CLI mocks.
GLOB_IGNORED = (*workspace.DEFAULT_IGNORE_PATTERNS, "cli_mocks")


@dataclass
class AgentTrace:
    """What grading reads of the agent's run besides the workspace."""

    tool_calls: list[dict] = field(default_factory=list)
    final_text: str = ""
    dialog: list[dict] = field(default_factory=list)  # a simulated conversation, for the criteria
    conversation_end: dict = field(default_factory=dict)  # how it ended: {"reason", "turns"}
    early_stop: EarlyStop | None = None  # the call that decided an armed criterion


def judged(specs: list[dict]) -> bool:
    """Whether grading asks a model (an enabled criterion of a type that needs one)."""
    return any(criteria.needs_model(spec) and spec.get("enabled", True) for spec in specs)


def grade(box: TrialSandbox, context: TrialContext, trace: AgentTrace, outcome: Outcome) -> None:
    """Grade the trial into `outcome`: its criteria, score, trajectory and status (passed,
    failed, or an error of the grader)."""
    tool_calls = criteria.graded_calls(trace.tool_calls)
    if outcome.stopped_early and trace.early_stop is not None:
        # The agent was stopped at the deciding call; calls it printed while the stop was on its
        # way never happened as far as the verdict goes.
        tool_calls = tool_calls[: trace.early_stop.tool_call_index]
    grading = criteria.GradingContext(
        workspace=box.workspace,
        tool_calls=tool_calls,
        final_text=trace.final_text,
        run_command=box.run_command,
        dataset_row=context.trial.dataset_row,
        env=dict(os.environ),
        task_dir=box.task_dir,
        reference_dir=box.reference_dir(),
        shared_roots=tuple(mount.path for mount in box.env_mounts),
        dialog=trace.dialog,
        ignore_patterns=glob_ignored(box.ignore_patterns()),
        run_verifier=_verifier(box) if box.container else None,
    )
    specs = context.config.get("success_criteria") or []
    judge = _judge_client(box, context, specs)
    grading.post_model = _judge_post(judge) if judge is not None else None
    if judge is not None:
        grading.run_judge_agent = JudgeAgentRunner(box, judge, context.secret_values)
    try:
        result = criteria.grade(specs, grading)
    finally:
        if judge is not None:
            judge.close()
            context.account(judge)
    outcome.trajectory = {"tool_calls": tool_calls, "final_text": trace.final_text[:FINAL_TEXT_CAP]}
    if expected := context.config.get("expected_commands"):
        # coder-eval's task-level command budget: a figure of the trial, not a criterion.
        actual = len(tool_calls)
        efficiency = criteria.commands.commands_efficiency(actual, expected)
        outcome.trajectory["commands"] = {"actual": actual, "expected": expected, "efficiency": efficiency}
    if trace.dialog:
        outcome.trajectory["dialog"] = trace.dialog
        outcome.trajectory["conversation"] = trace.conversation_end
    if outcome.stopped_early:
        result.passed = not result.error and early_stop.armed_gate_passed(
            specs, result.criteria, early_stop.gate_threshold(context.config)
        )
    outcome.criteria = result.criteria
    outcome.score = result.score
    if result.error:
        outcome.status = Trial.Status.ERROR
        outcome.error_category = error_category(result.criteria)
        outcome.error_message = result.error
    else:
        outcome.status = Trial.Status.PASSED if result.passed else Trial.Status.FAILED


def glob_ignored(task_patterns: list[str]) -> frozenset[str]:
    """coder-eval's `get_ignore_patterns`: its defaults plus the task's sandbox.ignore_patterns,
    where `!name` takes a default off."""
    patterns = set(GLOB_IGNORED)
    for entry in (raw.strip() for raw in task_patterns):
        if entry.startswith("!"):
            patterns.discard(entry[1:])
        else:
            patterns.add(entry)
    return frozenset(patterns)


def _verifier(box: TrialSandbox) -> Callable[[dict], tuple[dict[str, float], dict]]:
    def run(params: dict) -> tuple[dict[str, float], dict]:
        found = trial_container.run_verifier(box, params)
        return found.rewards, found.details

    return run


def error_category(results: list[criteria.CriterionResult]) -> str:
    """`judge` when every criterion error is the judge's failure (its key, its endpoint, no usable
    verdict), so such trials are told apart from the grader's own errors; else `grader`."""
    errors = [result.error for result in results if result.error]
    return "judge" if errors and all(is_judge_failure(error) for error in errors) else "grader"


def passes_now(box: TrialSandbox, context: TrialContext, trace: AgentTrace) -> bool:
    """The criteria judged on the workspace as it is between two turns (`check_criteria`)."""
    probe = Outcome(Trial.Status.RUNNING)
    box.pull_workspace()  # an image's folder, as the agent left it this turn
    grade(box, context, trace, probe)
    return probe.status == Trial.Status.PASSED


def _judge_client(box: TrialSandbox, context: TrialContext, specs: list[dict]) -> roles.RoleClient | None:
    """The judge's own gateway, when a criterion asks a model (llm_judge's calls, an agent_judge's
    agent): its calls are the judge's (counted, priced, `budgets.judge`). Without a key there is
    none, and the criterion says
    which key to set."""
    if not judged(specs):
        return None
    try:
        _, upstream = roles.endpoint(os.environ, "EVALSITE_JUDGE_PROVIDER")
    except roles.ModelCallError:
        return None
    context.secret_values.append(upstream.key)
    return roles.RoleClient("judge", box.root / "judge.sock", upstream, context.budget("judge"))


def _judge_post(client: roles.RoleClient) -> Callable[[dict, float], dict]:
    """The judge's calls through its gateway. A used-up `budgets.judge` is the task's limit, not the
    judge failing: the criterion says so as CallRefused (and its trial stays a `grader` error)."""

    def post(body: dict, timeout: float) -> dict:
        try:
            return client.post(body, timeout)
        except roles.BudgetRefused as exc:
            raise CallRefused(str(exc)) from None

    return post
