"""One fixed run on one worker host, then on two: hosts built as network namespaces on this machine
(tests/hosts.py), sharing only PostgreSQL, Redis and a local S3 server, as in
tests/test_many_hosts.py.

Usage (root; scratch services only, the bench migrates and fills the database):
  DATABASE_URL=postgres://postgres@127.0.0.1:5432/evalsite_bench_hosts \\
  CELERY_BROKER_URL=redis://127.0.0.1:6379/11 \\
  .venv/bin/python bench/hosts_scaling.py [--trials 48] [--agent-seconds 2] [--concurrency 4]

The run: TRIALS trials whose agent sleeps AGENT_SECONDS and keeps its workspace (artifacts go to
the S3 server), max_parallel = 2 x CONCURRENCY, each host a worker of CONCURRENCY processes. Both
hosts share this machine's cores, so the figure shows what a second host adds in trials in flight,
not in CPU.
"""

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TASK = """task_id: sleepy
initial_prompt: wait
sandbox: {python: null}
success_criteria:
  - {type: file_exists, path: done.txt}
"""
EXPERIMENT = """experiment_id: hosts-scaling
variants:
  - variant_id: sleeper
    agent: {type: command, command: "sleep SECONDS && echo ok > done.txt"}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=48)
    parser.add_argument("--agent-seconds", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    broker = os.environ.get("CELERY_BROKER_URL", "")
    if not os.environ.get("DATABASE_URL") or not broker.startswith("redis://"):
        sys.exit("set DATABASE_URL (a scratch PostgreSQL database) and CELERY_BROKER_URL (scratch Redis)")
    from tests.hosts import NetnsHost, Relay, can_build_hosts

    if why := can_build_hosts():
        sys.exit(f"cannot build hosts here: {why}")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from conftest import S3Server
    from evalsite.celery import app
    from experiments_app.definitions import import_experiment, import_tasks
    from runs_app.launching import LaunchOptions, launch_run
    from runs_app.models import Run, Trial

    call_command("migrate", verbosity=0)
    with tempfile.TemporaryDirectory(prefix="evalsite-hosts-") as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "suite" / "tasks" / "sleepy").mkdir(parents=True)
        (tmp_path / "suite" / "tasks" / "sleepy" / "task.yaml").write_text(TASK)
        (tmp_path / "suite" / "exp.yaml").write_text(EXPERIMENT.replace("SECONDS", f"{args.agent_seconds:g}"))
        import_tasks([tmp_path / "suite" / "tasks"])
        experiment = import_experiment(tmp_path / "suite" / "exp.yaml").experiment
        s3 = S3Server(tmp_path).wait_ready()
        session = f"{os.getpid() % 100000}{secrets.token_hex(2)}"
        hosts = [NetnsHost("host-a", 1, session), NetnsHost("host-b", 2, session)]
        relay = Relay()
        database_port = int(settings.DATABASES["default"]["PORT"] or 5432)
        try:
            for host in hosts:
                host.create()
                for port in (database_port, 6379, s3.port):
                    relay.forward(host.gateway, port, port)
            for host in hosts:
                host.hidden = [other.root for other in hosts if other is not host]
            print(f"{args.trials} trials of {args.agent_seconds:g} s agents, max_parallel "
                  f"{2 * args.concurrency}, {args.concurrency} worker processes a host")  # fmt: skip
            for count in (1, 2):
                elapsed, passed = timed_run(
                    hosts[:count], args, tmp_path, s3, experiment, app, LaunchOptions, launch_run, Run, Trial
                )
                ideal = args.trials * args.agent_seconds / (count * args.concurrency)
                print(f"{count} host(s): {passed}/{args.trials} passed in {elapsed:.1f} s "
                      f"(the agents alone: {ideal:.1f} s)")  # fmt: skip
        finally:
            relay.stop()
            for host in hosts:
                host.destroy()
            shutil.rmtree(hosts[0].root.parent, ignore_errors=True)
            s3.stop()


def timed_run(hosts, args, tmp_path, s3, experiment, app, LaunchOptions, launch_run, Run, Trial):
    app.control.purge()
    services = {
        "DATABASE_URL": os.environ["DATABASE_URL"],
        "CELERY_BROKER_URL": os.environ["CELERY_BROKER_URL"],
        "EVALSITE_S3_ENDPOINT_URL": s3.url,
    }
    workers = []
    for host in hosts:
        env = {**os.environ, **s3.env, **host.environment(services)}
        log = (tmp_path / f"worker-{len(hosts)}-{host.name}.log").open("w")
        workers.append(subprocess.Popen(
            [*host.wrap(), sys.executable, "-m", "celery", "-A", "evalsite", "worker",
             "-c", str(args.concurrency), "--loglevel=WARNING", "--without-gossip", "--without-mingle",
             "-n", f"{host.name}@%h"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
        ))  # fmt: skip
    try:
        time.sleep(5)  # connected before the clock starts
        options = LaunchOptions(repeats=args.trials, max_parallel=2 * args.concurrency, keep_artifacts=True)
        started = time.time()
        run = launch_run(experiment, options=options)
        while not Run.objects.get(pk=run.pk).is_final:
            if time.time() - started > 600:
                sys.exit(f"{len(hosts)} host(s): the run did not end in 600 s (logs in {tmp_path})")
            time.sleep(0.1)
        elapsed = time.time() - started
    finally:
        for worker in workers:
            os.killpg(worker.pid, 9)
            worker.wait()
    return elapsed, Trial.objects.filter(run=run, status="passed").count()


if __name__ == "__main__":
    main()
