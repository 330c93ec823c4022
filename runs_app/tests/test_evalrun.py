"""`manage.py evalrun` as a user runs it: a subprocess against a real worker and the test database."""

import json
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema
from django.conf import settings

from conftest import BASE_DIR, WorkerProcess, wait_for, worker_environment
from experiments_app.models import Task
from runs_app.models import Run, Trial

pytestmark = pytest.mark.django_db(transaction=True)

SMOKE_TASKS = [str(settings.BASE_DIR / "examples" / "tasks" / slug) for slug in ("fix-mean", "slugify")]
JUNIT_XSD = Path(__file__).parent / "fixtures" / "junit" / "junit.xsd"
TIMEOUT = 90

GATED_SMOKE = """
experiment_id: gated-smoke
baseline: reference
variants:
  - variant_id: reference
    agent: {type: oracle}
  - variant_id: no-op
    agent: {type: none}
gates:
  - {type: min_pass_rate, variant: reference, value: 1.0, use: estimate}
  - {type: min_pass_rate, value: 0.5, name: every variant solves half}
"""

SLOW_TASK = """
task_id: slow-{i}
initial_prompt: "Write out.txt"
sandbox:
  python: null
  template_sources:
    - type: starter_files
      files:
        - {{path: README.md, content: "task {i}"}}
success_criteria:
  - type: file_exists
    path: out.txt
"""

SLOW_EXPERIMENT = """
experiment_id: slow-suite
variants:
  - variant_id: sleeper
    agent:
      type: command
      command: ["python3", "-c", "import time; time.sleep(1.2); open('out.txt', 'w').write('done')"]
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def slow_suite(folder: Path, tasks: int) -> tuple[Path, Path]:
    for i in range(tasks):
        write(folder / "tasks" / f"slow-{i}" / "task.yaml", SLOW_TASK.format(i=i))
    return folder / "tasks", write(folder / "experiment.yaml", SLOW_EXPERIMENT)


def command(*args: str) -> list[str]:
    return [sys.executable, "manage.py", "evalrun", *map(str, args)]


def evalrun(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(*args),
        cwd=BASE_DIR,
        env=worker_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def start_evalrun():
    """Starts evalrun subprocesses that read their output as it comes. Each is killed after
    TIMEOUT (so a loop reading its output cannot hang) and at teardown at the latest."""
    started: list[tuple[subprocess.Popen, threading.Timer]] = []

    def start(*args: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            command(*args), cwd=BASE_DIR, env=worker_environment(), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        timer = threading.Timer(TIMEOUT, proc.kill)
        timer.start()
        started.append((proc, timer))
        return proc

    yield start
    for proc, timer in started:
        timer.cancel()
        proc.kill()
        proc.wait(timeout=10)


def test_it_exits_0_streams_events_live_and_writes_reports(celery_worker_process, start_evalrun, tmp_path):
    junit, folder = tmp_path / "junit.xml", tmp_path / "report"
    # No TASK_FILES: the example suite, narrowed to its three smoke tasks by tag.
    # Each trial waits a second in pre_run, so the run lasts long enough to see events live.
    proc = start_evalrun(
        "-T", "oracle", "-t", "smoke", "-s", "minimal", "--junit-xml", junit, "--report", folder,
        "-D", "pre_run=[{command: sleep 1}]",
    )  # fmt: skip
    lines, first_phase_at = [], None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if first_phase_at is None and "] phase " in line:
            first_phase_at = time.time()
    output = "\n".join(lines)

    assert proc.wait(timeout=10) == 0, output + celery_worker_process.log()[-3000:]
    finished = [i for i, line in enumerate(lines) if "phase finished status=passed" in line]
    assert len(finished) == 3
    assert re.search(r"^\[oracle fix-mean#0\] phase setup", output, re.M)
    summary = lines.index(next(line for line in lines if line.startswith("Run ")))
    assert max(finished) < summary
    run = Run.objects.get()
    assert (run.status, run.n_passed, run.gates_passed) == (Run.Status.FINISHED, 3, None)
    # Events are printed while the run goes on, not replayed once it has ended.
    assert first_phase_at < run.finished_at.timestamp(), output
    assert f"run {run.pk}: {settings.SITE_URL}/runs/{run.pk}/" in output
    suites = ET.parse(junit).getroot().findall("testsuite")
    assert [(s.get("name"), s.get("tests"), s.get("failures")) for s in suites] == [("oracle", "3", "0")]
    assert json.loads((folder / "report.json").read_text())["run"]["counts"]["passed"] == 3
    assert "| oracle (baseline) | 3 | 0 | 0 |" in (folder / "report.md").read_text()


def test_it_exits_1_when_a_variant_fails_with_the_gates_in_junit(celery_worker_process, tmp_path):
    experiment = write(tmp_path / "gated.yaml", GATED_SMOKE)
    junit = tmp_path / "out" / "junit.xml"

    result = evalrun(*SMOKE_TASKS, "-e", experiment, "--junit-xml", junit, "-s", "full")

    assert result.returncode == 1, result.stdout + result.stderr
    assert "gate FAIL" in result.stdout and "every variant solves half" in result.stdout
    assert "[no-op slugify#0] phase finished status=failed" in result.stdout
    # What a team could have stopped on: two tasks decide nothing.
    assert "Anytime-valid intervals (valid however early the run stopped):" in result.stdout
    assert "no-op: pass rate in [0.0%, " in result.stdout
    assert "Δ vs reference in [-100.0, " in result.stdout and "undecided: keep it running" in result.stdout
    xmlschema.XMLSchema(JUNIT_XSD).validate(junit)
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites"
    suites = {suite.get("name"): suite for suite in root.findall("testsuite")}
    assert list(suites) == ["reference", "no-op", "suite-gates"]
    for variant in ("reference", "no-op"):
        cases = suites[variant].findall("testcase")
        assert [case.get("classname") for case in cases] == [variant, variant]
        assert [case.get("name") for case in cases] == ["fix-mean#0", "slugify#0"]
        assert all(float(case.get("time")) > 0 for case in cases)
    assert len(suites["no-op"].findall("testcase/failure")) == 2
    assert suites["reference"].findall("testcase/failure") == []
    gates = suites["suite-gates"].findall("testcase")
    assert [(g.get("name"), g.find("failure") is not None) for g in gates] == [
        ("min_pass_rate >= 100% (reference)", False),
        ("every variant solves half", True),
    ]
    assert Run.objects.get().gates_passed is False


def test_it_exits_2_on_bad_input_and_starts_nothing(transactional_db, tmp_path):
    broken = write(
        tmp_path / "broken" / "task.yaml",
        """
        task_id: broken
        initial_prompt: "x"
        success_criteria:
          - type: file_exists
          - type: no_such_criterion
        run_limits:
          max_turns: -3
        """,
    )
    typo = write(
        tmp_path / "typo" / "task.yaml",
        """
        task_id: typo
        initial_prompt: "x"
        max_iteratons: 3
        success_criteria:
          - {type: file_exists, path: a}
        """,
    )

    bad_file = evalrun(SMOKE_TASKS[0], broken.parent, "-T", "oracle")
    bad_path = evalrun(SMOKE_TASKS[0], "-T", "oracle", "-D", "run_limits.max_turnz=5")
    twice = evalrun(SMOKE_TASKS[0], "-D", "run_limits.max_turns=5", "-D", "run_limits.max_turns=6")

    assert bad_file.returncode == 2, bad_file.stderr
    # Every problem, each with its file and line; the good task is not imported either.
    for line, field in (
        (4, "success_criteria[0].path"),
        (5, "success_criteria[1]"),
        (7, "run_limits.max_turns"),
    ):
        assert f"{broken}:{line}: {field}" in bad_file.stderr
    # The loader's messages say nothing of a flag (the web has none); evalrun names its own.
    unknown = evalrun(typo.parent, "-T", "oracle")
    assert unknown.returncode == 2 and f"{typo}:3: max_iteratons: unknown key" in unknown.stderr
    assert unknown.stderr.rstrip().endswith("--lenient keeps unknown keys as warnings")
    assert "--lenient" not in bad_file.stderr
    assert (bad_path.returncode, twice.returncode) == (2, 2)
    assert "did you mean 'max_turns'" in bad_path.stderr
    assert "'run_limits.max_turns' is set twice" in twice.stderr
    assert not Task.objects.exists() and not Run.objects.exists()


def test_it_resumes_a_run_whose_worker_was_killed_without_rerunning_finished_trials(
    celery_worker_process, tmp_path
):
    tasks, experiment = slow_suite(tmp_path, 3)
    started = evalrun(tasks, "-e", experiment, "-j", "1", "--no-wait")
    assert started.returncode == 0, started.stderr
    run = Run.objects.get()
    assert f"run {run.pk}: " in started.stdout
    trials = Trial.objects.filter(run=run)
    wait_for(
        lambda: (
            trials.filter(status=Trial.Status.PASSED).exists() and trials.filter(status="running").exists()
        ),
        timeout=60,
        message=lambda: f"a trial to pass and the next to run; log:\n{celery_worker_process.log()[-3000:]}",
    )

    celery_worker_process.kill()
    before = {t.pk: (t.status, t.finished_at, t.attempt) for t in trials.filter(status=Trial.Status.PASSED)}
    interrupted = trials.get(status=Trial.Status.RUNNING)
    WorkerProcess(tmp_path).start()  # conftest kills it when the test ends
    resumed = evalrun("--resume", run.pk)

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming run" in resumed.stdout
    after = {t.pk: (t.status, t.finished_at, t.attempt) for t in trials.filter(pk__in=before)}
    assert after == before  # finished trials were not run again
    interrupted.refresh_from_db()
    assert (interrupted.status, interrupted.attempt) == (Trial.Status.PASSED, 2)
    run.refresh_from_db()
    assert (run.status, run.n_trials, run.n_passed) == (Run.Status.FINISHED, 3, 3)


def test_it_cancels_the_run_on_ctrl_c(celery_worker_process, start_evalrun, tmp_path):
    tasks, experiment = slow_suite(tmp_path, 3)
    proc = start_evalrun(tasks, "-e", experiment, "-j", "1", "-s", "minimal")
    for line in proc.stdout:
        if "phase agent" in line:
            break
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=TIMEOUT)[0]

    assert proc.returncode == 130, output
    assert "cancelled; finish it later with: evalrun --resume" in output
    run = Run.objects.get()
    assert run.status == Run.Status.CANCELLED
    assert run.n_cancelled >= 2 and run.n_queued + run.n_running == 0


HOOKED_TASK = """
task_id: hooked
initial_prompt: "Write out.txt"
sandbox: {python: null}
hooks:
  trial:
    after: [{command: "sleep 6"}]
success_criteria:
  - type: file_exists
    path: out.txt
"""
QUICK_EXPERIMENT = """
experiment_id: quick
variants:
  - variant_id: writer
    agent: {type: command, command: "echo done > out.txt"}
"""


# Graded by a command that takes a while: a cancel kills it, which must not read as a fail.
SLOW_GRADED_TASK = """
task_id: hooked
initial_prompt: "Write out.txt"
sandbox: {python: null}
success_criteria:
  - type: run_command
    command: "sleep 6; test -f out.txt"
"""


@pytest.mark.parametrize(
    ("signum", "task_text", "phase"),
    [
        (signal.SIGINT, HOOKED_TASK, "hooks_after"),
        (signal.SIGTERM, HOOKED_TASK, "hooks_after"),
        (signal.SIGINT, SLOW_GRADED_TASK, "grading"),
    ],
    ids=["SIGINT-after-hook", "SIGTERM-after-hook", "SIGINT-grading"],
)
def test_ctrl_c_during_a_hook_or_grading_cancels_the_trial_and_resume_runs_it_again(
    signum, task_text, phase, celery_worker_process, start_evalrun, tmp_path
):
    task = write(tmp_path / "tasks" / "hooked" / "task.yaml", task_text)
    experiment = write(tmp_path / "experiment.yaml", QUICK_EXPERIMENT)
    proc = start_evalrun(task, "-e", experiment, "-s", "minimal")
    for line in proc.stdout:
        if f"phase {phase}" in line:
            break
    time.sleep(1)  # the hook is sleeping
    proc.send_signal(signum)
    output = proc.communicate(timeout=TIMEOUT)[0]

    assert proc.returncode == 130, output
    trial = Trial.objects.get()
    # The cancel killed the hook or the criterion's command (exit 143): that is the cancel, not
    # the step's failure.
    assert (trial.status, trial.error_category) == ("cancelled", "cancelled"), trial.error_message
    resumed = evalrun("--resume", trial.run_id, "--no-wait")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    wait_for(
        lambda: Trial.objects.filter(status="passed").exists(),
        timeout=60,
        message=lambda: (
            f"{list(Trial.objects.values_list('status', 'attempt', 'error_message'))}\n"
            + celery_worker_process.log()[-4000:]
        ),
    )
    trial = Trial.objects.get(status="passed")
    assert trial.attempt == 2


def test_its_plan_prints_the_trials_and_what_they_detect_and_stores_nothing():
    import io

    from django.core.management import call_command

    from experiments_app.models import Task

    examples = settings.BASE_DIR / "examples" / "tasks"
    out = io.StringIO()
    call_command("evalrun", examples, "-T", "oracle", "--repeats", "3", "--plan", stdout=out)

    text = out.getvalue()
    assert "72 trials (nothing was started or stored)" in text  # a dataset task among them
    assert "24 units × 3 repeats per variant: detects |Δ| ≥ " in text
    assert "simulated through the comparison's own test" in text and "w = 0.200, how much" in text
    assert Task.objects.count() == 0 and not Run.objects.exists()


def test_its_plan_refuses_a_design_that_can_show_nothing():
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    out = io.StringIO()
    with pytest.raises(CommandError) as refused:
        call_command(
            "evalrun", *map(str, SMOKE_TASKS), "-T", "oracle", "--repeats", "9", "--plan", stdout=out
        )

    assert refused.value.returncode == 1 and "cannot show a difference" in str(refused.value)
    text = out.getvalue()
    assert f"{len(SMOKE_TASKS)} units × 9 repeats per variant: cannot show any difference" in text
    assert "At least 6 units are needed" in text and not Run.objects.exists()


def test_it_warns_when_every_live_worker_runs_other_code(tmp_path):
    from django.utils import timezone

    from runs_app.models import Worker

    Worker.objects.create(name="old@h", hostname="h", code_version="0ld", last_seen_at=timezone.now())
    tasks, experiment = slow_suite(tmp_path, 1)
    started = evalrun(tasks, "-e", experiment, "--no-wait")
    assert started.returncode == 0, started.stderr
    run = Run.objects.get()
    assert (
        f"no live worker runs this checkout's code (version {run.code_version}; they run 0ld)"
        in started.stderr
    )

    Worker.objects.update(code_version=run.code_version)
    again = evalrun(tasks, "-e", experiment, "--no-wait")
    assert again.returncode == 0 and "no live worker" not in again.stderr


HARBOR = settings.BASE_DIR / "examples" / "harbor"


def test_it_runs_a_harbor_task_folder_like_a_task_file(tmp_path):
    """`evalrun <harbor-folder> -T oracle|none` through a real container worker: the solution
    passes (exit 0), doing nothing fails (exit 1)."""
    from runs_app.tests.containers import container_worker, purge_container_queues, require_engine

    require_engine()
    worker = container_worker(tmp_path)
    try:
        solved = evalrun(HARBOR / "hello-world", "-T", "oracle")
        idle = evalrun(HARBOR / "hello-world", "-T", "none")
    finally:
        purge_container_queues()
    assert solved.returncode == 0, solved.stdout + solved.stderr + worker.log()[-3000:]
    assert "tasks: 1 created" in solved.stdout and "1 passed" in solved.stdout
    assert idle.returncode == 1, idle.stdout + idle.stderr
    trials = Trial.objects.order_by("pk")
    assert [t.status for t in trials] == ["passed", "failed"]
    assert trials[0].config["sandbox"]["driver"] == "docker" and trials[0].config["agent"]["type"] == "oracle"
    assert trials[0].config["success_criteria"][0]["type"] == "verifier"
    assert trials[0].image_digest.startswith("sha256:")
    task = Task.objects.get()
    assert task.slug == "hello-world" and task.current_version().yaml_path == "task.toml"


def test_it_names_a_harbor_folders_problems_and_exits_2(tmp_path):
    import io
    import shutil

    from django.core.management import call_command
    from django.core.management.base import CommandError

    folder = Path(shutil.copytree(HARBOR / "hello-world", tmp_path / "hello-world"))
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace("cpus = 1", "cpu = 1"))
    (folder / "instruction.md").unlink()

    with pytest.raises(CommandError) as excinfo:
        call_command(
            "evalrun", str(folder), str(HARBOR / "shout-and-count"), "-T", "none", stdout=io.StringIO()
        )

    message = str(excinfo.value)
    assert excinfo.value.returncode == 2
    assert message.startswith("cannot load the task files: 2 problem(s)")
    assert f"{folder}/task.toml:17: environment.cpu: unknown key 'cpu'; did you mean 'cpus'?" in message
    assert f"{folder}/instruction.md: not found" in message
    assert not Task.objects.exists()


def test_it_refuses_to_launch_what_no_live_worker_can_run(tmp_path):
    from django.utils import timezone

    from evalsite.versioning import code_version
    from runs_app.models import Worker

    Worker.objects.create(
        name="w1@host-a", hostname="host-a", code_version=code_version(), last_seen_at=timezone.now(),
        agent_versions={"claude-code": "2.0.1"}, providers=["openai"],
    )  # fmt: skip

    refused = evalrun(*SMOKE_TASKS, "-T", "claude-code", "--no-wait")

    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "pre-flight: claude-code: a key for anthropic (ANTHROPIC_API_KEY): no live worker has it" in (
        refused.stderr
    )
    assert "--launch-anyway" in refused.stderr and not Run.objects.exists()

    anyway = evalrun(*SMOKE_TASKS, "-T", "claude-code", "--no-wait", "--launch-anyway")
    assert anyway.returncode == 0, anyway.stderr
    assert Run.objects.count() == 1

    planned = evalrun(*SMOKE_TASKS, "-T", "claude-code", "--plan")
    assert "pre-flight fail: claude-code: a key for anthropic" in planned.stdout
    cli = "pre-flight ok: claude-code: the claude CLI (claude-code): 2.0.1 on 1 live worker"
    assert cli in planned.stdout


def test_while_following_it_says_when_a_variant_is_decided():
    import io

    from django.core.management.base import OutputWrapper

    from runs_app.analysis import load
    from runs_app.management.commands.evalrun import _Decisions, _Progress
    from runs_app.tests.analysis.test_comparison import make_experiment, make_run

    out = io.StringIO()
    decisions = _Decisions(_Progress(OutputWrapper(out), tty=False))
    few = {f"t{i:02d}": {"base": "F", "new": "P"} for i in range(3)}
    run = make_run(make_experiment(), few, baseline="base", status=Run.Status.RUNNING)
    decisions.check(run)
    assert out.getvalue() == ""  # three units decide nothing: nothing to say

    more = {f"t{i:02d}": {"base": "F", "new": "P"} for i in range(3, 20)}
    run = make_run(make_experiment("exp2"), {**few, **more}, baseline="base", status=Run.Status.RUNNING)
    load.forget_comparisons()
    decisions.done, decisions.at = -1, 0.0
    decisions.check(run)
    text = out.getvalue()
    assert text.startswith("anytime-valid: new: pass rate in [") and "decided: better than base" in text
    decisions.check(run)  # nothing new: said once
    assert out.getvalue() == text


ROUND2 = settings.BASE_DIR / "experiments_app" / "tests" / "corpus" / "coder_eval_round2"


def test_it_exits_1_when_a_dataset_suite_misses_its_threshold_though_every_row_passed(
    celery_worker_process, tmp_path
):
    # coder-eval 0.12.16 on the same file: "Results: 2/2 succeeded", "1 suite gate(s) failed
    # thresholds", exit 1.
    result = evalrun(ROUND2 / "spec_2_suite_threshold.yaml")

    assert result.returncode == 1, result.stdout + result.stderr + celery_worker_process.log()[-3000:]
    run = Run.objects.get()
    assert (run.status, run.n_trials, run.n_passed) == (Run.Status.FINISHED, 2, 2)
    assert "suite FAIL: spec-2-suite-threshold × default: mean 0.5 < 0.9" in result.stdout


def test_it_exits_0_when_every_dataset_suite_meets_its_thresholds(celery_worker_process, tmp_path):
    task = tmp_path / "task.yaml"
    task.write_text(
        (ROUND2 / "spec_2_suite_threshold.yaml").read_text().replace("{mean: 0.9}", "{mean: 0.5}")
    )

    result = evalrun(task)

    assert result.returncode == 0, result.stdout + result.stderr + celery_worker_process.log()[-3000:]
    assert "suite pass: spec-2-suite-threshold × default: mean 0.5 >= 0.5" in result.stdout


def test_it_samples_n_rows_of_a_dataset_task_as_coder_evals_sample(transactional_db):
    result = evalrun(ROUND2 / "spec_4_sample_rows.yaml", "-T", "none", "--sample", "3", "--plan")

    assert result.returncode in (0, 1), result.stdout + result.stderr
    # coder-eval 0.12.16's `--sample 3` on this file runs rows r12, r13 and r01.
    assert "spec-4-sample-rows × none: 3 trials over 3 dataset rows" in result.stdout, result.stdout
