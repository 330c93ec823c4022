"""Worker hosts on one machine, for tests and benches: each a network namespace with its own veth
link and address, reaching the services (PostgreSQL, Redis, S3) on the machine's loopback only
through a relay on its own link, and a mount namespace that hides the other hosts' folders.

Cutting a host's link (`NetnsHost.cut`) drops its traffic, as a pulled cable or a dead switch
port would: its connections hang, and nothing tells the services it went away.
"""

import asyncio
import contextlib
import os
import shlex
import shutil
import subprocess
import threading
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

# The per-host folders live beside the default sandbox root (0711, searchable by sandbox uids).
HOSTS_ROOT = Path("/var/tmp/evalsite-sandboxes")


def can_build_hosts() -> str | None:
    """Why network-namespace hosts cannot be built here (None when they can)."""
    if os.geteuid() != 0:
        return "building network namespaces needs root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing (Debian: iproute2, util-linux)"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Relay:
    """TCP forwarders, each from an address on a host's link to a port on the machine's loopback."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.servers: list[asyncio.base_events.Server] = []
        # Every relayed connection's two ends: closed with the relay, so that no session a killed
        # worker opened outlives the test (PostgreSQL would refuse to drop the test database).
        self.writers: set[asyncio.StreamWriter] = set()
        self.thread = threading.Thread(target=self.loop.run_forever, name="host-relay", daemon=True)
        self.thread.start()

    def forward(self, address: str, port: int, target_port: int) -> None:
        async def start():
            return await asyncio.start_server(
                lambda r, w: self._pipe_pair(r, w, target_port), address, port, reuse_address=True
            )

        self.servers.append(asyncio.run_coroutine_threadsafe(start(), self.loop).result(timeout=10))

    async def _pipe_pair(self, reader, writer, target_port: int) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            writer.close()
            return
        self.writers.update((writer, upstream_writer))
        try:
            await asyncio.gather(
                self._pipe(reader, upstream_writer),
                self._pipe(upstream_reader, writer),
                return_exceptions=True,
            )
        finally:
            self.writers.difference_update((writer, upstream_writer))

    @staticmethod
    async def _pipe(reader, writer) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def drop(self) -> None:
        """Stop forwarding and reset every relayed connection (the loop keeps running: `forward`
        again to restore)."""

        async def close():
            servers, self.servers = self.servers, []
            for server in servers:
                server.close()
                await server.wait_closed()
            for writer in list(self.writers):
                writer.transport.abort()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=10)

    def stop(self) -> None:
        async def close():
            for server in self.servers:
                server.close()
            for writer in list(self.writers):
                writer.transport.abort()
            await asyncio.sleep(0.1)  # the pipes see their ends closed and return
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class NetnsHost:
    """One worker host: a network namespace linked to the machine by a veth pair on its own /30,
    and its own folder (sandbox root, var folder) that the other hosts cannot see."""

    def __init__(self, name: str, index: int, session: str):
        self.name = name
        tag = f"{os.getpid() % 100000}{index}"
        self.netns = f"evalsite-{name}-{tag}"
        self.outer_link, self.inner_link = f"evo{tag}", f"evi{tag}"  # at most 15 characters
        octet = (os.getpid() * 2 + index) % 250 + 1
        self.gateway, self.address = f"10.213.{octet}.1", f"10.213.{octet}.2"
        # Short: a trial's unix socket path, under the sandbox root, has at most 100 bytes.
        self.root = HOSTS_ROOT / f"mh{session}" / name
        self.hidden: list[Path] = []

    def create(self) -> "NetnsHost":
        _ip("netns", "add", self.netns)
        _ip("link", "add", self.outer_link, "type", "veth", "peer", "name", self.inner_link)
        _ip("link", "set", self.inner_link, "netns", self.netns)
        _ip("addr", "add", f"{self.gateway}/30", "dev", self.outer_link)
        _ip("link", "set", self.outer_link, "up")
        inside = ("netns", "exec", self.netns, "ip")
        _ip(*inside, "addr", "add", f"{self.address}/30", "dev", self.inner_link)
        _ip(*inside, "link", "set", self.inner_link, "up")
        _ip(*inside, "link", "set", "lo", "up")
        _ip(*inside, "route", "add", "default", "via", self.gateway)
        for sub in ("var", "sbx", "media"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        # Sandbox uids pass through every folder down to a trial's (made 0700 by a umask of 077)
        for folder in (HOSTS_ROOT, self.root.parent, self.root, self.root / "sbx"):
            os.chmod(folder, 0o711)
        return self

    def cut(self) -> None:
        _ip("link", "set", self.outer_link, "down")

    def restore(self) -> None:
        _ip("link", "set", self.outer_link, "up")

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", self.netns)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", self.outer_link)  # gone with the namespace, normally
        shutil.rmtree(self.root, ignore_errors=True)

    def wrap(self) -> list[str]:
        """The command prefix that runs a program on this host: in its network namespace, in a
        private mount namespace where every folder in `hidden` is an empty tmpfs."""
        mounts = "".join(
            f"mount -t tmpfs -o size=1m,mode=0700 tmpfs {shlex.quote(str(p))} && " for p in self.hidden
        )
        script = f'{mounts}exec "$@"'
        return ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--propagation", "private", "--",
                "sh", "-c", script, "sh"]  # fmt: skip

    def service_url(self, url: str) -> str:
        """`url` (a service on 127.0.0.1) as this host reaches it: through its relay."""
        parts = urlsplit(url)
        netloc = parts.netloc.replace("127.0.0.1", self.gateway).replace("localhost", self.gateway)
        return urlunsplit(parts._replace(netloc=netloc))

    def environment(self, service_urls: dict[str, str]) -> dict[str, str]:
        """The settings that make a worker of this host: its name, its own folders, and the
        services through its link."""
        return {
            "EVALSITE_HOST": self.name,
            "EVALSITE_VAR_DIR": str(self.root / "var"),
            "SANDBOX_ROOT": str(self.root / "sbx"),
            "MEDIA_ROOT": str(self.root / "media"),
            **{name: self.service_url(url) for name, url in service_urls.items()},
        }
