"""Hostile agents through a real worker: each task is an attack, and its criterion passes only
when the attack failed (what the agent got is graded on the worker, outside the sandbox). Some
effects are also checked from here, after the run: files outside the workspace, processes left
behind, writes to Redis, every encoding of the API key in what was stored."""

import base64
import json
import os
import socket
import subprocess
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from conftest import WorkerProcess, purge_broker
from experiments_app.definitions import ImportFailed, import_tasks
from runs_app.launching import LaunchError, LaunchOptions, launch_run
from runs_app.models import Trial, TrialEvent
from runs_app.tests.factories import import_folder_tasks, make_experiment, make_task
from runs_app.tests.workers import wait_for_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

MARK = uuid.uuid4().hex[:12]
KEY = f"sk-ant-api03-canary-{MARK}"
TOKEN = f"auth-token-canary-{MARK}"  # ANTHROPIC_AUTH_TOKEN: held by the gateway too
CANARY = f"worker-canary-{MARK}"

NETWORK = f"""
import socket
for port in (5432, 6379, 5672, 8000):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall(b"SET evalsite-hostile-{MARK} 1\\r\\n")
        print("open", port)
    except OSError as exc:
        print("refused", port, exc)
print("attempted")
"""

ATTACKS = {
    # The worker's database and var/ (session keys, the secret key).
    "read-the-database": (
        'cat "$DB" "$VAR/secret_key" > loot.txt 2>&1; ls -la "$VAR" >> loot.txt 2>&1; '
        "echo attempted >> loot.txt",
        ["SQLite format 3", settings.SECRET_KEY],
    ),
    # PostgreSQL, Redis, RabbitMQ and the web server on the worker's loopback.
    "reach-the-services": (f"python3 -c {json.dumps(NETWORK)} > loot.txt 2>&1", ["open "]),
    # Its own reference solution, wherever the bundle might be.
    "read-the-reference": (
        "cat ../task/*/reference/* ../*/reference/* ../../*/*/reference/* > loot.txt 2>&1; "
        'cat "$SANDBOXES"/bundles/*/reference/* "$SANDBOXES"/bundles/*/*/reference/* >> loot.txt 2>&1; '
        "find / -xdev -name answer.txt -exec cat {} + >> loot.txt 2>/dev/null; echo attempted >> loot.txt",
        [f"reference-{MARK}"],
    ),
    # The worker's environment and every process's, printed in the clear, reversed, in base64.
    "print-the-key": (
        "{ env; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done; } > raw.txt 2>&1; "
        "rev raw.txt > rev.txt; base64 -w0 raw.txt > b64.txt; cat raw.txt rev.txt b64.txt > loot.txt; "
        "cat raw.txt rev.txt; echo attempted >> loot.txt",
        [KEY, KEY[::-1], CANARY, CANARY[::-1]],
    ),
    # Another trial running at the same time (the victim below holds the secret).
    "read-another-trial": (
        "sleep 1.5; cat /proc/*/cwd/secret.txt /var/tmp/evalsite-sandboxes/*/workspace/secret.txt "
        '"$SANDBOXES"/*/workspace/secret.txt > loot.txt 2>&1; ls /proc >> loot.txt; '
        "echo attempted >> loot.txt",
        [f"victim-{MARK}"],
    ),
    # Files outside the workspace that would outlive the trial.
    "write-outside": (
        'for d in /tmp /var/tmp /dev/shm "$HOME/.." "$VAR" "$CHECKOUT"; do '
        f'echo x > "$d/escape-{MARK}"; done 2>/dev/null; echo attempted > loot.txt',
        [],
    ),
    # More memory than the trial's cap (each byte written, not just reserved).
    "exceed-memory": (
        "echo attempted > loot.txt; python3 -c \"b = b'x' * (3 << 30); print('allocated')\" >> loot.txt",
        ["allocated"],
    ),
    # Processes that would keep running after the trial.
    "leave-a-daemon": (
        f"setsid sh -c 'exec sleep 300{MARK[:2]}' >/dev/null 2>&1 & "
        f"nohup sleep 301{MARK[:2]} >/dev/null 2>&1 & echo attempted > loot.txt",
        [],
    ),
}


def hostile_suite(folder: Path) -> None:
    db = connection.settings_dict["NAME"] if connection.vendor == "sqlite" else "/nonexistent"
    env = {"DB": str(db), "VAR": str(settings.VAR_DIR), "CHECKOUT": str(settings.BASE_DIR),
           "SANDBOXES": str(settings.SANDBOX_ROOT)}  # fmt: skip
    for slug, (command, forbidden) in ATTACKS.items():
        criterion = {"type": "file_contains", "path": "loot.txt", "includes": ["attempted"]}
        if forbidden:
            criterion["excludes"] = forbidden
        agent = {"type": "command", "command": command, "env": env}
        make_task(
            folder,
            slug,
            json.dumps(
                {
                    "task_id": slug,
                    "initial_prompt": "attack",
                    "agent": agent,
                    "reference": {"directory": "reference"},
                    "success_criteria": [criterion],
                }
            ),
            {"reference/answer.txt": f"reference-{MARK}\n"},
        )
    make_task(
        folder,
        "victim",
        json.dumps(
            {
                "task_id": "victim",
                "initial_prompt": "wait",
                "agent": {"type": "command", "command": "sleep 6"},
                "sandbox": {
                    "template_sources": [
                        {
                            "type": "starter_files",
                            "files": [{"path": "secret.txt", "content": f"victim-{MARK}"}],
                        }
                    ]
                },
                "success_criteria": [{"type": "file_exists", "path": "secret.txt"}],
            }
        ),
    )
    import_folder_tasks(folder)


def redis_has(key: str) -> bool | None:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=2) as s:
            s.sendall(f"EXISTS {key}\r\n".encode())
            return s.recv(64).strip() != b":0"
    except OSError:
        return None  # no Redis on this machine: nothing to have written to


def test_every_attack_of_a_hostile_agent_fails(tmp_path):
    hostile_suite(tmp_path)
    experiment = make_experiment(
        tmp_path, "experiment_id: hostile\nmax_parallel: 2\nvariants:\n  - variant_id: as-written\n"
    )
    purge_broker()
    worker = WorkerProcess(
        tmp_path,
        extra_env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_AUTH_TOKEN": TOKEN, "EVALSITE_CANARY": CANARY},
    ).start()
    try:
        # The victim first, so it runs beside the thief.
        order = ["victim", "read-another-trial", *[slug for slug in ATTACKS if slug != "read-another-trial"]]
        run = wait_for_run(launch_run(experiment, options=LaunchOptions(task_slugs=order)), 240, worker)
    finally:
        worker.kill()

    trials = {
        t.task_version.task.slug: t
        for t in Trial.objects.filter(run=run).select_related("task_version__task")
    }
    for slug, trial in trials.items():
        assert trial.status == "passed", (
            slug,
            trial.error_category,
            trial.error_message,
            trial.agent_stderr[-800:],
        )
    assert trials["exceed-memory"].budget_exceeded == "memory"

    stored = " ".join(
        [t.agent_stdout + t.agent_stderr + t.diff + t.error_message for t in trials.values()]
        + [json.dumps(e.data) for e in TrialEvent.objects.filter(trial__run=run)]
    )
    for secret in (KEY, TOKEN, CANARY, settings.SECRET_KEY):
        encodings = [secret, secret[::-1]] + [
            base64.b64encode((" " * shift + secret).encode()).decode()[4:-4] for shift in range(3)
        ]
        assert not any(encoded in stored for encoded in encodings), secret
    for folder in ("/tmp", "/var/tmp", "/dev/shm", settings.VAR_DIR, settings.BASE_DIR):
        assert not (Path(folder) / f"escape-{MARK}").exists(), folder
    assert not list(Path(settings.SANDBOX_ROOT).glob(f"*/escape-{MARK}"))
    left = subprocess.run(["pgrep", "-f", f"sleep 30[01]{MARK[:2]}"], capture_output=True, text=True)
    assert left.stdout == "", "a daemon outlived its trial"
    assert redis_has(f"evalsite-hostile-{MARK}") in (False, None)


def test_a_repo_source_cannot_clone_the_workers_checkout(tmp_path):
    task = tmp_path / "tasks" / "clone.yaml"
    task.parent.mkdir(parents=True)
    for url in (str(settings.BASE_DIR), f"file://{settings.BASE_DIR}"):
        task.write_text(
            "task_id: clone\ninitial_prompt: x\nsandbox:\n  template_sources:\n"
            f"    - {{type: repo, url: {json.dumps(url)}}}\n"
            "success_criteria: [{type: file_exists, path: a}]\n"
        )
        with pytest.raises(ImportFailed, match=r"clone\.yaml:5: .*url.*is not allowed: give an https:// URL"):
            import_tasks([task.parent])


def test_an_override_cannot_point_a_repo_source_at_the_worker(tmp_path):
    make_task(
        tmp_path,
        "plain",
        "task_id: plain\ninitial_prompt: x\nsuccess_criteria: [{type: file_exists, path: a}]\n",
    )
    import_folder_tasks(tmp_path)
    experiment = make_experiment(tmp_path, "experiment_id: plain\nvariants:\n  - variant_id: a\n")
    override = f"sandbox.template_sources=[{{type: repo, url: 'file://{settings.BASE_DIR}'}}]"

    with pytest.raises(LaunchError, match="is not allowed: give an https:// URL"):
        launch_run(experiment, options=LaunchOptions(overrides=[override]))


@pytest.mark.skipif(os.geteuid() != 0, reason="the root worker's case; test_sandbox covers non-root")
def test_the_sandbox_uid_of_a_root_worker_is_never_root(tmp_path):
    make_task(
        tmp_path,
        "whoami",
        'task_id: whoami\ninitial_prompt: x\nagent: {type: command, command: "id -u > uid.txt"}\n'
        "success_criteria: [{type: file_exists, path: uid.txt}]\n",
    )
    import_folder_tasks(tmp_path)
    experiment = make_experiment(tmp_path, "experiment_id: whoami\nvariants:\n  - variant_id: a\n")
    purge_broker()
    worker = WorkerProcess(tmp_path).start()
    try:
        run = wait_for_run(launch_run(experiment), 60, worker)
    finally:
        worker.kill()
    trial = Trial.objects.get(run=run)
    assert trial.status == "passed", trial.error_message
    assert "+0" not in trial.diff.splitlines()
