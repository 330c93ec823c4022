"""The gateway room: the one way out of a trial's sandbox, and the worker's own model calls.

- `proxy`: the per-trial model gateway (a reverse proxy on a unix socket: keys in, usage
  counted, budgets enforced, CONNECT only to allowed hosts);
- `providers`: the provider table as the gateway uses it (real keys and endpoints in,
  placeholders and the gateway's URLs out);
- `roles`: the answerer's and the judge's calls, each through a gateway of its own;
- `forwarder.c`: the small program started in a sandbox in front of the agent, which carries
  its loopback connections to the gateway's socket (built here once per host).

Usage, budgets and prices are `runs_app.engine.usage`, below this room and the agents. No Django.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from runs_app.engine import native
from runs_app.engine.gateway.providers import (
    PLACEHOLDER_KEY,
    SANDBOX_PORT,
    SANDBOX_URL,
    ProviderError,
    Upstream,
    role_upstream,
    sandbox_variables,
    upstream,
    worker_variables,
)
from runs_app.engine.gateway.proxy import Call, Gateway, socket_path_for, wrap_command

__all__ = [
    "PLACEHOLDER_KEY",
    "SANDBOX_PORT",
    "SANDBOX_URL",
    "Call",
    "Gateway",
    "ProviderError",
    "Upstream",
    "forwarder",
    "role_upstream",
    "sandbox_variables",
    "socket_path_for",
    "upstream",
    "worker_variables",
    "wrap_command",
]

_FORWARDER_SOURCE = Path(__file__).with_name("forwarder.c")
_FORWARDERS: dict[tuple[Path, bool], Path] = {}
_LOCK = threading.Lock()


def forwarder(root: Path, *, static: bool = False) -> Path:
    """The forwarder (`forwarder.c`), built once per host into `root` (the sandbox root, which
    every sandbox uid can reach; a checkout in a 0700 home is not) under a name that changes
    with its source. `static`: linked statically, for containers, whose images may have no C
    library or another one."""
    with _LOCK:
        key = (root, static)
        if key not in _FORWARDERS:
            digest = hashlib.sha256(_FORWARDER_SOURCE.read_bytes()).hexdigest()[:12]
            name = f"evalsite-forward-{'static-' if static else ''}{digest}"
            target = root / "bin" / name
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                os.chmod(target.parent, 0o711)
                native.compile_c(_FORWARDER_SOURCE, target, "gcc (and libc6-dev)", static=static)
                os.chmod(target, 0o755)
            _FORWARDERS[key] = target
        return _FORWARDERS[key]
