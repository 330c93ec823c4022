"""The container driver (`runs_app.engine.sandbox.docker`) against a real engine: its contract,
its limits, its mounts per phase, and hostile commands trying to leave the container.

Skipped, saying why, where no engine answers (CI: `make test` starts dockerd) or the worker is
not root. The test image is made offline from Debian's static busybox (busybox-static).
"""

import contextlib
import http.server
import json
import os
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from runs_app.engine.sandbox import DiskCap, Limits, Mount, Resources, SandboxError, discard, open_sandbox
from runs_app.engine.sandbox import docker as driver
from runs_app.engine.sandbox.docker import command

pytestmark = pytest.mark.timeout(120)

IMAGE = "evalsite/sandbox-test:busybox"
VOLUME_IMAGE = "evalsite/sandbox-test:volume"
HOSTILE = Path(__file__).parents[1] / "hostile"
FORWARDER_SOURCE = Path(__file__).parents[2] / "engine" / "gateway" / "forwarder.c"
BUSYBOX = Path("/bin/busybox")
QUICK = Limits(wall_seconds=20)


def docker(*args: str, check: bool = True, data: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [command.docker_binary(), *args],
        input=data,
        capture_output=True,
        env=command.client_env(),
        check=check,
    )


@pytest.fixture(scope="session")
def engine():
    problem = driver.unavailable()
    if problem:
        pytest.skip(problem)


@pytest.fixture(scope="session")
def image(engine):
    """A busybox image with root, agent (1000) and nobody, /app, and no /etc/shadow."""
    if docker("image", "inspect", IMAGE, check=False).returncode == 0:
        return IMAGE
    with tempfile.TemporaryDirectory() as scratch:
        busybox = static_busybox(Path(scratch) / "busybox")
        return _import_test_images(busybox)


def _is_static(binary: Path) -> bool:
    ldd = subprocess.run(["ldd", str(binary)], capture_output=True)
    return b"not a dynamic executable" in ldd.stdout + ldd.stderr


def static_busybox(into: Path) -> Path:
    """The host's static busybox, else the one in `make containers`' evalsite/busybox image."""
    if BUSYBOX.exists() and _is_static(BUSYBOX):
        return BUSYBOX
    made = docker("create", "evalsite/busybox", check=False)
    if made.returncode == 0:
        container = made.stdout.decode().strip()
        docker("cp", "-L", f"{container}:/bin/busybox", str(into), check=False)
        docker("rm", "-f", container, check=False)
        if into.exists() and _is_static(into):
            return into
    why = "no static busybox to make the test image from (make containers, or apt-get install busybox-static)"
    if os.environ.get("EVALSITE_REQUIRE_CONTAINERS"):
        pytest.fail(why + " (EVALSITE_REQUIRE_CONTAINERS is set)")
    pytest.skip(why)


def _import_test_images(busybox: Path) -> str:
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for name in (
            "bin",
            "etc",
            "tmp",
            "root",
            "home/agent",
            "app",
            "proc",
            "sys",
            "dev",
            "var/tmp",
            "mnt",
        ):
            (folder / name).mkdir(parents=True)
        shutil.copy2(busybox, folder / "bin" / "busybox")
        applets = subprocess.run(
            [str(busybox), "--list"], capture_output=True, text=True, check=True
        ).stdout.split()
        for applet in applets:
            if applet != "busybox":
                (folder / "bin" / applet).symlink_to("busybox")
        (folder / "etc" / "passwd").write_text(
            "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/home/agent:/bin/sh\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
        )
        (folder / "etc" / "group").write_text("root:x:0:\nagent:x:1000:\nnogroup:x:65534:\n")
        (folder / "app" / "README").write_text("from the image\n")
        for dirpath, _, filenames in os.walk(folder):  # whatever the test process's umask
            os.chmod(dirpath, 0o755)
            for name in filenames:
                if not os.path.islink(os.path.join(dirpath, name)):
                    os.chmod(os.path.join(dirpath, name), 0o755 if name == "busybox" else 0o644)
        os.chmod(folder / "tmp", 0o1777)
        os.chown(folder / "home" / "agent", 1000, 1000)
        archive = subprocess.run(["tar", "-C", scratch, "-c", "."], capture_output=True, check=True).stdout
    docker("import", "-c", "ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin", "-", IMAGE, data=archive)
    docker("import", "-c", "VOLUME /data", "-", VOLUME_IMAGE, data=archive)
    return IMAGE


@pytest.fixture
def base():
    # Not under /tmp: the container's own /tmp would hide it. The task files the tests make are
    # readable by all, as the engine's bundles are, whatever this process's umask.
    folder = Path(tempfile.mkdtemp(prefix="evalsite-container-test-", dir="/var/tmp"))
    os.chmod(folder, 0o711)
    umask = os.umask(0o022)
    yield folder
    os.umask(umask)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def boxes(image, base):
    """open(**options): a started container sandbox (HOME shared, as the engine does);
    all are cleaned up at the end."""
    opened = []

    def open_box(name="trial", **options):
        options.setdefault("image", image)
        options.setdefault("resources", Resources(memory_bytes=256 << 20, cpus=1, pids=128))
        box = open_sandbox("docker", base / name, stage_root=base / "runtimes", **options)
        opened.append(box)
        paths = box.start()
        box.shared.insert(0, Mount(paths.home, writable=True))
        return box

    yield open_box
    for box in opened:
        box.cleanup()


def run(box, command_line, **options):
    options.setdefault("limits", QUICK)
    return box.exec(command_line, **options)


def container_processes(box) -> set[int]:
    return box.cgroup.processes()


def command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


# --- the contract ----------------------------------------------------------------------------------


def test_it_runs_commands_with_exit_codes_env_and_stdin(boxes):
    box = boxes()
    assert run(box, "exit 3").exit_code == 3
    result = run(
        box, ["/bin/sh", "-c", 'echo "$GREETING" "$HOME" "$TMPDIR"; pwd'], env={"GREETING": "hi\nthere"}
    )
    assert result.exit_code == 0
    assert result.stdout.split() == ["hi", "there", str(box.paths.home), "/tmp", str(box.paths.workspace)]
    assert run(box, "tr a-z A-Z", stdin=b"from stdin").stdout == "FROM STDIN"
    assert run(box, "cat").stdout == ""  # no stdin given: end of file at once
    missing = run(box, ["/no/such/program"])
    assert missing.exit_code in (126, 127) and "no/such/program" in missing.stderr


def test_it_passes_no_worker_variable_and_keeps_the_images(boxes, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/nonexistent.so")
    box = boxes(env={"TRIAL": "7"})
    env = dict(line.split("=", 1) for line in run(box, "env").stdout.splitlines() if "=" in line)
    assert env["TRIAL"] == "7" and env["PATH"] == "/usr/sbin:/usr/bin:/sbin:/bin"
    assert "LD_PRELOAD" not in env and "EVALSITE_SANDBOX_ID" not in env
    # A task's variable meant for the image never steers the worker's client.
    result = run(box, "echo ok", env={"DOCKER_HOST": "tcp://192.0.2.1:2375", "LD_PRELOAD": "/x.so"})
    assert result.exit_code == 0 and result.stdout == "ok\n"


def test_it_captures_output_with_caps_and_lines(boxes):
    box = boxes()
    lines = []
    limits = Limits(wall_seconds=20, stdout_cap_bytes=1000, stderr_cap_bytes=100)
    result = box.exec("seq 1 2000; seq 1 500 >&2", limits=limits, on_stdout_line=lines.append)
    assert result.stdout_truncated and len(result.stdout) == 1000 and result.stdout_total_bytes > 8000
    assert result.stderr_truncated and len(result.stderr) == 100
    assert lines[0] == "1" and lines[-1] == "2000" and len(lines) == 2000


def test_the_wall_clock_kills_the_process_inside_the_container(boxes):
    box = boxes()
    started = time.monotonic()
    result = box.exec(
        "sleep 300 & echo $! > bg.pid; exec sleep 301", limits=Limits(wall_seconds=1, kill_grace_seconds=1)
    )
    assert result.timed_out and result.exit_code is None
    assert time.monotonic() - started < 5
    assert container_processes(box) == set()
    assert "sleep" not in run(box, "ps -o comm").stdout


def test_a_process_ignoring_sigterm_gets_sigkill_after_the_grace(boxes):
    box = boxes()
    limits = Limits(wall_seconds=1, kill_grace_seconds=0.5)
    result = box.exec("trap '' TERM; while :; do sleep 1; done", limits=limits)
    assert result.timed_out and result.killed
    assert container_processes(box) == set()


def test_should_stop_stops_the_command_inside(boxes):
    box = boxes()
    deadline = time.monotonic() + 0.5
    result = box.exec(
        "sleep 300", limits=QUICK, should_stop=lambda: "cancelled" if time.monotonic() > deadline else None,
        poll_interval=0.1,
    )  # fmt: skip
    assert result.cancelled and result.stop_reason == "cancelled" and result.duration_seconds < 5
    assert container_processes(box) == set()


def test_what_a_command_leaves_running_is_killed_when_it_ends(boxes):
    box = boxes()
    script = "setsid sh -c 'exec sleep 30' >/dev/null 2>&1 & setsid sleep 31 >/dev/null 2>&1 & echo started"
    result = run(box, script)
    assert result.exit_code == 0 and "started" in result.stdout
    assert result.leftovers_killed == 2
    assert container_processes(box) == set()
    box.stop()  # nothing left: a no-op
    assert run(box, "echo still here").stdout == "still here\n"


def test_stop_kills_what_runs_in_the_container(boxes):
    box = boxes()
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(result=run(box, "sleep 300")))
    thread.start()
    deadline = time.monotonic() + 10
    # The sleep itself, not the exec on its way to it (a stop then ends the exec before it runs).
    while (
        not any(command_name(pid) == "sleep" for pid in container_processes(box))
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    box.stop()
    thread.join(10)
    assert outcome["result"].signal == 9 or outcome["result"].exit_code == 137


# --- limits ----------------------------------------------------------------------------------------


def test_the_memory_cap_ends_a_balloon_with_an_oom_kill(boxes):
    box = boxes(resources=Resources(memory_bytes=64 << 20, pids=64))
    result = run(box, "dd if=/dev/zero of=/dev/null bs=200M count=1")
    assert result.signal == 9 and result.memory_exhausted
    assert not run(box, "true").memory_exhausted


def test_a_phase_may_ask_for_less_memory_than_the_trial(boxes):
    box = boxes(resources=Resources(memory_bytes=256 << 20))
    balloon = "dd if=/dev/zero of=/dev/null bs=100M count=1"
    lower = run(box, balloon, limits=Limits(wall_seconds=20, memory_bytes=48 << 20))
    assert lower.signal == 9 and lower.memory_exhausted
    assert run(box, balloon).exit_code == 0  # the trial's cap is back


def test_the_pids_cap_holds_inside(boxes):
    box = boxes(resources=Resources(memory_bytes=256 << 20, pids=40))
    spawn = "i=0; while [ $i -lt {n} ]; do sleep 30 & i=$((i+1)); done; echo all"
    result = run(box, spawn.format(n=100))  # the shell ends at the first fork refused
    assert "can't fork" in result.stderr and result.stdout == ""
    assert result.leftovers_killed == 40 - 2  # its PID 1 and the shell
    assert container_processes(box) == set()
    # A phase's lower cap (grading's 256 under the agent's 512) holds for that command only.
    assert (
        run(box, spawn.format(n=30), limits=Limits(wall_seconds=20, max_processes=10)).leftovers_killed == 8
    )
    assert run(box, spawn.format(n=30)).stdout == "all\n"


def test_rlimits_of_the_phase_are_set_inside(boxes):
    box = boxes()
    limits = Limits(wall_seconds=20, cpu_seconds=7, max_file_bytes=1 << 20)
    result = box.exec("ulimit -t; ulimit -f; ulimit -c; ulimit -n", limits=limits)
    assert result.stdout.split() == ["7", "2048", "0", "20000"]


def test_the_network_is_loopback_only(boxes):
    box = boxes()
    interfaces = [
        line.split(":")[0].strip() for line in run(box, "cat /proc/net/dev").stdout.splitlines()[2:]
    ]
    assert interfaces == ["lo"]


def test_the_system_is_read_only_and_the_workspace_writable_by_its_user(boxes):
    box = boxes()
    assert "Read-only file system" in run(box, "touch /etc/x /usr/x /x").stderr
    box.write_file("given/by-host.txt", b"from the host\n")
    result = run(box, "cat given/by-host.txt; echo made > made.txt; mkdir -p d && echo y > d/y; id -u")
    assert result.stdout.splitlines()[0] == "from the host"
    uid = int(result.stdout.split()[-1])
    assert uid != 0  # the leased uid (inside; shifted outside when the engine remaps)
    made = box.paths.workspace / "made.txt"
    assert made.read_text() == "made\n" and made.stat().st_uid == box.paths.uid
    assert box.read_file("d/y") == b"y\n"


def test_a_named_user_of_the_image_owns_the_folders(boxes):
    box = boxes(user="agent")
    result = run(box, "id -un; id -u; touch ok")
    assert result.stdout.splitlines()[0] == "agent"
    assert result.stdout.splitlines()[1] == "1000"
    assert (box.paths.workspace / "ok").stat().st_uid == box.paths.uid  # 1000, shifted if remapped


def test_the_workdir_may_be_another_path_than_the_host_folder(boxes):
    box = boxes(workdir="/workspace")
    box.write_file("f.txt", b"x")
    assert run(box, "pwd; cat f.txt").stdout == "/workspace\nx"
    assert box.command_path(box.paths.workspace / "sub") == Path("/workspace/sub")


def test_capabilities_are_none_for_a_user_and_few_for_root(boxes):
    user = boxes("user")
    assert "CapEff:\t0000000000000000" in run(user, "grep CapEff /proc/self/status").stdout
    root = boxes("root", user="root")
    effective = int(run(root, "grep CapEff /proc/self/status").stdout.split()[1], 16)
    # CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, FSETID 4, SETGID 6, SETUID 7, NET_BIND_SERVICE 10
    assert effective == sum(1 << bit for bit in (0, 1, 3, 4, 6, 7, 10))
    assert "no_new_privs" not in run(root, "true").stderr
    assert run(root, "grep NoNewPrivs /proc/self/status").stdout.split()[1] == "1"
    assert run(root, "grep Seccomp: /proc/self/status").stdout.split()[1] == "2"


def test_root_inside_is_not_root_outside_when_the_engine_remaps(boxes):
    box = boxes(user="root")
    host_uid = driver.cgroup.host_identity(box.cgroup.init_pid)[0]
    if not driver.cgroup.remapped(box.cgroup.init_pid):
        pytest.skip(
            "the engine runs without userns-remap: root inside is uid 0 outside, without capabilities"
        )
    assert host_uid != 0
    assert run(box, "echo x > owned; id -u").stdout.strip() == "0"
    assert (box.paths.workspace / "owned").stat().st_uid == host_uid


def test_a_unix_socket_mounted_in_answers_http(boxes, base):
    forwarder = base / "bin" / "forward"
    forwarder.parent.mkdir(mode=0o755)
    built = subprocess.run(
        ["cc", "-static", "-O2", "-o", str(forwarder), str(FORWARDER_SOURCE)], capture_output=True
    )
    if built.returncode != 0:
        pytest.skip(f"cannot build the forwarder statically: {built.stderr.decode()[:200]}")
    box = boxes()
    path = box.paths.root / "gateway.sock"

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"from the gateway"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

        def get_request(self):
            request, _ = super().get_request()
            return request, ("sandbox", 0)

    server = Server(str(path), Answer)
    os.chmod(path, 0o600)  # root's: the driver gives it to the container's user
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        argv = [str(forwarder), "8765", str(path), "--", "wget", "-qO-", "http://127.0.0.1:8765/v1"]
        result = run(box, argv, mounts=[Mount(path), Mount(forwarder)])
        assert result.stdout == "from the gateway", result.stderr
        assert run(box, f"test -e {path} || echo gone").stdout == "gone\n"  # that command's mount only
    finally:
        server.shutdown()
        server.server_close()


# --- mounts per phase ------------------------------------------------------------------------------


def test_a_phase_sees_its_mounts_and_only_for_its_command(boxes, base):
    task = base / "bundles" / "abc"
    (task / "reference").mkdir(parents=True)
    (task / "task.yaml").write_text("task\n")
    (task / "reference" / "answer.txt").write_text("the answer\n")
    os.chmod(base / "bundles", 0o711)
    box = boxes()
    assert "No such file" in run(box, f"cat {task}/task.yaml").stderr  # the agent's phase
    grading = [Mount(task), Mount(task / "reference", hidden=True)]
    result = run(box, f"cat {task}/task.yaml; ls -A {task}/reference; echo x > {task}/new", mounts=grading)
    assert result.stdout == "task\n" and "Read-only file system" in result.stderr
    named = run(
        box,
        f"cat {task}/reference/answer.txt; echo x > mine",
        mounts=[Mount(task), Mount(box.paths.workspace)],
    )
    assert named.stdout == "the answer\n" and "Read-only file system" in named.stderr
    assert run(box, "echo x > mine && cat mine").stdout == "x\n"  # writable again
    assert "No such file" in run(box, f"ls {task}").stderr


def test_a_grading_command_gets_an_empty_home_and_tmp(boxes):
    box = boxes()
    run(box, 'echo agent > "$HOME/left"; echo agent > /tmp/left')
    fresh = run(box, 'echo $HOME; ls -A "$HOME" /tmp; touch /tmp/own', fresh_home=True)
    assert fresh.stdout.split()[0] != str(box.paths.home) and "left" not in fresh.stdout
    assert run(box, 'cat "$HOME/left" /tmp/left; ls /tmp').stdout.split() == ["agent", "agent", "left"]


def test_a_mount_onto_the_venv_replaces_it_for_grading(boxes, base):
    venv = base / "grading-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "marker").write_text("task's venv\n")
    box = boxes()
    run(box, "mkdir -p .venv/bin && echo agent > .venv/bin/marker")
    target = box.paths.workspace / ".venv"
    assert run(box, "cat .venv/bin/marker", mounts=[Mount(target, source=venv)]).stdout == "task's venv\n"
    assert run(box, "cat .venv/bin/marker").stdout == "agent\n"


def test_a_link_on_a_mounts_way_is_refused_and_mounts_nothing_on_the_host(boxes, base):
    box = boxes()
    run(box, "ln -s /etc .venv")
    before = Path("/etc/hostname").read_bytes()
    with pytest.raises(SandboxError, match="symbolic link"):
        run(box, "true", mounts=[Mount(box.paths.workspace / ".venv", hidden=True)])
    assert Path("/etc/hostname").read_bytes() == before and not os.path.ismount("/etc")
    assert run(box, "echo fine").stdout == "fine\n"


def test_a_mount_outside_the_roots_is_refused_naming_the_fix(boxes):
    box = boxes()
    with pytest.raises(SandboxError, match="mount_roots"):
        run(box, "true", mounts=[Mount(Path("/opt/elsewhere"))])


def test_mount_roots_take_a_phases_folder_at_a_path_of_the_image(boxes, base):
    tests = base / "task-tests"
    tests.mkdir()
    (tests / "test.sh").write_text("echo verified\n")
    box = boxes(mount_roots=["/tests"])
    assert run(box, "ls -A /tests").stdout == ""
    assert run(box, "sh /tests/test.sh", mounts=[Mount(Path("/tests"), source=tests)]).stdout == "verified\n"


# --- the image's own folder ------------------------------------------------------------------------


def test_the_workspace_may_be_the_images_own_folder(boxes):
    box = boxes(user="root", workdir="/app", in_image=True)
    assert box.read_file("README") == b"from the image\n"
    box.write_file("src/new/given.txt", b"given\n")
    result = run(
        box, "pwd; cat src/new/given.txt; ls -ln src/new; echo changed >> README; ln -s /etc/passwd leak"
    )
    assert result.stdout.startswith("/app\ngiven\n")
    with pytest.raises(SandboxError):
        box.read_file("leak")  # a link leaving the folder
    mirror = box.pull_workspace()
    assert (mirror / "README").read_text() == "from the image\nchanged\n"
    assert (mirror / "src" / "new" / "given.txt").read_text() == "given\n"
    assert (mirror / "leak").is_symlink()
    run(box, "echo x > /usr/bin/installed-by-the-agent")  # root's own layer is writable


def test_the_images_layer_counts_against_the_disk_cap(boxes, monkeypatch):
    monkeypatch.setattr(driver.filesystem, "WALK_EVERY_SECONDS", 0.0)
    box = boxes(user="root", workdir="/app", in_image=True, disk=DiskCap(8 << 20, 1000))
    assert not box.disk_exceeded()
    run(box, "dd if=/dev/zero of=/app/big bs=1M count=10")
    assert box.disk_exceeded()


def test_the_workspace_holds_the_disk_cap(boxes):
    box = boxes(disk=DiskCap(4 << 20, 1000))
    result = run(box, "dd if=/dev/zero of=big bs=1M count=8")
    assert "No space left" in result.stderr and box.disk_exceeded()


# --- cleanup and reap ------------------------------------------------------------------------------


def test_cleanup_removes_the_container_and_its_volumes(image, boxes):
    box = boxes(image=VOLUME_IMAGE)
    volumes = [
        mount["Name"]
        for mount in json.loads(docker("inspect", box.name).stdout)[0]["Mounts"]
        if mount["Type"] == "volume"
    ]
    assert volumes
    box.cleanup()
    box.cleanup()  # idempotent
    assert docker("inspect", box.name, check=False).returncode != 0
    assert all(docker("volume", "inspect", name, check=False).returncode != 0 for name in volumes)
    assert not box.root.exists()


def test_reap_removes_what_a_dead_worker_left(image, base):
    code = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).parents[3])!r})
from pathlib import Path
from runs_app.engine.sandbox import Limits, open_sandbox
box = open_sandbox("docker", Path({str(base / "orphan")!r}), stage_root=None, image={image!r})
box.start()
box.exec("sleep 300 &", limits=Limits(wall_seconds=5))
print(box.name, flush=True)
os._exit(0)
"""
    left = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    name = left.stdout.strip()
    assert name, left.stderr
    found = {leftover.name: leftover for leftover in driver.containers()}
    assert found[name].root == base / "orphan" and found[name].running
    assert name in driver.reap()
    assert docker("inspect", name, check=False).returncode != 0
    discard(base / "orphan")
    assert not (base / "orphan").exists()


def test_discard_removes_a_trial_folders_container(boxes):
    box = boxes("kept")
    discard(box.paths.root)
    assert docker("inspect", box.name, check=False).returncode != 0
    assert not box.root.exists()


def test_it_reads_what_the_image_says_of_itself(image):
    config = driver.image_config(image)
    assert (config.user, config.workdir) == ("", "")
    assert config.env["PATH"] == "/usr/sbin:/usr/bin:/sbin:/bin"


def test_it_says_which_image_is_missing(engine, base):
    box = open_sandbox("docker", base / "none", stage_root=None, image="evalsite/no-such-image:1")
    with pytest.raises(SandboxError, match="no-such-image"):
        box.start()
    assert not (base / "none").exists()


# --- hostile commands ------------------------------------------------------------------------------


@pytest.fixture
def listener():
    """A host service on every address (what the bridge would reach); counts connections."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 0))
    server.listen()
    accepted = []

    def serve():
        with contextlib.suppress(OSError):
            while True:
                connection, peer = server.accept()
                accepted.append(peer)
                connection.close()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1], accepted
    server.close()


@pytest.mark.parametrize(
    "user,in_image",
    [(None, False), ("root", False), ("root", True)],
    ids=["leased-uid", "root", "root-in-the-image"],
)
def test_hostile_commands_cannot_leave_the_container(boxes, base, listener, user, in_image):
    port, accepted = listener
    canary = base / "canary"
    canary.write_text("host secret\n")
    other = boxes("other")
    marker = f"31{os.getpid()}"
    neighbour = threading.Thread(target=lambda: run(other, f"sleep {marker}", limits=Limits(wall_seconds=8)))
    neighbour.start()
    box = boxes("attacker", user=user, in_image=in_image, workdir="/app" if in_image else None)
    script = (HOSTILE / "container_escape.sh").read_text()
    result = run(box, ["/bin/sh", "-c", script, "escape", str(port), str(canary), str(other.paths.workspace)],
                 env={"MARKER": marker})  # fmt: skip
    other.stop()
    neighbour.join(10)
    lines = result.stdout.splitlines()
    assert lines[-1] == "done", result.stderr
    escaped = [line for line in lines if not line.startswith("blocked") and line != "done"]
    # Root working in the image writes its own layer (the image is the task's system).
    assert escaped == (["ESCAPED write-system: /etc/escape"] if in_image else [])
    assert len(lines) == 16  # 15 attempts, then "done"
    assert accepted == []
    assert not Path("/etc/escape").exists()


def test_a_memory_balloon_cannot_take_the_host(boxes):
    box = boxes(resources=Resources(memory_bytes=96 << 20, pids=64))
    result = run(box, "x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo ${#x}")
    assert result.exit_code != 0 and result.memory_exhausted


def test_its_pid_1_ends_the_container_on_sigterm(boxes):
    box = boxes()
    os.kill(box.cgroup.init_pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while (
        json.loads(docker("inspect", box.name).stdout)[0]["State"]["Running"] and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert not json.loads(docker("inspect", box.name).stdout)[0]["State"]["Running"]


def test_pull_workspace_keeps_links_as_links_and_follows_none(boxes):
    box = boxes(user="root", workdir="/app", in_image=True)
    run(box, "ln -s ../../../../etc escape-dir; mkdir -p sub; ln -s /etc/passwd sub/abs")
    mirror = box.pull_workspace()
    assert (mirror / "escape-dir").is_symlink() and (mirror / "sub" / "abs").is_symlink()
    assert not Path("/etc/passwd").is_symlink()  # nothing was written through a link
