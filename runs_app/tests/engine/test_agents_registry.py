"""The agent registry: built-in kinds and third-party kinds from the evalsite.agents entry points."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from experiments_app.specs import agent_kinds
from runs_app.engine.agents import AgentKind, AgentSetupError, UnknownAgentKind, get_agent, known_kinds
from runs_app.engine.agents.none import NoneAgent


class EchoAgent(NoneAgent):
    """A stand-in third-party kind (entry points below point at it)."""

    name = "echo"


NOT_AN_AGENT = object()


def fake_entry_points(*points: tuple[str, str]):
    listed = [EntryPoint(name, value, agent_kinds.ENTRY_POINT_GROUP) for name, value in points]

    def entry_points(*, group: str):
        return [ep for ep in listed if ep.group == group]

    return entry_points


@pytest.mark.parametrize(
    "kind", ["none", "oracle", "command", "claude-code", "codex", "gemini-cli", "opencode", "aider"]
)
def test_it_finds_every_built_in_kind(kind):
    agent = get_agent(kind)

    assert isinstance(agent, AgentKind) and agent.name == kind


def test_it_lists_known_kinds_when_a_kind_is_unknown(monkeypatch):
    monkeypatch.setattr(agent_kinds, "entry_points", fake_entry_points())

    with pytest.raises(
        UnknownAgentKind,
        match=r"'claud'; known kinds: aider, claude-code, codex, command, gemini-cli, none, opencode, oracle",
    ):
        get_agent("claud")


def test_it_loads_third_party_kinds_from_entry_points(monkeypatch):
    module = "runs_app.tests.engine.test_agents_registry"
    monkeypatch.setattr(agent_kinds, "entry_points", fake_entry_points(("echo", f"{module}:EchoAgent")))

    agent = get_agent("echo")
    assert isinstance(agent, EchoAgent)
    assert known_kinds()[-1] == "echo"


def test_it_keeps_built_ins_ahead_of_plugins_with_the_same_name(monkeypatch):
    module = "runs_app.tests.engine.test_agents_registry"
    monkeypatch.setattr(agent_kinds, "entry_points", fake_entry_points(("codex", f"{module}:EchoAgent")))

    assert type(get_agent("codex")).__name__ == "CodexAgent"
    assert known_kinds().count("codex") == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("runs_app.tests.no_such_module:Agent", "failed to load"),
        ("runs_app.tests.engine.test_agents_registry:NOT_AN_AGENT", "is not an AgentKind"),
    ],
)
def test_it_names_a_broken_plugin(monkeypatch, value, message):
    monkeypatch.setattr(agent_kinds, "entry_points", fake_entry_points(("broken", value)))

    with pytest.raises(AgentSetupError, match=f"'broken'.*{message}"):
        get_agent("broken")
