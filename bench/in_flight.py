"""Agents in flight per worker host: trials whose agent sleeps (1 s, or `--agent-seconds`), run by
worker processes that supervise many trials each in threads (WORKER_SLOTS).

Usage: .venv/bin/python bench/in_flight.py [SLOTS ...] [--processes P] [--rounds R] [--agent-seconds S]
       (default: 64 128 256, one process, 4 rounds: SLOTS x R trials, agents of 1 s)
Embedded default (scratch SQLite + filesystem broker) unless DATABASE_URL / CELERY_BROKER_URL
are set (then they must point at scratch services). Prints, per setting:
- throughput: trials finished per second between the first and the last quarter of the run,
  against the ideal (every slot busy: P x SLOTS / agent seconds per second);
- the peak RSS of the worker processes (the harness), and of everything in their process
  groups (the harness plus the agents' bwrap, sh and sleep);
- the host's CPU per trial over the same window (every process: harness, database, broker,
  sandboxes; from /proc/stat), and the throughput that CPU allows on this host's cores: what
  the agents' time leaves to the host, whatever the slots, is cores / CPU per trial.
Targets (issue 13): 256 in flight on one host at >= 90% of ideal and <= 1.5 GB worker RSS;
512 on two worker processes.
"""

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TASK = """task_id: sleepy
initial_prompt: wait
sandbox: {python: null}
success_criteria:
  - {type: file_exists, path: done.txt}
"""
EXPERIMENT = """experiment_id: in-flight
variants:
  - variant_id: sleeper
    agent: {type: command, command: "sleep SECONDS && echo ok > done.txt"}
"""


def tree_rss(roots: set[int]) -> tuple[int, int]:
    """(RSS of the worker processes, RSS of them and all their descendants: the agents' bwrap,
    sh and sleep), in KB. One read of /proc/PID/stat a process (parent and RSS are both there):
    with 256 agents in flight the host has some 1,500 processes."""
    parent, rss = {}, {}
    page_kb = os.sysconf("SC_PAGE_SIZE") // 1024
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()
                parent[int(name)], rss[int(name)] = int(fields[1]), int(fields[21]) * page_kb
            except (OSError, ValueError, IndexError):
                continue
    harness = everything = 0
    for pid in parent:
        ancestor, inside = pid, False
        while ancestor > 1:
            if ancestor in roots:
                inside = True
                break
            ancestor = parent.get(ancestor, 0)
        if not inside:
            continue
        everything += rss[pid]
        if pid in roots or (parent.get(pid) in roots and b"celery" in _cmdline(pid)):
            harness += rss[pid]
    return harness, everything


def cpu_seconds() -> tuple[float, float]:
    """(busy, stolen) CPU seconds of the whole host since boot, from /proc/stat, less this
    bench's own (its sampling walks /proc)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    tick = os.sysconf("SC_CLK_TCK")
    own = resource.getrusage(resource.RUSAGE_SELF)
    return (user + nice + system + irq + softirq) / tick - own.ru_utime - own.ru_stime, steal / tick


def _at(samples: list[tuple[float, float, float]], moment: float) -> tuple[float, float]:
    """The (busy, stolen) CPU reading nearest to `moment`."""
    nearest = min(samples, key=lambda sample: abs(sample[0] - moment))
    return nearest[1], nearest[2]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("slots", nargs="*", type=int, default=[64, 128, 256])
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--agent-seconds", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=600.0, help="give up on a setting after this long")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="evalsite-inflight-") as tmp:
        tmp_path = Path(tmp)
        if not os.environ.get("DATABASE_URL"):
            os.environ["SQLITE_PATH"] = str(tmp_path / "bench.sqlite3")
        if not os.environ.get("CELERY_BROKER_URL"):
            os.environ["BROKER_DIR"] = str(tmp_path / "broker")
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")
        import django

        django.setup()
        from django.core.management import call_command

        from evalsite.celery import app
        from experiments_app.definitions import import_experiment, import_tasks
        from runs_app.launching import LaunchOptions, launch_run
        from runs_app.models import Run, Trial

        call_command("migrate", verbosity=0)
        (tmp_path / "suite" / "tasks" / "sleepy").mkdir(parents=True)
        (tmp_path / "suite" / "tasks" / "sleepy" / "task.yaml").write_text(TASK)
        (tmp_path / "suite" / "exp.yaml").write_text(EXPERIMENT.replace("SECONDS", f"{args.agent_seconds:g}"))
        import_tasks([tmp_path / "suite" / "tasks"])
        experiment = import_experiment(tmp_path / "suite" / "exp.yaml").experiment
        database = "PostgreSQL" if os.environ.get("DATABASE_URL") else "SQLite"
        broker = "Redis/RabbitMQ" if os.environ.get("CELERY_BROKER_URL") else "filesystem"
        print(f"in-flight bench: {database} + {broker} broker, {args.processes} worker process(es)")
        for slots in args.slots:
            app.control.purge()
            workers = []
            for i in range(args.processes):
                log = (tmp_path / f"worker-{slots}-{i}.log").open("w")
                workers.append(subprocess.Popen(
                    [sys.executable, "-m", "celery", "-A", "evalsite", "worker", "-c", str(slots),
                     "--loglevel=WARNING", "--without-gossip", "--without-mingle", "-n", f"w{slots}-{i}@%h"],
                    cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    env={**os.environ, "WORKER_SLOTS": str(slots)},
                ))  # fmt: skip
            groups = {w.pid for w in workers}
            peak = [0, 0]
            cpu: list[tuple[float, float, float]] = []
            stop = threading.Event()

            def sample(stop=stop, peak=peak, groups=groups, cpu=cpu) -> None:
                while not stop.wait(1.0):  # walking /proc costs CPU too: not more often
                    cpu.append((time.time(), *cpu_seconds()))
                    harness, everything = tree_rss(groups)
                    peak[0], peak[1] = max(peak[0], harness), max(peak[1], everything)

            sampler = threading.Thread(target=sample, daemon=True)
            try:
                time.sleep(4)  # connect before the clock starts
                sampler.start()
                n = slots * args.processes * args.rounds
                options = LaunchOptions(repeats=n, max_parallel=slots * args.processes)
                started = time.time()
                run = launch_run(experiment, options=options)
                while not Run.objects.get(pk=run.pk).is_final:
                    if time.time() - started > args.timeout:
                        done = Trial.objects.filter(run=run, status="passed").count()
                        sys.exit(f"slots {slots}: {done}/{n} passed after {args.timeout:.0f} s ({tmp_path})")
                    time.sleep(0.2)
                elapsed = time.time() - started
            finally:
                stop.set()
                for w in workers:
                    os.killpg(w.pid, 9)
                    w.wait()
            finished = sorted(
                t.timestamp() for t in Trial.objects.filter(run=run).values_list("finished_at", flat=True)
            )
            passed = Trial.objects.filter(run=run, status="passed").count()
            others = Counter(
                Trial.objects.filter(run=run).exclude(status="passed").values_list("status", "error_message")
            )
            for (status, message), count in others.most_common(5):
                print(f"  {count} {status}: {message[:300]}")
            first, last = len(finished) // 4, 3 * len(finished) // 4
            lo, hi = finished[first], finished[last]
            middle = (last - first) / (hi - lo) if hi > lo else 0.0
            ideal = slots * args.processes / args.agent_seconds
            agents_alone = args.rounds * args.agent_seconds
            print(
                f"slots {slots} x {args.processes}: {passed}/{n} passed in {elapsed:.1f} s "
                f"(the agents alone: {agents_alone:.0f} s); "
                f"throughput {middle:.1f} trials/s of ideal {ideal:.1f} ({100 * middle / ideal:.0f}%); "
                f"peak RSS worker {peak[0] / 1024:.0f} MB, with agents {peak[1] / 1024:.0f} MB"
            )
            if hi > lo and cpu:
                (busy_lo, stolen_lo), (busy_hi, stolen_hi) = _at(cpu, lo), _at(cpu, hi)
                per_trial = (busy_hi - busy_lo) / (last - first)
                host_cores = os.cpu_count()
                cores = host_cores - (stolen_hi - stolen_lo) / (hi - lo)  # what the hypervisor left
                ceiling = cores / per_trial if per_trial > 0 else float("inf")
                print(
                    f"  host CPU {1000 * per_trial:.1f} ms per trial (all processes), "
                    f"{100 * (busy_hi - busy_lo) / (hi - lo) / host_cores:.0f}% of "
                    f"{host_cores} cores busy, {stolen_hi - stolen_lo:.1f} s stolen: this host's CPU "
                    f"allows {ceiling:.1f} trials/s; throughput is "
                    f"{100 * middle / min(ideal, ceiling):.0f}% of min(ideal, CPU ceiling)"
                )


if __name__ == "__main__":
    main()
