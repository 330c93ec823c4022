"""coder-eval's early stop and evalsite's max_tool_calls: the watcher's rules, then through a real
worker, agents that would run on for seconds and are stopped at the deciding tool call."""

import json

import pytest

from runs_app.engine.criteria import CriterionResult, graded_calls
from runs_app.engine.criteria.early_stop import (
    CRITERION_FAILED,
    CRITERION_PASSED,
    DECISION_BUDGET_EXCEEDED,
    Watcher,
    armed_gate_passed,
)


def call(command: str, status: str = "success") -> dict:
    return {"id": command, "name": "Bash", "input": {"command": command}, "status": status}


def crit(pattern: str, **fields) -> dict:
    return {"type": "command_executed", "command_pattern": pattern, **fields}


def stops(criteria: list[dict], commands: list[str], threshold: float = 1.0):
    watcher = Watcher(criteria, threshold)
    calls = []
    for command in commands:
        calls.append(call(command))
        if stop := watcher.observe(graded_calls(calls)):
            return stop
    return None


def test_a_forbidden_command_fails_the_run_at_once():
    stop = stops([crit("rm -rf", min_count=0, max_count=0, stop_early={})], ["ls", "rm -rf /", "ls"])
    assert (stop.reason, stop.criterion_index, stop.tool_call_index) == (CRITERION_FAILED, 0, 2)


def test_a_pass_stops_only_with_on_pass_stop_and_after_every_other_pass_capable_criterion():
    assert stops([crit("pytest", stop_early={})], ["pytest"]) is None  # on_pass: continue
    criteria = [crit("pytest", stop_early={"on_pass": "stop"}), crit("ruff", stop_early={})]
    # ruff may still pass and has no on_pass: stop, so pytest passing alone does not stop the run
    assert stops(criteria, ["pytest", "ls"]) is None
    stop = stops(criteria, ["pytest", "ruff"])  # ruff decided: nothing holds pytest's pass
    assert (stop.reason, stop.criterion_index, stop.tool_call_index) == (CRITERION_PASSED, 0, 2)
    stop = stops([crit("pytest", stop_early={"on_pass": "stop"})], ["ls", "pytest", "ls"])
    assert (stop.reason, stop.tool_call_index) == (CRITERION_PASSED, 2)


def test_a_fail_is_held_while_a_criterion_that_may_pass_is_undecided():
    criteria = [crit("rm", min_count=0, max_count=0, stop_early={}), crit("pytest", stop_early={})]
    assert stops(criteria, ["rm x", "ls"]) is None  # pytest may still pass: the fail is held
    stop = stops(criteria, ["rm x", "pytest"])
    assert (stop.reason, stop.criterion_index) == (CRITERION_FAILED, 0)


def test_decide_within_turns_an_undecided_criterion_into_a_fail():
    stop = stops([crit("deploy", stop_early={"decide_within": 2})], ["ls", "ls", "deploy"])
    assert (stop.reason, stop.tool_call_index) == (DECISION_BUDGET_EXCEEDED, 2)


def test_a_low_weight_fail_is_absorbed_below_the_threshold():
    criteria = [
        crit("rm", min_count=0, max_count=0, weight=1, stop_early={}),
        crit("curl", min_count=0, max_count=0, weight=9, stop_early={}),
    ]
    assert stops(criteria, ["rm x"], threshold=0.8) is None  # ceiling 0.9 >= 0.8
    assert stops(criteria, ["rm x"], threshold=1.0).reason == CRITERION_FAILED


def test_a_pending_call_never_counts_as_a_success():
    calls = graded_calls([call("pytest", status="pending")])
    watcher = Watcher([crit("pytest", require_success=True, stop_early={"on_pass": "stop"})], 1.0)
    assert watcher.observe(calls) is None


def test_an_early_stopped_trial_gates_on_the_armed_criteria_only():
    criteria = [crit("pytest", stop_early={}), {"type": "file_exists", "path": "x"}]
    results = [
        CriterionResult(
            index=0,
            type="command_executed",
            description="",
            score=1.0,
            passed=True,
            weight=1,
            pass_threshold=0.9,
            gating=True,
        ),
        CriterionResult(
            index=1,
            type="file_exists",
            description="",
            score=0.0,
            passed=False,
            weight=1,
            pass_threshold=0.9,
            gating=True,
        ),
    ]
    assert armed_gate_passed(criteria, results, 1.0)
    results[0].passed = False
    assert not armed_gate_passed(criteria, results, 1.0)


# ---------------------------------------------------------------- through a real worker


def _agent(lines: list[dict], then: str, pause: str = "; sleep 0.2") -> str:
    script = "; ".join(f"echo {json.dumps(json.dumps(line))}{pause}" for line in lines)
    return f"{script}; {then}"


def _bash(command: str) -> dict:
    return {"type": "tool_call", "name": "Bash", "input": {"command": command}, "status": "success"}


NO_RM = "{type: command_executed, command_pattern: 'rm -rf', min_count: 0, max_count: 0, stop_early: {}}"
CASES = {
    # slug: (criteria YAML, run_limits YAML, agent lines)
    "forbidden": (
        f"  - {NO_RM}\n  - {{type: file_exists, path: out.txt}}\n",
        "",
        [_bash("ls"), _bash("rm -rf build")],
    ),
    "passes-early": (
        "  - {type: command_executed, command_pattern: pytest, stop_early: {on_pass: stop}}\n"
        "  - {type: file_exists, path: out.txt}\n",
        "",
        [_bash("pytest -q")],
    ),
    "undecided": (
        "  - {type: command_executed, command_pattern: deploy, stop_early: {decide_within: 2}}\n",
        "",
        [_bash("ls"), _bash("ls -la"), _bash("deploy")],
    ),
    "too-many-calls": (
        "  - {type: file_exists, path: out.txt}\n",
        "run_limits: {max_tool_calls: 2}\n",
        [_bash("ls"), _bash("ls"), _bash("ls")],
    ),
    "disarmed": (
        f"  - {NO_RM}\n",
        "run_limits: {stop_early: false}\n",
        [_bash("rm -rf build")],
    ),
}


@pytest.mark.django_db(transaction=True)
def test_armed_criteria_and_max_tool_calls_stop_real_agents_at_the_deciding_call(
    tmp_path, celery_worker_process
):
    from runs_app.launching import launch_run
    from runs_app.models import Trial, TrialEvent
    from runs_app.tests.factories import import_folder_tasks, make_experiment, make_task
    from runs_app.tests.workers import wait_for_run

    for slug, (criteria, limits, lines) in CASES.items():
        then = "sleep 1; echo late > out.txt" if slug == "disarmed" else "sleep 8; echo late > out.txt"
        # "undecided" prints its calls at once: the call after the deciding one reaches the
        # watcher before the stop does, and must not turn the verdict
        agent = json.dumps(_agent(lines, then, "" if slug == "undecided" else "; sleep 0.2"))
        make_task(
            tmp_path,
            slug,
            f"task_id: {slug}\ninitial_prompt: go\n{limits}"
            f"agent: {{type: command, command: {agent}}}\nsuccess_criteria:\n{criteria}",
        )
    import_folder_tasks(tmp_path)
    experiment = make_experiment(
        tmp_path, "experiment_id: early\nmax_parallel: 5\nvariants:\n  - variant_id: v\n"
    )

    run = wait_for_run(launch_run(experiment), timeout=90, worker=celery_worker_process)

    trials = {
        t.task_version.task.slug: t
        for t in Trial.objects.filter(run=run).select_related("task_version__task")
    }
    got = {
        slug: (t.status, t.stopped_early, t.budget_exceeded, t.agent_seconds < 5)
        for slug, t in trials.items()
    }
    assert got == {
        "forbidden": ("failed", "criterion_failed", "", True),
        # the armed criterion passed: out.txt (unarmed) is graded and shown, but does not gate
        "passes-early": ("passed", "criterion_passed", "", True),
        "undecided": ("failed", "decision_budget_exceeded", "", True),
        "too-many-calls": ("failed", "", "max_tool_calls", True),
        "disarmed": ("failed", "", "", True),
    }, {slug: (t.error_message, t.agent_stderr[-300:]) for slug, t in trials.items()}
    assert trials["disarmed"].agent_seconds > 1  # ran to its end
    note = TrialEvent.objects.filter(trial=trials["forbidden"], kind="system", data__early_stop__isnull=False)
    assert note.get().data["tool_call_index"] == 2
    criteria = {c.index: c.passed for c in trials["passes-early"].criterion_results.all()}
    assert criteria == {0: True, 1: False}
