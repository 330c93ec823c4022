"""The runner end to end: real `celery worker` processes over the real broker."""

import json
import os
import shutil
import signal
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
from django.conf import settings
from django.db.models import Count

from conftest import WorkerProcess, purge_broker, wait_for
from experiments_app.definitions import import_experiment
from experiments_app.models import Task
from runs_app import control
from runs_app.launching import LaunchOptions, launch_run
from runs_app.models import CriterionResult, Trial, TrialEvent
from runs_app.tests.factories import (
    EXAMPLES,
    assert_tallies_match,
    import_examples,
    import_folder_tasks,
    make_experiment,
    make_task,
)
from runs_app.tests.workers import SMALL_TASK, small_suite, wait_for_run, worker_log

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_demo_experiment_passes_every_oracle_trial_and_fails_every_none_trial(tmp_path):
    import_examples()
    demo = import_experiment(EXAMPLES / "experiments" / "demo.yaml", root=EXAMPLES).experiment
    # The claude arm must fail clearly for want of a key, whatever this machine has.
    worker = WorkerProcess(tmp_path, extra_env={"ANTHROPIC_API_KEY": ""}).start()
    try:
        run = wait_for_run(launch_run(demo, options=LaunchOptions(repeats=1)), timeout=300, worker=worker)
    finally:
        worker.kill()

    outcomes = Counter(Trial.objects.filter(run=run).values_list("variant__slug", "status"))
    every_task = set(Task.objects.values_list("slug", flat=True))
    for variant, expected in (("reference", "passed"), ("no-op", "failed")):
        trials = Trial.objects.filter(run=run, variant__slug=variant)
        assert set(trials.values_list("status", flat=True)) == {expected}, outcomes
        assert set(trials.values_list("task_version__task__slug", flat=True)) == every_task
    scripted = Counter(
        Trial.objects.filter(run=run, variant__slug="scripted").values_list("status", flat=True)
    )
    assert scripted["passed"] > 0 and scripted["failed"] > 0 and not scripted["error"]
    claude = Trial.objects.filter(run=run, variant__slug="claude")
    assert set(claude.values_list("status", flat=True)) == {"error"}
    assert "ANTHROPIC_API_KEY" in claude.first().error_message
    assert run.status == "finished" and run.n_trials == run.n_passed + run.n_failed + run.n_error
    passed = Trial.objects.filter(run=run, status="passed").first()
    assert passed.criterion_results.count() == len(passed.config["success_criteria"])
    assert TrialEvent.objects.filter(trial=passed, kind="phase").count() >= 4
    assert passed.setup_seconds is not None and passed.grading_seconds is not None


def test_a_killed_worker_loses_no_trial_and_finishes_each_exactly_once(tmp_path):
    experiment = small_suite(tmp_path, 3, "sleep 1.5 && echo done > out.txt", parallel=4, repeats=4)
    fast_recovery = {
        "TRIAL_LEASE_SECONDS": "3",
        "REAPER_INTERVAL_SECONDS": "1",
        "REDISPATCH_AFTER_SECONDS": "3",
    }
    first = WorkerProcess(tmp_path, extra_env=fast_recovery, beat=True).start()
    run = launch_run(experiment)
    wait_for(
        lambda: Trial.objects.filter(run=run, status="running").count() >= 2,
        timeout=60,
        message=lambda: f"trials to start; log:\n{first.log()[-3000:]}",
    )
    first.kill(signal.SIGKILL)
    second = WorkerProcess(tmp_path, extra_env=fast_recovery, beat=True).start()
    try:
        wait_for_run(run, timeout=120, worker=second)
    finally:
        second.kill()

    trials = Trial.objects.filter(run=run)
    assert trials.count() == 12
    assert set(trials.values_list("status", flat=True)) == {"passed"}
    assert trials.filter(attempt__gt=1).exists()  # the killed worker's trials ran again
    finished_phases = (
        TrialEvent.objects.filter(trial__run=run, kind="phase", data__phase="finished")
        .values("trial")
        .annotate(n=Count("pk"))
    )
    assert sorted(row["n"] for row in finished_phases) == [1] * 12
    per_trial = CriterionResult.objects.filter(trial__run=run).values("trial").annotate(n=Count("pk"))
    assert [row["n"] for row in per_trial] == [1] * 12
    assert_tallies_match(run)


def _python_children(pid: int) -> list[int]:
    """Python processes whose parent is `pid` (a prefork pool's children)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"python" in cmdline.split(b"\0")[0]:
            found.append(int(name))
    return found


def test_one_process_runs_a_trial_per_slot_and_a_kill_mid_run_loses_and_repeats_none(tmp_path):
    experiment = small_suite(tmp_path, 4, "sleep 2 && echo done > out.txt", parallel=16, repeats=4)
    slots = {"WORKER_SLOTS": "16", "TRIAL_LEASE_SECONDS": "3", "REAPER_INTERVAL_SECONDS": "1",
             "REDISPATCH_AFTER_SECONDS": "3"}  # fmt: skip
    first = WorkerProcess(tmp_path, concurrency=16, extra_env=slots).start()
    run = launch_run(experiment)
    wait_for(
        lambda: Trial.objects.filter(run=run, status="running").count() >= 12,
        timeout=60,
        message=lambda: f"12 trials in flight at once; log:\n{first.log()[-3000:]}",
    )
    assert _python_children(first.proc.pid) == []  # threads of one process, not a process each
    first.kill(signal.SIGKILL)
    second = WorkerProcess(tmp_path, concurrency=16, extra_env=slots, beat=True).start()
    try:
        wait_for_run(run, timeout=120, worker=second)
    finally:
        second.kill()

    trials = Trial.objects.filter(run=run)
    assert trials.count() == 16 and set(trials.values_list("status", flat=True)) == {"passed"}
    assert trials.filter(attempt__gt=1).exists()
    finished = (
        TrialEvent.objects.filter(trial__run=run, kind="phase", data__phase="finished")
        .values("trial")
        .annotate(n=Count("pk"))
    )
    assert sorted(row["n"] for row in finished) == [1] * 16
    run.refresh_from_db()
    assert (run.n_passed, run.n_running, run.n_queued) == (16, 0, 0)
    assert_tallies_match(run)


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(pid))
    return found


def test_cancel_kills_running_agents_within_two_seconds(tmp_path, celery_worker_process):
    marker = "31.337"
    experiment = small_suite(tmp_path, 6, f"sleep {marker}")
    run = launch_run(experiment)
    wait_for(
        lambda: len(_processes_with(marker)) >= 2, timeout=60, message=lambda: celery_worker_process.log()
    )

    cancelled_at = time.monotonic()
    control.cancel_run(run, control.COMMAND_LINE)
    wait_for_run(run, timeout=10, worker=celery_worker_process)
    elapsed = time.monotonic() - cancelled_at

    assert run.status == "cancelled"
    assert set(Trial.objects.filter(run=run).values_list("status", flat=True)) == {"cancelled"}
    assert elapsed < 3.5  # killed within 2 s, plus the worker's half-second poll and bookkeeping
    assert _processes_with(marker) == []


def test_retry_runs_only_errored_trials_again_and_keeps_old_attempts(tmp_path, celery_worker_process):
    make_task(tmp_path, "t0", SMALL_TASK.format(slug="t0"))
    import_folder_tasks(tmp_path)
    experiment = make_experiment(
        tmp_path,
        """
        experiment_id: flaky
        variants:
          - variant_id: broken
            agent: {type: command, command: "exit 127"}
          - variant_id: idle
            agent: {type: none}
        """,
    )
    run = wait_for_run(launch_run(experiment), timeout=60, worker=celery_worker_process)
    assert Counter(Trial.objects.filter(run=run).values_list("status", flat=True)) == {
        "error": 1,
        "failed": 1,
    }
    failed_before = Trial.objects.get(run=run, status="failed")

    assert control.retry_errors(run, control.COMMAND_LINE) == 1
    wait_for_run(run, timeout=60, worker=celery_worker_process)

    broken = Trial.objects.filter(run=run, variant__slug="broken").order_by("attempt")
    assert [(t.attempt, t.is_latest, t.status) for t in broken] == [(1, False, "error"), (2, True, "error")]
    assert broken[1].previous_attempt_id == broken[0].pk
    failed_after = Trial.objects.get(run=run, variant__slug="idle")
    assert (failed_after.pk, failed_after.finished_at) == (failed_before.pk, failed_before.finished_at)
    run.refresh_from_db()
    assert run.n_trials == 2 and run.n_error == 1 and run.n_failed == 1
    assert_tallies_match(run)


def test_a_token_budget_stops_the_agent_mid_stream(tmp_path, celery_worker_process):
    usage = '{"type": "usage", "input_tokens": 100, "output_tokens": 100}'
    command = f"for i in $(seq 50); do echo '{usage}'; sleep 0.1; done; echo done > out.txt"
    experiment = small_suite(tmp_path, 1, command)
    options = LaunchOptions(overrides=["run_limits.max_total_tokens=500"])

    run = wait_for_run(launch_run(experiment, options=options), timeout=60, worker=celery_worker_process)

    trial = Trial.objects.get(run=run)
    assert trial.budget_exceeded == "max_total_tokens"
    assert trial.status == "failed"  # stopped before it wrote out.txt, then graded
    assert trial.agent_seconds < 3  # not the 5 s the script would take
    assert 500 < trial.input_tokens + trial.output_tokens <= 1000


def test_hostile_agents_end_bounded_and_recorded(tmp_path, celery_worker_process):
    for slug, command in {
        "flood": "head -c 1000000000 /dev/zero; echo done > out.txt",
        "home": 'echo secret > "$HOME/note.txt" && test -f "$HOME/note.txt" && echo done > out.txt',
        "loop": "while :; do :; done",
        # Leave the trial's pids cgroup (the uid is then swept only if it ran outside one), then
        # leave a daemon behind: out.txt only if every way out of the cgroup was refused.
        "escape": "for f in /sys/fs/cgroup/cgroup.procs /sys/fs/cgroup/pids/cgroup.procs; do "
        "(echo $$ > $f) 2>/dev/null && echo escaped > escaped.txt; done; "
        "setsid sleep 307 < /dev/null > /dev/null 2>&1 & test -f escaped.txt || echo done > out.txt",
    }.items():
        make_task(
            tmp_path,
            slug,
            f"task_id: {slug}\ninitial_prompt: go\nsandbox:\n  limits: {{timeout: 4}}\n"
            "success_criteria:\n  - {type: file_exists, path: out.txt}\n"
            f"agent: {{type: command, command: {json.dumps(command)}}}\n",
        )
    import_folder_tasks(tmp_path)
    experiment = make_experiment(tmp_path, "experiment_id: hostile\nvariants:\n  - variant_id: as-written\n")

    run = wait_for_run(launch_run(experiment), timeout=90, worker=celery_worker_process)

    trials = {
        t.task_version.task.slug: t
        for t in Trial.objects.filter(run=run).select_related("task_version__task")
    }
    assert trials["loop"].timed_out and trials["loop"].status == "failed"
    assert trials["flood"].status == "passed", (trials["flood"].error_category, trials["flood"].error_message)
    assert len(trials["flood"].agent_stdout) <= settings.AGENT_OUTPUT_CAP_BYTES
    assert trials["home"].status == "passed"
    assert trials["escape"].status == "passed", trials["escape"].agent_stderr
    assert _processes_with("sleep\x00307") == []  # the daemon died with the trial's cgroup
    assert not Path("/root/note.txt").exists() and not (Path.home() / "note.txt").exists()
    assert _worker_peak_rss_mb(celery_worker_process) < 400


def _worker_peak_rss_mb(worker: WorkerProcess) -> float:
    """The largest VmHWM among the worker's processes (main process and pool children)."""
    peak = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.getpgid(int(pid)) != worker.proc.pid:
                continue
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except (OSError, ProcessLookupError):
            continue
    return peak / 1024


def test_a_redelivered_message_for_a_finished_trial_is_a_no_op(tmp_path):
    experiment = small_suite(tmp_path, 1, "echo done > out.txt")
    purge_broker()
    run = launch_run(experiment)
    trial = Trial.objects.get(run=run)
    Trial.objects.filter(pk=trial.pk).update(status="passed", score=1.0)

    assert control.execute(trial.pk, "late-worker") is None
    trial.refresh_from_db()
    assert (trial.status, trial.score, trial.lease_owner) == ("passed", 1.0, "")
    assert not TrialEvent.objects.filter(trial=trial).exists()


def test_it_keeps_artifacts_and_errors_on_a_failing_pre_run(tmp_path, celery_worker_process):
    import io
    import tarfile

    from django.core.files.storage import default_storage

    make_task(
        tmp_path,
        "setup-fails",
        "task_id: setup-fails\ninitial_prompt: go\npre_run:\n  - {command: 'echo broken >&2; exit 3'}\n"
        "success_criteria:\n  - {type: file_exists, path: out.txt}\n",
    )
    make_task(tmp_path, "keeps", SMALL_TASK.format(slug="keeps"))
    import_folder_tasks(tmp_path)
    experiment = make_experiment(
        tmp_path,
        "experiment_id: art\nvariants:\n  - variant_id: v\n"
        '    agent: {type: command, command: "echo hi > out.txt"}\n',
    )

    run = launch_run(experiment, options=LaunchOptions(keep_artifacts=True))
    wait_for_run(run, timeout=60, worker=celery_worker_process)

    broken = Trial.objects.get(run=run, task_version__task__slug="setup-fails")
    assert (broken.status, broken.error_category) == ("error", "pre_run")
    assert "exited with 3" in broken.error_message and "broken" in broken.error_message
    kept = Trial.objects.get(run=run, task_version__task__slug="keeps")
    assert kept.status == "passed" and kept.artifact
    with (
        default_storage.open(kept.artifact) as handle,
        tarfile.open(fileobj=io.BytesIO(handle.read())) as tar,
    ):
        assert "workspace/out.txt" in tar.getnames()
    assert "+hi" in kept.diff


def test_it_evaluates_dataset_suite_thresholds_when_the_run_ends(tmp_path, celery_worker_process):
    rows = "\n".join(f"    - {{id: r{i}, ok: '{'yes' if i < 3 else 'no'}'}}" for i in range(4))
    make_task(
        tmp_path,
        "suite",
        f"task_id: suite\ninitial_prompt: go\ndataset:\n  rows:\n{rows}\n"
        "success_criteria:\n  - type: run_command\n    command: 'test ${row.ok} = yes'\n"
        "    suite_thresholds: {mean: 0.7}\n",
    )
    import_folder_tasks(tmp_path)
    experiment = make_experiment(
        tmp_path, "experiment_id: suite\nvariants:\n  - variant_id: v\n    agent: {type: none}\n"
    )

    run = wait_for_run(launch_run(experiment), timeout=60, worker=celery_worker_process)

    assert Counter(Trial.objects.filter(run=run).values_list("status", flat=True)) == {
        "passed": 3,
        "failed": 1,
    }
    [suite] = run.suite_results
    assert (suite["task"], suite["variant"], suite["passed"]) == ("suite", "v", True)
    assert suite["criteria"][0]["metrics"]["mean"] == pytest.approx(0.75)


def test_two_runs_share_the_workers(tmp_path, celery_worker_process):
    experiment = small_suite(tmp_path, 1, "sleep 0.3 && echo done > out.txt", parallel=1, repeats=6)

    first = launch_run(experiment)
    second = launch_run(experiment)
    wait_for_run(first, timeout=60, worker=celery_worker_process)
    wait_for_run(second, timeout=60, worker=celery_worker_process)

    def finish_times(run):
        return sorted(Trial.objects.filter(run=run).values_list("finished_at", flat=True))

    # Each run holds one slot (max_parallel 1), so the two worker processes serve both at once:
    # the second run's first trial ends long before the first run's last one.
    assert finish_times(second)[0] < finish_times(first)[-1]
    assert finish_times(first)[0] < finish_times(second)[-1]
    assert first.n_passed == second.n_passed == 6


def test_agents_get_neither_undeclared_secrets_nor_folders_outside_their_bundle(
    tmp_path, celery_worker_process
):
    make_task(tmp_path, "t0", SMALL_TASK.format(slug="t0"))
    import_folder_tasks(tmp_path)
    experiment = make_experiment(
        tmp_path,
        """
        experiment_id: nosy
        variants:
          - variant_id: wants-secret-key
            agent: {type: command, command: "env > out.txt", secrets: [SECRET_KEY]}
          - variant_id: oracle
            agent: {type: oracle}
        """,
    )

    asks = wait_for_run(launch_run(experiment), timeout=60, worker=celery_worker_process)
    # An override is checked against the schema, not the filesystem: the runner must refuse it.
    options = LaunchOptions(overrides=["reference.directory=/etc"])
    escapes = wait_for_run(launch_run(experiment, options=options), timeout=60, worker=celery_worker_process)

    nosy = Trial.objects.get(run=asks, variant__slug="wants-secret-key")
    assert (nosy.status, nosy.error_category) == ("error", "setup")
    assert "SECRET_KEY" in nosy.error_message and "AGENT_SECRET_NAMES" in nosy.error_message
    for trial in Trial.objects.filter(run=escapes):
        assert (trial.status, trial.error_category) == ("error", "setup")
        assert "leaves the task's bundle" in trial.error_message
        assert "passwd" not in trial.diff


def test_mock_path_dirs_put_a_tasks_mocks_first_on_the_agents_path(tmp_path, celery_worker_process):
    make_task(
        tmp_path,
        "mocked",
        "task_id: mocked\ninitial_prompt: go\nsandbox:\n  mock_path_dirs: [mocks, missing]\n"
        "  template_sources:\n    - type: starter_files\n      files:\n"
        '        - {path: mocks/uip, content: "#!/bin/sh\\necho mocked-uip $1\\n"}\n'
        "success_criteria:\n  - {type: file_contains, path: out.txt, includes: [mocked-uip deploy]}\n",
    )
    import_folder_tasks(tmp_path)
    experiment = make_experiment(
        tmp_path,
        "experiment_id: mocks\nvariants:\n  - variant_id: v\n"
        '    agent: {type: command, command: "uip deploy > out.txt"}\n',
    )

    run = wait_for_run(launch_run(experiment), timeout=60, worker=celery_worker_process)

    trial = Trial.objects.get(run=run)
    assert trial.status == "passed", (trial.error_message, trial.agent_stderr)


def test_commands_get_coder_evals_per_sandbox_venv_unless_python_is_null(tmp_path, celery_worker_process):
    check = (
        "success_criteria:\n  - type: run_command\n"
        '    command: \'python -c "import sys; assert sys.prefix.endswith(\\".venv\\"), sys.prefix"\'\n'
    )
    make_task(tmp_path, "with-venv", "task_id: with-venv\ninitial_prompt: go\n" + check)
    make_task(
        tmp_path,
        "without-venv",
        "task_id: without-venv\ninitial_prompt: go\nsandbox: {python: null}\n"
        "success_criteria:\n  - {type: run_command, command: 'test ! -e .venv'}\n",
    )
    import_folder_tasks(tmp_path)
    experiment = make_experiment(
        tmp_path,
        'experiment_id: venvs\nvariants:\n  - variant_id: v\n    agent: {type: command, command: "true"}\n',
    )

    run = wait_for_run(launch_run(experiment), timeout=60, worker=celery_worker_process)

    for trial in Trial.objects.filter(run=run):
        assert trial.status == "passed", (trial.task_version.task.slug, trial.error_message)


def test_env_packages_are_installed_once_per_host_and_mounted_read_only(tmp_path, celery_worker_process):
    # The agent tries to overwrite both packages (it reaches .venv and node_modules in its
    # workspace); the criteria pass only if the packages still work unchanged.
    tamper = (
        ".venv/bin/python -c \"import tomli_w, pathlib; pathlib.Path(tomli_w.__file__).write_text('x')\"; "
        "echo 'module.exports = 1' > node_modules/is-number/index.js; "
        "rm -rf node_modules/is-number; true"
    )
    for slug in ("packages-a", "packages-b"):
        make_task(
            tmp_path,
            slug,
            f"task_id: {slug}\ninitial_prompt: go\n"
            "sandbox:\n  python: {env_packages: [tomli-w==1.0.0]}\n"
            "  node: {env_packages: [is-number@7.0.0]}\n"
            "pre_run:\n  - command: .venv/bin/python -c 'import tomli_w'\n"
            "success_criteria:\n"
            "  - type: run_command\n"
            '    command: python -c "import tomli_w; assert tomli_w.dumps({}) == str()"\n'
            "  - type: run_command\n"
            "    command: node -e \"if (require('is-number')(5) !== true) process.exit(1)\"\n",
        )
    import_folder_tasks(tmp_path)
    experiment = make_experiment(
        tmp_path,
        "experiment_id: packages\nvariants:\n  - variant_id: v\n"
        f"    agent: {{type: command, command: {json.dumps(tamper)}}}\n",
    )

    run = wait_for_run(launch_run(experiment), timeout=240, worker=celery_worker_process)

    for trial in Trial.objects.filter(run=run):
        assert trial.status == "passed", (trial.error_message, trial.agent_stderr[-500:])
    # Both tasks used one environment of each kind: the host's for this requirement set.
    envs = Path(settings.SANDBOX_ROOT) / "envs"
    python = [
        p for p in envs.glob("python-*") if list(p.glob("lib/python3*/site-packages/tomli_w-1.0.0.dist-info"))
    ]
    node = [p for p in envs.glob("node-*") if (p / "node_modules/is-number/package.json").is_file()]
    assert (len(python), len(node)) == (1, 1)


def test_a_run_whose_trials_all_hit_one_setup_error_stops_and_says_why(tmp_path):
    # codex without OPENAI_API_KEY: every trial errors in setup with the same message
    small_suite(tmp_path, 1, "true")
    experiment = make_experiment(
        tmp_path,
        "experiment_id: keyless\nmax_parallel: 1\ndefaults: {repeats: 12}\nvariants:\n"
        "  - variant_id: codex\n    agent: {type: codex, model: gpt-5.5}\n",
    )
    worker = WorkerProcess(tmp_path, extra_env={"OPENAI_API_KEY": ""}).start()
    try:
        run = wait_for_run(launch_run(experiment), timeout=60, worker=worker)
    finally:
        worker.kill()

    counts = Counter(Trial.objects.filter(run=run).values_list("status", flat=True))
    assert run.status == "cancelled" and counts["error"] >= settings.FAIL_FAST_AFTER, counts
    assert counts["cancelled"] >= 12 - settings.FAIL_FAST_AFTER - 1  # the rest never ran
    assert "ended in the same error before any trial was graded" in run.stop_reason
    assert "OPENAI_API_KEY" in run.stop_reason


def test_trials_get_their_folders_under_trial_root_when_it_is_set(tmp_path):
    # A tmpfs where the host has one (what TRIAL_ROOT is for); the host's runtimes and
    # environments stay under SANDBOX_ROOT.
    parent = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path("/var/tmp")
    trial_root = Path(tempfile.mkdtemp(prefix="evalsite-test-trials-", dir=parent))
    os.chmod(trial_root, 0o711)
    experiment = small_suite(tmp_path, 2, "pwd; echo done > out.txt", parallel=2)
    worker = WorkerProcess(tmp_path, extra_env={"TRIAL_ROOT": str(trial_root)}).start()
    try:
        run = wait_for_run(launch_run(experiment), timeout=60, worker=worker)
        for trial in Trial.objects.filter(run=run):
            assert trial.status == "passed", (trial.error_message, trial.agent_stderr)
            assert trial.agent_stdout.startswith(f"{trial_root}/trial-{trial.pk}-a1-"), trial.agent_stdout
            assert not list(Path(settings.TRIAL_ROOT).glob(f"trial-{trial.pk}-*"))
        assert not list(trial_root.iterdir())  # each trial's folder went with it
    finally:
        worker.kill()
        shutil.rmtree(trial_root, ignore_errors=True)


def test_a_long_setup_shows_on_the_trial_page_while_it_runs(tmp_path, celery_worker_process):
    # A quick setup is written with what follows it; a slow one while its commands run.
    make_task(
        tmp_path,
        "slow-setup",
        "task_id: slow-setup\ninitial_prompt: go\n"
        "pre_run:\n  - {command: 'sleep 4', timeout: 30}\n"
        "success_criteria:\n  - {type: file_exists, path: out.txt}\n",
    )
    import_folder_tasks(tmp_path)
    experiment = make_experiment(
        tmp_path,
        "experiment_id: slow-setup\nvariants:\n  - variant_id: v\n"
        '    agent: {type: command, command: "echo done > out.txt"}\n',
    )
    run = launch_run(experiment)

    setup = wait_for(
        lambda: TrialEvent.objects.filter(trial__run=run, kind="phase", data__phase="setup").first(),
        timeout=60,
        message=lambda: f"the setup event; log:\n{worker_log(celery_worker_process)}",
    )
    # Written during the 4 s pre_run: the agent's phase, written at once, is not there yet.
    assert not TrialEvent.objects.filter(trial__run=run, kind="phase", data__phase="agent").exists()
    assert Trial.objects.get(run=run).status == "running"
    assert setup.data["worker"] and setup.data["attempt"] == 1
    wait_for_run(run, timeout=60, worker=celery_worker_process)
    trial = Trial.objects.get(run=run)
    assert trial.status == "passed", trial.error_message
    phases = list(TrialEvent.objects.filter(trial=trial, kind="phase").values_list("data__phase", flat=True))
    assert phases[:2] == ["setup", "pre_run"] and phases[-1] == "finished"
