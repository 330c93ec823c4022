"""The engine's small C programs (the sandbox's launcher, the gateway's forwarder), built on the
worker host with its C compiler. Pure Python, no Django."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


class BuildError(RuntimeError):
    """A C program of the engine could not be built here; the message says what to install."""


def compile_c(source: Path, target: Path, alternative: str, *, static: bool = False) -> None:
    """Build `source` into `target` with the system's compiler, atomically: a concurrent
    builder's file replaces ours or ours replaces it, never half of one. `static`: linked
    statically, for a program that runs in images without the host's C library."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise BuildError(f"no C compiler to build {target}: install {alternative}")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    flags = ["-static"] if static else []
    built = subprocess.run(
        [compiler, *flags, "-O2", "-o", str(partial), str(source)], capture_output=True, text=True
    )
    if built.returncode != 0:
        raise BuildError(f"building {target} failed: {built.stderr.strip()[-500:]}")
    os.replace(partial, target)
