"""The real coder-eval 0.12.16 command for tests that check evalsite's files with it: `CODER_EVAL`
(a path) or `coder-eval` on PATH; skipped without one, failed where it must run
(EVALSITE_REQUIRE_CODER_EVAL=1)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def coder_eval() -> Path:
    found = os.environ.get("CODER_EVAL") or shutil.which("coder-eval")
    if not found or not Path(found).is_file():
        why = "coder-eval not found: set CODER_EVAL=/path/to/coder-eval (0.12.16) or put it on PATH"
        if os.environ.get("EVALSITE_REQUIRE_CODER_EVAL"):
            pytest.fail(f"{why} (EVALSITE_REQUIRE_CODER_EVAL is set: it must run here)")
        pytest.skip(why)
    return Path(found)


def run_coder_eval(*args: str) -> subprocess.CompletedProcess:
    # Wide and plain: rich wraps and colours what the test reads otherwise.
    env = {**os.environ, "COLUMNS": "300", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run(
        [str(coder_eval()), *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def coder_eval_python() -> Path:
    """The interpreter coder-eval is installed in (its writer code run as coder-eval runs it)."""
    return coder_eval().resolve().parent / "python"
