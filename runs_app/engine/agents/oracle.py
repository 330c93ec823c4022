"""The ``oracle`` agent: applies the task's reference solution, proving the task is solvable.

``config["reference_path"]`` is the task's extracted reference folder (the runner sets it); its
files are copied over the workspace in ``prepare``, keeping file modes, and no process runs. A
container task whose reference has a script (Harbor's solution/solve.sh) runs it instead:
``config["reference_script"]`` is its path in the container (the runner mounts the folder at
/solution) and ``config["reference_env"]`` its variables.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from experiments_app.specs.agent_kinds import KINDS

from .base import AgentInvocation, AgentKind, AgentSetupError
from .none import SilentParser


class OracleAgent(AgentKind):
    info = KINDS["oracle"]
    name = info.name

    def prepare(
        self, prompt: str, workspace: Path, home: Path, config: Mapping[str, Any], secrets: Mapping[str, str]
    ) -> AgentInvocation:
        reference = config.get("reference_path")
        if not reference:
            raise AgentSetupError(
                "oracle agent: this task has no reference solution; add `reference:` (a folder) "
                "to the task YAML or use another agent kind for it"
            )
        source = Path(reference)
        if not source.is_dir():
            raise AgentSetupError(f"oracle agent: the reference folder {source} does not exist")
        if config.get("reference_script"):
            env = {str(key): str(value) for key, value in (config.get("reference_env") or {}).items()}
            return AgentInvocation(argv=["bash", str(config["reference_script"])], stdin=b"", env_extra=env)
        shutil.copytree(source, workspace, dirs_exist_ok=True, symlinks=True)
        return AgentInvocation(argv=None)

    def parser(self, config: Mapping[str, Any] | None = None) -> SilentParser:
        return SilentParser()
