"""A `command` agent's script, attached to its experiment (no Django): the one rule for how a
variant names it, read by the experiment form, launch pre-flight and launching.

The file travels in the experiment's bundle, not in the task's workspace: the agent runs it
only when its options say `script: agent.py` and its command says `{script}` where the file goes
(the runner puts the script's path there). A command that names the file itself (`python3
agent.py`) looks for it in the workspace, and every trial fails without an error to read.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

PLACEHOLDER = "{script}"
# How a file of each kind is usually run: what the form offers and the errors suggest.
RUNNERS = {".py": "python3", ".sh": "sh", ".bash": "bash", ".js": "node", ".mjs": "node", ".rb": "ruby"}


def suggested_command(name: str) -> str:
    """`python3 {script}` for agent.py; `sh {script}` for a file of no known kind."""
    suffix = name[name.rfind(".") :] if "." in name else ""
    return f"{RUNNERS.get(suffix.lower(), 'sh')} {PLACEHOLDER}"


def _words(command: Any) -> list[str]:
    if isinstance(command, list):
        return [str(part) for part in command]
    if not isinstance(command, str):
        return []
    try:
        return shlex.split(command)
    except ValueError:  # an unbalanced quote: the shell will say so; words are enough here
        return command.split()


def _names_file(word: str, name: str) -> bool:
    """`agent.py`, `./agent.py` or `some/dir/agent.py` name the file `agent.py`."""
    return word == name or word.endswith("/" + name)


def script_problems(agent: Mapping[str, Any], files: Iterable[str]) -> list[tuple[str, str]]:
    """(option, message) for each way a command agent would miss its script: a `script` its
    command never runs, or a command naming one of the experiment's `files` (names beside its
    YAML) as if it were in the workspace. Other kinds read neither option: no problems."""
    command = agent.get("command")
    script = agent.get("script")
    words = _words(command)
    if isinstance(script, str) and script and command is not None:
        if not any(PLACEHOLDER in word for word in words):
            return [
                (
                    "command",
                    f"the command never says {PLACEHOLDER}, so the script {script} would not run: put "
                    f"{PLACEHOLDER} where the command runs it, e.g. {suggested_command(script)}",
                )
            ]
        return []
    for name in sorted(set(files)):
        if any(_names_file(word, name) for word in words):
            return [
                (
                    "command",
                    f"{name} is a file of the experiment, not of the task's workspace, so the command "
                    f"would not find it: set the script to {name} and write {PLACEHOLDER} in its place, "
                    f"e.g. {suggested_command(name)}",
                )
            ]
    return []


def unused_files(attached: Iterable[str], scripts: Iterable[str]) -> list[str]:
    """The attached file names no variant's `script` names (by its last path part)."""
    named = {re.split(r"[\\/]", script)[-1] for script in scripts if isinstance(script, str)}
    return sorted(name for name in set(attached) if name not in named)
