"""Trial lifecycle hooks through a real worker: `hooks.trial.before` prepares the sandbox the
agent runs in, `hooks.trial.after` always runs, and a failing hook makes the trial an error that
names every failure, never a fail."""

import json
import signal
from pathlib import Path

import pytest
from django.conf import settings

from conftest import WorkerProcess, wait_for
from experiments_app.specs.loading import load_tasks
from runs_app.launching import launch_run
from runs_app.models import Run, Trial, TrialEvent
from runs_app.tests.factories import import_folder_tasks, make_experiment, make_task
from runs_app.tests.workers import SLOW_AGENT, wait_for_run

TASK = """
task_id: {slug}
initial_prompt: "Write out.txt once the fixture is ready"
hooks:
  trial:
    before: {before}
    after: {after}
success_criteria:
  - type: file_exists
    path: out.txt
"""
# The agent does its work only where the before hook made its fixture.
AGENT = "if test -f .fixture; then echo done > out.txt; fi"


@pytest.mark.django_db(transaction=True)
def test_hooks_run_around_each_trial_and_a_failing_one_is_an_error_with_every_message(tmp_path):
    cases = {
        "ready": ("[{command: 'echo up > .fixture'}]", "[{command: 'rm .fixture'}]"),
        "broken-fixture": (
            "[{command: 'echo no service >&2; exit 4'}, {command: 'touch never'}]",
            "[{command: 'echo cleanup failed >&2; exit 5'}]",
        ),
        "broken-cleanup": (
            "[{command: 'echo up > .fixture'}]",
            "[{command: 'echo still locked; exit 6'}, {command: 'true'}]",
        ),
        "silent-cleanup": ("[{command: 'echo up > .fixture'}]", "[{command: 'exit 7'}]"),
    }
    for slug, (before, after) in cases.items():
        make_task(tmp_path, slug, TASK.format(slug=slug, before=before, after=after))
    import_folder_tasks(tmp_path)
    experiment = make_experiment(
        tmp_path, SLOW_AGENT.format(parallel=4, repeats=1, command=json.dumps(AGENT))
    )
    worker = WorkerProcess(tmp_path).start()
    run = wait_for_run(launch_run(experiment), timeout=90, worker=worker)
    trials = {
        t.task_version.task.slug: t
        for t in Trial.objects.filter(run=run).select_related("task_version__task")
    }

    def steps(trial):
        events = TrialEvent.objects.filter(trial=trial, kind="output").order_by("seq")
        return [(e.data["step"], e.data["exit_code"]) for e in events if e.data["step"].startswith("hooks.")]

    def phases(trial):
        return list(
            TrialEvent.objects.filter(trial=trial, kind="phase").values_list("data__phase", flat=True)
        )

    ready = trials["ready"]
    assert ready.status == "passed", ready.error_message
    assert steps(ready) == [("hooks.trial.before[0]", 0), ("hooks.trial.after[0]", 0)]

    broken = trials["broken-fixture"]
    assert (broken.status, broken.error_category) == ("error", "hook")
    assert (
        "hooks.trial.before[0] `echo no service >&2; exit 4` exited with 4: no service"
        in broken.error_message
    )
    assert "then hooks.trial.after[0] `echo cleanup failed >&2; exit 5` exited with 5: cleanup failed" in (
        broken.error_message
    )
    assert "agent" not in phases(broken)  # the agent never ran on the broken fixture
    assert steps(broken) == [("hooks.trial.before[0]", 4), ("hooks.trial.after[0]", 5)]

    cleanup = trials["broken-cleanup"]
    assert (cleanup.status, cleanup.error_category) == ("error", "hook")  # it passed its criteria
    # The hook's own output (stdout here) ends the message, so it reads without the transcript.
    assert cleanup.error_message == (
        "hooks.trial.after[0] `echo still locked; exit 6` exited with 6: still locked"
    )
    silent = trials["silent-cleanup"]
    assert silent.error_message == "hooks.trial.after[0] `exit 7` exited with 7 (no output)"
    assert steps(cleanup)[-2:] == [("hooks.trial.after[0]", 6), ("hooks.trial.after[1]", 0)]  # all ran


def test_suite_hooks_in_a_task_are_refused_at_their_line_with_what_to_do(tmp_path):
    path = tmp_path / "task.yaml"
    line = "  suite: {setup: [{command: x}]}"
    text = TASK.format(slug="t", before="[]", after="[]").replace("  trial:", f"{line}\n  trial:")
    path.write_text(text)
    (error,) = load_tasks([path]).errors
    assert error.line == text.splitlines().index(line) + 1
    assert "hooks.suite runs once per run" in str(error) and "experiment's defaults" in str(error)


# A fixture service for the whole run: it answers on a unix socket in the suite's folder, counts
# whom it served, and says so when teardown stops it.
SERVICE = """
import os, socket
path = os.path.join(os.environ["EVALSITE_SUITE_DIR"], "service.sock")
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
os.chmod(path, 0o666)  # the trials' sandboxes run as other users
server.listen(16)
served = 0
while True:
    conn, _ = server.accept()
    request = conn.recv(100)
    if request == b"stop":
        conn.sendall(f"stopped after serving {served}".encode())
        break
    served += 1
    conn.sendall(b"fixture-from-the-suite")
    conn.close()
"""
CLIENT = """
import os, socket, sys
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.connect(os.path.join(os.environ["EVALSITE_SUITE_DIR"], "service.sock"))
conn.sendall(sys.argv[1].encode())
print(conn.recv(100).decode())
"""
SUITE_EXPERIMENT = """
experiment_id: suite
max_parallel: 2
defaults:
  repeats: 3
  hooks:
    suite:
      files: [service.py, client.py]
      setup:
        - command: >-
            mkdir data && echo data-from-the-setup > data/fixture.txt &&
            python3 service.py > service.log 2>&1 &
            for i in $(seq 100); do [ -S service.sock ] && exit 0; sleep 0.1; done; exit 1
      teardown:
        - command: "python3 client.py stop"
variants:
  - variant_id: uses-the-service
    agent:
      type: command
      command: {agent}
"""
# Each trial asks the shared service, and tries to write into the suite's folder (read-only).
# What setup wrote is readable without a chmod (the worker's umask is 077).
SUITE_AGENT = (
    'python3 "$EVALSITE_SUITE_DIR/client.py" hello > out.txt; '
    'cat "$EVALSITE_SUITE_DIR/data/fixture.txt" >> out.txt; '
    'if touch "$EVALSITE_SUITE_DIR/written-by-a-trial" 2>/dev/null; then echo escaped >> out.txt; fi'
)
SUITE_TASK = """
task_id: ask-the-fixture
initial_prompt: "Ask the fixture service"
success_criteria:
  - type: file_contains
    path: out.txt
    includes: [fixture-from-the-suite, data-from-the-setup]
    excludes: [escaped]
"""


def suite_run(tmp_path, setup_failure: str = ""):
    make_task(tmp_path, "ask-the-fixture", SUITE_TASK)
    import_folder_tasks(tmp_path)
    (tmp_path / "experiments").mkdir(exist_ok=True)
    (tmp_path / "experiments" / "service.py").write_text(SERVICE)
    (tmp_path / "experiments" / "client.py").write_text(CLIENT)
    text = SUITE_EXPERIMENT.format(agent=json.dumps(SUITE_AGENT))
    if setup_failure:
        start = text.index("        - command: >-")
        text = text[:start] + f"        - command: {setup_failure}\n" + text[text.index("      teardown:") :]
    experiment = make_experiment(tmp_path, text)
    worker = WorkerProcess(tmp_path).start()
    run = launch_run(experiment)
    assert run.suite_status == "pending"
    wait_for_run(run, timeout=120, worker=worker)

    def torn_down():
        run.refresh_from_db()
        return run.suite_status in ("torn_down", "failed") and run.suite_lease_expires_at is None

    wait_for(torn_down, timeout=30, message=lambda: f"teardown; {run.suite_status}\n{worker.log()[-3000:]}")
    return run


@pytest.mark.django_db(transaction=True)
def test_a_suite_service_is_set_up_once_serves_every_trial_read_only_and_teardown_stops_it(
    tmp_path, admin_client
):
    run = suite_run(tmp_path)

    trials = list(Trial.objects.filter(run=run))
    assert [t.status for t in trials] == ["passed"] * 3, [
        (t.agent_stderr, list(t.criterion_results.values_list("details", flat=True)), run.suite_log)
        for t in trials
    ]
    assert {t.host for t in trials} == {run.suite_host}
    assert run.suite_status == "torn_down" and run.suite_error == "" and run.suite_attempt == 1
    steps = [(entry["step"], entry["exit_code"]) for entry in run.suite_log]
    assert steps == [("hooks.suite.setup[0]", 0), ("hooks.suite.teardown[0]", 0)]
    # The one service served every trial, and teardown stopped it.
    assert run.suite_log[1]["output"].strip() == "stopped after serving 3"
    assert not list(Path(settings.TRIAL_ROOT).glob(f"suite-{run.pk}-*"))
    page = admin_client.get(f"/runs/{run.pk}/").content.decode()
    assert "Suite hooks" in page and "torn down" in page and "stopped after serving 3" in page


@pytest.mark.django_db(transaction=True)
def test_a_failed_suite_setup_makes_every_trial_an_error_and_its_teardown_still_runs(tmp_path):
    run = suite_run(tmp_path, setup_failure='"echo no fixture >&2; exit 3"')

    trials = list(Trial.objects.filter(run=run))
    assert {(t.status, t.error_category) for t in trials} == {("error", "hook")}
    assert "hooks.suite.setup failed: hooks.suite.setup[0] `echo no fixture >&2; exit 3` exited with 3" in (
        trials[0].error_message
    )
    assert all(t.started_at is None for t in trials)  # no agent ran on a missing fixture
    assert run.status == "finished" and run.suite_status == "failed"
    # Teardown ran (the service never started, so the client fails): both are reported, in order.
    assert [entry["step"] for entry in run.suite_log] == ["hooks.suite.setup[0]", "hooks.suite.teardown[0]"]
    assert run.suite_error.startswith("hooks.suite.setup[0] `echo no fixture >&2; exit 3` exited with 3")
    assert "; then hooks.suite.teardown[0] `python3 client.py stop` exited with 1" in run.suite_error


@pytest.mark.django_db(transaction=True)
def test_a_suite_whose_host_dies_is_set_up_again_on_another_and_the_run_finishes(tmp_path):
    make_task(tmp_path, "ask-the-fixture", SUITE_TASK)
    import_folder_tasks(tmp_path)
    (tmp_path / "experiments").mkdir(exist_ok=True)
    (tmp_path / "experiments" / "service.py").write_text(SERVICE)
    (tmp_path / "experiments" / "client.py").write_text(CLIENT)
    slow = "sleep 1; " + SUITE_AGENT  # trials still running when the first host dies
    experiment = make_experiment(tmp_path, SUITE_EXPERIMENT.format(agent=json.dumps(slow)))
    fast = {"TRIAL_LEASE_SECONDS": "3", "REAPER_INTERVAL_SECONDS": "1", "REDISPATCH_AFTER_SECONDS": "3"}
    first = WorkerProcess(tmp_path, extra_env={**fast, "EVALSITE_HOST": "host-a"}, beat=True).start()
    run = launch_run(experiment)
    wait_for(
        lambda: Trial.objects.filter(run=run, status="running").exists(),
        timeout=60,
        message=lambda: f"a trial to start; log:\n{first.log()[-3000:]}",
    )
    first.kill(signal.SIGKILL)
    second = WorkerProcess(tmp_path, extra_env={**fast, "EVALSITE_HOST": "host-b"}, beat=True).start()
    try:
        wait_for_run(run, timeout=120, worker=second)
        wait_for(lambda: Run.objects.get(pk=run.pk).suite_status == "torn_down", timeout=30)
    finally:
        second.kill()

    run.refresh_from_db()
    trials = Trial.objects.filter(run=run, is_latest=True)
    assert set(trials.values_list("status", flat=True)) == {"passed"}
    assert run.suite_attempt == 2 and run.suite_host == "host-b"
    assert Trial.objects.filter(run=run, host="host-b").exists()
    # The suite set up twice (once per host), torn down once: where it last lived.
    steps = [entry["step"] for entry in run.suite_log]
    assert steps == ["hooks.suite.setup[0]", "hooks.suite.setup[0]", "hooks.suite.teardown[0]"]
