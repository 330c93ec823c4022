"""Container tasks end to end through a real worker: Harbor task folders and coder-eval docker
tasks build their image once per host, run their oracle and verifier in the trial's container,
and leave no container behind."""

import shutil

import pytest
from django.conf import settings

from runs_app.engine.sandbox import docker
from runs_app.launching import LaunchOptions, launch_run
from runs_app.models import CriterionResult, Trial, TrialEvent
from runs_app.tests.containers import container_worker, purge_container_queues, require_engine
from runs_app.tests.factories import EXAMPLES, import_folder_tasks, make_experiment, make_task
from runs_app.tests.workers import wait_for_run

pytestmark = pytest.mark.django_db(transaction=True)

ORACLE_AND_NONE = """
experiment_id: harbor
max_parallel: 4
defaults:
  repeats: {repeats}
variants:
  - variant_id: oracle
    agent: {{type: oracle}}
  - variant_id: none
    agent: {{type: none}}
"""


@pytest.fixture
def worker(tmp_path):
    require_engine()
    yield container_worker(tmp_path)
    purge_container_queues()


def outcomes(run) -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for trial in Trial.objects.filter(run=run).select_related("task_version__task", "variant"):
        key = (trial.variant.slug, trial.task_version.task.slug)
        found.setdefault(key, []).append(trial.status)
    return found


def test_harbor_folders_run_their_oracle_and_verifier_in_a_container(worker, tmp_path):
    for name in ("hello-world", "shout-and-count"):
        shutil.copytree(EXAMPLES / "harbor" / name, tmp_path / "tasks" / name)
    import_folder_tasks(tmp_path)
    run = launch_run(make_experiment(tmp_path, ORACLE_AND_NONE.format(repeats=2)))
    run = wait_for_run(run, 240, worker)

    found = outcomes(run)
    errors = list(Trial.objects.filter(run=run, status="error").values_list("error_message", flat=True))
    assert not errors, errors
    assert found[("oracle", "hello-world")] == ["passed", "passed"]
    assert found[("oracle", "shout-and-count")] == ["passed", "passed"]
    assert found[("none", "hello-world")] == ["failed", "failed"]
    assert found[("none", "shout-and-count")] == ["failed", "failed"]
    # reward.json's two keys are two results, each half the verifier's weight.
    trial = Trial.objects.filter(run=run, variant__slug="oracle", task_version__task__slug="shout-and-count")[
        0
    ]
    parts = {c.description.rsplit(": ", 1)[-1]: c for c in CriterionResult.objects.filter(trial=trial)}
    assert set(parts) == {"count", "upper"} and all(c.passed and c.weight == 0.5 for c in parts.values())
    # One image per task, built at most once on this host; every trial names its digest.
    digests = {t.task_version.task.slug: set() for t in Trial.objects.filter(run=run)}
    for t in Trial.objects.filter(run=run).select_related("task_version__task"):
        digests[t.task_version.task.slug].add(t.image_digest)
    assert all(len(d) == 1 and next(iter(d)).startswith("sha256:") for d in digests.values()), digests
    builds = [
        e.data
        for e in TrialEvent.objects.filter(trial__run=run, kind="output")
        if e.data.get("step") == "image"
    ]
    assert len(builds) == 8
    built = [b for b in builds if "built evalsite/task:" in b["stdout"]]
    assert len(built) <= 2  # the first trial of each task, if the image was not there yet
    # The containers went with their trials.
    assert not [
        c
        for c in docker.containers()
        if str(tmp_path) in str(c.root) or c.worker.endswith(f":{worker.proc.pid}")
    ]


# coder-eval's docker driver: a named image with the workspace mounted, and a Dockerfile whose
# image's own folder is the workspace (working_dir), with template sources copied in.
NAMED_IMAGE_TASK = """
task_id: named
initial_prompt: "Write out.txt"
sandbox:
  driver: docker
  python: null
  docker: {image: evalsite/busybox}
  template_sources:
    - type: starter_files
      files: [{path: input.txt, content: "abc"}]
pre_run:
  - command: "test -f input.txt && echo ready > pre.txt"
success_criteria:
  - type: file_contains
    path: out.txt
    includes: ["abc"]
  - type: run_command
    command: "test -f pre.txt && grep -q abc out.txt"
"""

DOCKERFILE_TASK = """
task_id: built
initial_prompt: "Copy the greeting"
sandbox:
  driver: docker
  python: null
  docker:
    dockerfile_path: env/Dockerfile
    working_dir: auto
    build: {args: {GREETING: hello}}
  template_sources:
    - type: starter_files
      files: [{path: extra.txt, content: "from the task"}]
success_criteria:
  - type: run_command
    command: "grep -q hello out.txt && grep -q 'from the task' out.txt && test \\"$(pwd)\\" = /work"
"""

DOCKERFILE = """
FROM evalsite/busybox
ARG GREETING
WORKDIR /work
RUN echo "$GREETING" > /work/greeting.txt
"""

COMMAND_AGENTS = """
experiment_id: docker-tasks
max_parallel: 4
defaults:
  repeats: 2
variants:
  - variant_id: agent
    agent: {type: command, command: "cat greeting.txt input.txt extra.txt > out.txt 2>/dev/null; true"}
  - variant_id: none
    agent: {type: none}
"""


def test_coder_eval_docker_tasks_run_through_a_worker(worker, tmp_path):
    make_task(tmp_path, "named", NAMED_IMAGE_TASK)
    make_task(tmp_path, "built", DOCKERFILE_TASK, files={"env/Dockerfile": DOCKERFILE})
    import_folder_tasks(tmp_path)
    run = wait_for_run(launch_run(make_experiment(tmp_path, COMMAND_AGENTS)), 240, worker)

    errors = list(Trial.objects.filter(run=run, status="error").values_list("error_message", flat=True))
    assert not errors, errors
    found = outcomes(run)
    assert found[("agent", "named")] == ["passed", "passed"]
    assert found[("agent", "built")] == ["passed", "passed"]
    assert found[("none", "named")] == ["failed", "failed"]
    assert found[("none", "built")] == ["failed", "failed"]
    # The diff of the image's folder shows what the agent wrote there.
    built = Trial.objects.filter(run=run, variant__slug="agent", task_version__task__slug="built")[0]
    assert "+++ b/out.txt" in built.diff and "greeting.txt" not in built.diff


BROKEN_BUILD = """
task_id: broken
initial_prompt: "x"
sandbox: {driver: docker, python: null, docker: {dockerfile_path: env/Dockerfile}}
success_criteria: [{type: file_exists, path: x}]
"""

MISSING_IMAGE = """
task_id: missing
initial_prompt: "x"
sandbox: {driver: docker, python: null, docker: {image: "evalsite/not-on-this-host:1"}}
success_criteria: [{type: file_exists, path: x}]
"""


def test_an_image_that_cannot_be_had_is_an_environment_error_with_its_log(worker, tmp_path):
    make_task(
        tmp_path,
        "broken",
        BROKEN_BUILD,
        files={"env/Dockerfile": "FROM evalsite/busybox\nRUN echo building; exit 3\n"},
    )
    make_task(tmp_path, "missing", MISSING_IMAGE)
    import_folder_tasks(tmp_path)
    run = wait_for_run(launch_run(make_experiment(tmp_path, ORACLE_AND_NONE.format(repeats=1))), 240, worker)

    trials = Trial.objects.filter(run=run, variant__slug="none").select_related("task_version__task")
    by_task = {t.task_version.task.slug: t for t in trials}
    assert {t.status for t in trials} == {"error"}
    assert {t.error_category for t in trials} == {"environment"}
    assert "did not build" in by_task["broken"].error_message
    assert "not on this worker" in by_task["missing"].error_message
    log = TrialEvent.objects.get(trial=by_task["broken"], kind="output", data__step="image").data
    assert "building" in log["stdout"] and log["exit_code"] == 1


CLAUDE_TASK = """
task_id: greet
initial_prompt: "Write hello.txt"
sandbox:
  driver: docker
  python: null
  docker: {{image: evalsite/debian:bookworm{working_dir}}}
success_criteria:
  - type: file_contains
    path: hello.txt
    includes: ["hi from claude"]
"""

CLAUDE = """
experiment_id: claude-in-a-container
variants:
  - variant_id: claude
    agent: {{type: claude-code, model: claude-sonnet-4-6, permission_mode: acceptEdits,
            allowed_tools: [Bash], max_retries: 0, base_url: "{url}"}}
"""


@pytest.mark.parametrize("working_dir", ["", ", working_dir: /srv"])
def test_the_real_claude_cli_runs_in_a_glibc_image_through_the_gateway(tmp_path, working_dir):
    require_engine()
    from runs_app.tests.mock_servers import AnthropicMock, Turn, text, tool_use

    key = "sk-test-real-key-only-the-gateway-holds"
    script = [
        Turn(
            [
                tool_use(
                    "Bash",
                    {"command": "echo 'hi from claude' > hello.txt; env > env.txt", "description": "w"},
                )
            ]
        ),
        Turn([text("Done.")]),
    ]
    make_task(tmp_path, "greet", CLAUDE_TASK.format(working_dir=working_dir))
    import_folder_tasks(tmp_path)
    with AnthropicMock(script) as api:
        worker = container_worker(tmp_path, extra_env={"ANTHROPIC_API_KEY": key})
        try:
            run = wait_for_run(launch_run(make_experiment(tmp_path, CLAUDE.format(url=api.url))), 150, worker)
        finally:
            purge_container_queues()
    trial = Trial.objects.get(run=run)
    assert trial.status == "passed", (trial.error_category, trial.error_message, trial.agent_stderr[-2000:])
    assert trial.input_tokens > 0 and trial.image_digest.startswith("sha256:")
    assert (
        "+++ b/env.txt" in trial.diff and "ANTHROPIC" in trial.diff
    )  # the placeholder and the gateway's URL
    assert key not in trial.diff and key not in trial.agent_stdout + trial.agent_stderr
    assert [e.data["name"] for e in TrialEvent.objects.filter(trial=trial, kind="tool_call")] == ["Bash"]


HOSTILE_TASK = """
task_id: escape
initial_prompt: "Leave the container"
sandbox:
  driver: docker
  python: null
  docker: {{image: evalsite/busybox{working_dir}}}
success_criteria:
  - type: run_command
    # Root working in the image may write its own layer (the image is the task's system): no more.
    command: >-
      tail -n 1 escape.txt | grep -qx done &&
      ! grep ESCAPED escape.txt | grep -vqx 'ESCAPED write-system: /etc/escape'

"""

BALLOON_TASK = """
task_id: balloon
initial_prompt: "Take the host's memory"
sandbox:
  driver: docker
  python: null
  docker: {image: evalsite/busybox}
  limits: {max_memory_mb: 96}
success_criteria:
  - type: run_command
    command: "test ! -f survived.txt"
"""

HOSTILE = """
experiment_id: hostile
max_parallel: 4
variants:
  - variant_id: attacker
    agent:
      type: command
      script: escape.sh
      command: >-
        MARKER={marker_head}$(echo {marker_tail}) sh {{script}} {port} {canary} {other} > escape.txt 2>&1;
        x=$(head -c 300000000 /dev/zero | tr '\\0' a) && touch survived.txt
"""


@pytest.fixture
def listener():
    """A server on every address of the host: a container that reaches it has a network."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen()
    accepted = []

    def serve():
        while True:
            try:
                accepted.append(server.accept())
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1], accepted
    server.close()


@pytest.mark.parametrize("working_dir", ["", ", working_dir: /app, user: root"], ids=["uid", "root-in-image"])
def test_hostile_agents_in_a_container_get_nothing_through_a_worker(tmp_path, listener, working_dir):
    import subprocess
    import sys

    from runs_app.tests.engine.test_container_driver import HOSTILE as SCRIPTS

    require_engine()
    port, accepted = listener
    canary = tmp_path / "canary.txt"
    canary.write_text("host secret")
    marker = f"hostile-{tmp_path.name}"
    host_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", marker])
    try:
        make_task(tmp_path, "escape", HOSTILE_TASK.format(working_dir=working_dir))
        make_task(tmp_path, "balloon", BALLOON_TASK)
        import_folder_tasks(tmp_path)
        (tmp_path / "experiments").mkdir(exist_ok=True)
        shutil.copy(SCRIPTS / "container_escape.sh", tmp_path / "experiments" / "escape.sh")
        # The host's image locks, beside the bundles (the agent's own script is mounted from those).
        other = f"{settings.SANDBOX_ROOT}/images"
        experiment = make_experiment(
            tmp_path,
            HOSTILE.format(
                marker_head=marker[:8], marker_tail=marker[8:], port=port, canary=canary, other=other
            ),
        )
        worker = container_worker(tmp_path)
        run = wait_for_run(launch_run(experiment), 180, worker)
    finally:
        host_process.kill()
        purge_container_queues()
    trials = {
        t.task_version.task.slug: t
        for t in Trial.objects.filter(run=run).select_related("task_version__task")
    }
    escape, balloon = trials["escape"], trials["balloon"]
    lines = escape.diff
    assert escape.status == "passed", (escape.error_message, lines[-3000:])
    assert (
        "blocked engine-socket" in lines
        and "blocked bridge-host" in lines
        and "blocked other-process" in lines
    )
    # Root working in the image writes its own layer (the image is the task's system), nothing else.
    assert "ESCAPED" not in lines.replace("ESCAPED write-system: /etc/escape", "")
    assert accepted == []
    assert balloon.status == "passed" and balloon.budget_exceeded == "memory", (
        balloon.status,
        balloon.budget_exceeded,
    )


SLOW_CONTAINER_TASK = """
task_id: slow
initial_prompt: "wait"
sandbox: {driver: docker, python: null, docker: {image: evalsite/busybox}}
success_criteria: [{type: file_exists, path: out.txt}]
"""


def test_a_killed_worker_leaves_no_container_once_a_worker_of_its_host_starts(tmp_path):
    from conftest import wait_for

    require_engine()
    make_task(tmp_path, "slow", SLOW_CONTAINER_TASK)
    import_folder_tasks(tmp_path)
    experiment = make_experiment(
        tmp_path,
        "experiment_id: s\nvariants:\n  - variant_id: a\n    agent: {type: command, command: 'sleep 99'}\n",
    )
    doomed = container_worker(tmp_path)
    try:
        run = launch_run(experiment)
        running = wait_for(
            lambda: {
                c.name for c in docker.containers() if str(settings.TRIAL_ROOT) in str(c.root) and c.running
            },
            timeout=60,
            message=lambda: doomed.log()[-3000:],
        )
        assert Trial.objects.filter(run=run, status="running").exists()
        doomed.kill()  # SIGKILL to the worker and its children: nothing of it removes the container
        assert running <= {c.name for c in docker.containers()}  # nothing of the worker removed it
        successor = container_worker(tmp_path)  # its start sweeps what dead workers of the host left
        wait_for(
            lambda: not running & {c.name for c in docker.containers()},
            timeout=60,
            message=lambda: f"the reaper to remove {running}; log:\n{successor.log()[-3000:]}",
        )
    finally:
        purge_container_queues()


CLI_IN = """
task_id: {slug}
initial_prompt: "x"
sandbox: {{driver: docker, python: null, docker: {docker}}}
success_criteria: [{{type: file_exists, path: x}}]
"""

CLAUDE_ONLY = """
experiment_id: cli
variants:
  - variant_id: claude
    agent: {type: claude-code, model: claude-sonnet-4-6}
"""


def test_an_agent_cli_in_an_image_without_glibc_is_refused_at_launch_or_by_the_worker(tmp_path):
    from runs_app.launching import LaunchError

    require_engine()
    make_task(tmp_path, "named", CLI_IN.format(slug="named", docker="{image: evalsite/busybox}"))
    import_folder_tasks(tmp_path)
    with pytest.raises(
        LaunchError, match="agent kind claude-code runs the worker's claude CLI.*evalsite/busybox"
    ):
        launch_run(make_experiment(tmp_path, CLAUDE_ONLY))

    # Built FROM busybox: the launch cannot know, the worker says so before the agent's phase.
    other = tmp_path / "built"
    make_task(other, "built", CLI_IN.format(slug="built", docker="{dockerfile_path: env/Dockerfile}"),
              files={"env/Dockerfile": "FROM evalsite/busybox\n"})  # fmt: skip
    import_folder_tasks(other)
    worker = container_worker(tmp_path, extra_env={"ANTHROPIC_API_KEY": "sk-test-unused"})
    try:
        run = launch_run(make_experiment(other, CLAUDE_ONLY), options=LaunchOptions(task_slugs=["built"]))
        run = wait_for_run(run, 120, worker)
    finally:
        purge_container_queues()
    trial = Trial.objects.get(run=run)
    assert (trial.status, trial.error_category) == ("error", "environment")
    assert "needs the GNU C library" in trial.error_message


REGRADED_TASK = """
task_id: regraded
initial_prompt: "Copy the greeting"
sandbox:
  driver: docker
  python: null
  docker: {{dockerfile_path: env/Dockerfile, working_dir: auto, build: {{args: {{GREETING: hello}}}}}}
success_criteria:
  - {{type: file_contains, path: out.txt, includes: [{word}]}}
  - {{type: run_command, command: "grep -q {word} out.txt"}}
"""


def test_evaluate_regrades_a_container_trial_from_its_kept_image_folder(worker, tmp_path):
    import io

    from django.core.management import call_command

    make_task(
        tmp_path, "regraded", REGRADED_TASK.format(word="nothere"), files={"env/Dockerfile": DOCKERFILE}
    )
    import_folder_tasks(tmp_path)
    experiment = make_experiment(
        tmp_path,
        "experiment_id: r\nvariants:\n  - variant_id: a\n"
        "    agent: {type: command, command: 'cp greeting.txt out.txt'}\n",
    )
    run = wait_for_run(launch_run(experiment, options=LaunchOptions(keep_artifacts=True)), 120, worker)
    assert run.n_failed == 1, list(Trial.objects.values_list("error_message", flat=True))
    make_task(tmp_path, "regraded", REGRADED_TASK.format(word="hello"), files={"env/Dockerfile": DOCKERFILE})
    import_folder_tasks(tmp_path)
    out = io.StringIO()

    call_command("evaluate", str(run.pk), stdout=out)

    run.refresh_from_db()
    latest = Trial.objects.get(run=run, is_latest=True)
    assert (run.n_passed, run.n_failed) == (1, 0), (out.getvalue(), latest.error_message)
    latest = Trial.objects.get(run=run, is_latest=True)
    assert [c.passed for c in latest.criterion_results.order_by("index")] == [True, True]
