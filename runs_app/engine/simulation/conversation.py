"""A simulated conversation: the agent's turns and the answerer's replies, until one side ends it.

coder-eval's order (`simulation:`), first match wins after each agent turn:
1. the agent's turn did not complete (an error, a limit, a cancel): the conversation ends there;
2. with `check_criteria` every_turn or both, the criteria are judged; passing ends it when
   `stop_on_criteria_pass` (`criteria_passed`);
3. `max_turns` agent turns have run (`max_turns`);
4. the agent's and the answerer's tokens reached `max_total_tokens` (`budget`);
5. the answerer replies; a reply holding the stop token ends it (`stop_token`), a refused call
   of its budget ends it (`answerer_budget`), a failed call makes the trial an error;
6. otherwise the reply is the agent's next prompt, in the same session.

Plain Python: the runner passes in how to take a turn, judge the criteria and record events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runs_app.engine.gateway import roles
from runs_app.engine.simulation.answerers import Answerer, Message


@dataclass
class TurnEnd:
    """How one agent turn ended: its final text, and whether it completed (so may go on)."""

    text: str
    completed: bool


@dataclass
class Ending:
    reason: str  # stop_token, max_turns, criteria_passed, budget, answerer_budget, agent_stopped, error
    turns: int
    messages: list[Message] = field(default_factory=list)
    error: str = ""  # the answerer failed: the trial is an error
    budget: str = ""  # "answerer.max_usd": the answerer's budget ended the conversation

    def event(self) -> dict[str, Any]:
        return {"subtype": "conversation_end", "reason": self.reason, "turns": self.turns}


def converse(
    simulation: dict[str, Any],
    opening: str | None,
    take_turn: Callable[[str, int], TurnEnd],
    answerer: Answerer,
    client: roles.RoleClient | None,
    record: Callable[[str, dict[str, Any]], None],
    passed_now: Callable[[], bool] | None = None,
    tokens_used: Callable[[], int] = lambda: 0,
) -> Ending:
    """Run the conversation (see the module docstring). `take_turn(prompt, n)` runs the agent's
    n-th turn; `record(kind, data)` keeps an event; `passed_now()` judges the criteria."""
    messages: list[Message] = []

    def ask(turns: int) -> Ending | str:
        try:
            reply = answerer.answer(simulation, messages, client)
        except roles.BudgetRefused as exc:
            return Ending("answerer_budget", turns, messages, budget=f"answerer.{exc.limit}")
        except Exception as exc:  # a broken answerer is the harness's failure, never the agent's
            return Ending("error", turns, messages, error=f"the {answerer.name} answerer failed: {exc}")
        if reply.stop:
            return Ending("stop_token", turns, messages)
        messages.append(Message("user", reply.text))
        record("message", {"role": "user", "text": reply.text, "turn": turns + 1, "answerer": answerer.name})
        return reply.text

    if opening:
        messages.append(Message("task", opening))
        prompt: Ending | str = opening
    else:
        prompt = ask(0)
    turns = 0
    checking = simulation.get("check_criteria") in ("every_turn", "both") and passed_now is not None
    while not isinstance(prompt, Ending):
        turns += 1
        record("system", {"subtype": "turn", "turn": turns})
        end = take_turn(prompt, turns)
        messages.append(Message("agent", end.text))
        if not end.completed:
            return Ending("agent_stopped", turns, messages)
        if checking and passed_now is not None:
            passed = passed_now()
            record("system", {"subtype": "criteria_checked", "turn": turns, "passed": passed})
            if passed and simulation.get("stop_on_criteria_pass"):
                return Ending("criteria_passed", turns, messages)
        if turns >= int(simulation.get("max_turns") or 8):
            return Ending("max_turns", turns, messages)
        most = simulation.get("max_total_tokens")
        if most is not None and tokens_used() >= most:
            return Ending("budget", turns, messages)
        prompt = ask(turns)
    return prompt
