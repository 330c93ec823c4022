"""The ``none`` agent: does nothing, so a task graded after it proves it fails without work."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from experiments_app.specs.agent_kinds import KINDS

from .base import AgentEvent, AgentInvocation, AgentKind, BaseParser


class SilentParser(BaseParser):
    """Parser for kinds that run no process: every line is plain output."""

    def _parse(self, obj: dict[str, Any]) -> list[AgentEvent] | None:
        return None


class NoneAgent(AgentKind):
    info = KINDS["none"]
    name = info.name

    def prepare(
        self, prompt: str, workspace: Path, home: Path, config: Mapping[str, Any], secrets: Mapping[str, str]
    ) -> AgentInvocation:
        return AgentInvocation(argv=None)

    def parser(self, config: Mapping[str, Any] | None = None) -> SilentParser:
        return SilentParser()
