"""Answerers: who replies to the agent in a simulated conversation (a task's `simulation:`).

A registry like the agent kinds: the built-ins below, plus objects installed under the
``evalsite.answerers`` entry-point group (an ``Answerer`` subclass or instance), e.g.:

    [project.entry-points."evalsite.answerers"]
    my-user = "my_package.users:MyUser"

An answerer reads the conversation so far and returns the user's next message, or says the
conversation is over (`Reply.stop`). It never sees the agent's workspace. One that calls a model
does it through `client` (a `roles.RoleClient`), so its calls are counted as the answerer's.
Plain Python, no Django.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from experiments_app.specs.task import ANSWERER_ENTRY_POINT_GROUP, BUILTIN_ANSWERERS
from runs_app.engine.gateway import roles

OPENING_REQUEST = "Begin now: write your opening message to the coding agent, as the user."
# What the persona answerer may write in one message.
MAX_REPLY_TOKENS = 1024


@dataclass
class Message:
    # "task" (the task's prompt, the user's opening), "user" (the answerer's) or "agent"
    role: str
    text: str


@dataclass
class Reply:
    text: str
    stop: bool = False  # the conversation ends here: `text` is not sent


class Answerer:
    name = ""
    # Whether it calls a model: the runner then opens the trial's answerer gateway for it.
    needs_model = False

    def answer(
        self, simulation: dict[str, Any], conversation: list[Message], client: roles.RoleClient | None
    ) -> Reply:
        """The user's next message; `conversation` is empty when the task gives no opening prompt
        (the answerer opens the conversation). `simulation` is the task's resolved `simulation`
        block, with `model` filled in and the task's `description`."""
        raise NotImplementedError


def stop_token(simulation: dict[str, Any]) -> str:
    return str(simulation.get("stop_token") or "<<<END>>>")


def read_reply(simulation: dict[str, Any], text: str) -> Reply:
    """A message that holds the stop token ends the conversation (coder-eval's rule)."""
    token = stop_token(simulation)
    if token in text:
        return Reply(text.replace(token, "").strip(), stop=True)
    return Reply(text.strip())


class ScriptedAnswerer(Answerer):
    """`simulation.answers`, one per turn in order; after the last one the conversation ends.
    Deterministic: no model, no key (the default wherever `answers` are given)."""

    name = "scripted"

    def answer(
        self, simulation: dict[str, Any], conversation: list[Message], client: roles.RoleClient | None
    ) -> Reply:
        given = sum(1 for message in conversation if message.role == "user")
        answers = list(simulation.get("answers") or [])
        if given >= len(answers):
            return Reply("", stop=True)
        return read_reply(simulation, str(answers[given]))


class PersonaAnswerer(Answerer):
    """An LLM playing the user described by `persona`, `goal` and `constraints`; it ends the
    conversation by writing the stop token. Its model is `simulation.model`, else
    EVALSITE_ANSWERER_MODEL, on the API EVALSITE_ANSWERER_PROVIDER names (anthropic by default)."""

    name = "persona"
    needs_model = True

    def answer(
        self, simulation: dict[str, Any], conversation: list[Message], client: roles.RoleClient | None
    ) -> Reply:
        if client is None:
            raise roles.ModelCallError("the persona answerer needs a model client")
        model = str(simulation.get("model") or roles.DEFAULT_MODELS[client.api])
        system = system_prompt(simulation, conversation)
        body = roles.chat_body(client.api, model, system, _messages(conversation), MAX_REPLY_TOKENS)
        text = roles.reply_text(client.api, client.post(body))
        reply = read_reply(simulation, text)
        if not reply.stop and not reply.text:
            raise roles.ModelCallError("the persona answerer's model replied with no text")
        return reply


def system_prompt(simulation: dict[str, Any], conversation: list[Message]) -> str:
    """The persona's instructions. The agent's words arrive as the other party's messages; the
    reference solution and the criteria are never shown."""
    parts = [
        "You are playing a human user who is talking with an autonomous coding agent. Stay in "
        "character and never mention that you are a model or a simulation.",
        f"WHO YOU ARE:\n{str(simulation.get('persona') or '').strip()}",
        f"WHAT YOU WANT (in the end; not necessarily what you say first):\n"
        f"{str(simulation.get('goal') or '').strip()}",
    ]
    constraints = [str(c) for c in simulation.get("constraints") or []]
    if constraints:
        parts.append("HOW YOU BEHAVE:\n" + "\n".join(f"- {c}" for c in constraints))
    parts.append(
        "RULES:\n- You see only what the agent writes to you, not its files or its terminal.\n"
        "- Answer as this user would, briefly; never do the agent's work for it.\n"
        f"- When your goal is met, or there is nothing left to ask, write {stop_token(simulation)}: "
        "it ends the conversation. Do not write it before."
    )
    if simulation.get("description"):
        parts.append(f"The task, as the evaluator describes it: {simulation['description']}")
    if conversation and conversation[0].role == "task":
        parts.append(f"You opened the conversation with this message:\n{conversation[0].text}")
    return "\n\n".join(parts)


def _messages(conversation: list[Message]) -> list[dict[str, str]]:
    """The conversation from the persona's side: the agent speaks as "user", the persona as
    "assistant"; the task's opening (in the system prompt) is left out, so the agent speaks first."""
    turns = [message for message in conversation if message.role != "task"]
    messages = [
        {"role": "user" if message.role == "agent" else "assistant", "content": message.text or "(no text)"}
        for message in turns
    ]
    # The persona opened the conversation itself (the task has no prompt): it was asked to.
    if not messages or messages[0]["role"] == "assistant":
        messages.insert(0, {"role": "user", "content": OPENING_REQUEST})
    return messages


BUILTINS: dict[str, type[Answerer]] = {"persona": PersonaAnswerer, "scripted": ScriptedAnswerer}
if set(BUILTINS) != set(BUILTIN_ANSWERERS):
    raise ImportError("every built-in answerer of experiments_app.specs.task needs its class here")


class UnknownAnswerer(ValueError):
    pass


def get_answerer(name: str) -> Answerer:
    if name in BUILTINS:
        return BUILTINS[name]()
    for ep in entry_points(group=ANSWERER_ENTRY_POINT_GROUP):
        if ep.name != name:
            continue
        try:
            target = ep.load()
            answerer = target() if isinstance(target, type) else target
        except Exception as exc:  # a broken plugin must say which one
            raise UnknownAnswerer(f"answerer {name!r} from {ep.value} failed to load: {exc}") from exc
        if not isinstance(answerer, Answerer):
            raise UnknownAnswerer(f"answerer {name!r} from {ep.value} is not an Answerer")
        answerer.name = answerer.name or name
        return answerer
    raise UnknownAnswerer(
        f"unknown answerer {name!r} (packages add answerers through the "
        f"{ANSWERER_ENTRY_POINT_GROUP!r} entry-point group)"
    )
