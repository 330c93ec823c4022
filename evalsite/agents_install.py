"""`make run` serves its first page before the agent CLIs are installed: scripts/install_agents.sh
installs them in the background, writing how far it got to `var/agents-install.json`. Read here
(plain Python: the engine's agent kinds read it too) for the Workers page, and for the message of
a trial that needs a CLI meanwhile."""

import json
import os
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
STATUS_FILE = "agents-install.json"


def install_status(var_dir: Path | None = None) -> dict | None:
    """{"state": installing|done|failed, "step", "done", "total", "failed", "started", "updated",
    "log", "seconds"} of the latest background install, or None when `make run` started none."""
    folder = var_dir or Path(os.environ.get("EVALSITE_VAR_DIR") or PROJECT_ROOT / "var")
    try:
        status = json.loads((folder / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(status, dict) or status.get("state") not in ("installing", "done", "failed"):
        return None
    now = time.time()
    end = now if status["state"] == "installing" else float(status.get("updated") or now)
    status["seconds"] = max(0, int(end - float(status.get("started") or end)))
    return status


def installing_note(var_dir: Path | None = None) -> str:
    """What to add to "the CLI is not installed" while `make run` installs them ("" otherwise)."""
    status = install_status(var_dir)
    if status is None or status["state"] != "installing":
        return ""
    return (
        f" (make run is installing the agent CLIs in the background: {status['done']} of {status['total']} "
        f"steps after {status['seconds']} s, now {status['step']}; the Workers page shows its progress, and "
        "this trial can be retried once it is done)"
    )
