"""What the container driver adds to the engine's own cost: one trial's container life through
the driver against the same life done by hand with the client, in the same loop.

1. Driver: `ContainerSandbox.start()` (capped folders, the leased uid, the skeleton, `docker run`,
   `docker inspect`, the workspace, /tmp and HOME mounted), N `exec(["true"])` (each under the
   host's process control, its leftovers swept, its OOM count read), `cleanup()`.
2. Raw: `docker run -d --network none IMAGE sleep 3600`, N `docker exec NAME true`,
   `docker rm -f NAME`: the least any container driver pays.

The two alternate, trial by trial, so that the load of the machine weighs on both alike.
Usage: .venv/bin/python bench/container_driver.py [TRIALS] [EXECS] [--image IMAGE]
       (defaults 10 trials of 5 commands, image evalsite/busybox; root, dockerd running)
Target (issue 28): a container trial costs at most 1.2 times the raw one.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runs_app.engine.sandbox import DiskCap, Limits, Mount, Resources, open_sandbox  # noqa: E402
from runs_app.engine.sandbox.docker import command  # noqa: E402

LIMITS = Limits(wall_seconds=30)


def docker(*args: str) -> None:
    client = [command.docker_binary(), *args]
    subprocess.run(client, check=True, capture_output=True, env=command.client_env())


def driver_trial(base: Path, image: str, execs: int) -> tuple[float, float, float]:
    started = time.perf_counter()
    box = open_sandbox(
        "docker", base / f"trial-{uuid.uuid4().hex[:8]}", stage_root=base / "runtimes",
        disk=DiskCap(256 << 20, 10_000), image=image,
        resources=Resources(memory_bytes=512 << 20, cpus=1, pids=256),
    )  # fmt: skip
    paths = box.start()
    box.shared.insert(0, Mount(paths.home, writable=True))  # as the engine does
    ready = time.perf_counter()
    for _ in range(execs):
        result = box.exec(["true"], limits=LIMITS)
        assert result.exit_code == 0, result.stderr
    ran = time.perf_counter()
    box.cleanup()
    done = time.perf_counter()
    return ready - started, ran - ready, done - ran


def raw_trial(image: str, execs: int) -> tuple[float, float, float]:
    name = f"evalsite-bench-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    docker("run", "-d", "--network", "none", "--name", name, image, "sleep", "3600")
    ready = time.perf_counter()
    for _ in range(execs):
        docker("exec", name, "true")
    ran = time.perf_counter()
    docker("rm", "-f", name)
    done = time.perf_counter()
    return ready - started, ran - ready, done - ran


def summary(label: str, runs: list[tuple[float, float, float]], execs: int) -> float:
    total = statistics.median(sum(run) for run in runs)
    start, commands, cleanup = (statistics.median(run[i] for run in runs) for i in range(3))
    print(
        f"{label:>6}: {total * 1000:7.0f} ms a trial (median of {len(runs)}): start {start * 1000:5.0f} ms, "
        f"{execs} commands {commands * 1000:5.0f} ms ({commands / execs * 1000:4.0f} ms each), "
        f"cleanup {cleanup * 1000:4.0f} ms"
    )
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trials", nargs="?", type=int, default=10)
    parser.add_argument("execs", nargs="?", type=int, default=5)
    parser.add_argument("--image", default="evalsite/busybox")
    options = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("the container driver runs on root workers: run this as root")
    base = Path(tempfile.mkdtemp(prefix="evalsite-bench-containers-", dir="/var/tmp"))
    os.chmod(base, 0o711)
    driver_trial(base, options.image, 1)  # builds the static helper, warms the caches
    raw_trial(options.image, 1)
    driver_runs, raw_runs = [], []
    for _ in range(options.trials):
        driver_runs.append(driver_trial(base, options.image, options.execs))
        raw_runs.append(raw_trial(options.image, options.execs))
    driver = summary("driver", driver_runs, options.execs)
    raw = summary("raw", raw_runs, options.execs)
    print(f"driver / raw: {driver / raw:.2f} (target <= 1.2)")
    os.rmdir(base)


if __name__ == "__main__":
    main()
