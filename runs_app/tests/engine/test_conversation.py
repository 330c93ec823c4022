"""Simulated conversations without a worker: the loop's stopping rules, the answerers, and the
role gateway that counts and budgets the answerer's and the judge's model calls."""

import pytest

from runs_app.engine.criteria.base import GradingContext
from runs_app.engine.criteria.judge import build_prompt, dialog_text
from runs_app.engine.gateway import Upstream, roles
from runs_app.engine.simulation import answerers
from runs_app.engine.simulation.answerers import Message
from runs_app.engine.simulation.conversation import TurnEnd, converse
from runs_app.tests.mock_servers import AnthropicMock, Turn, text


class Agent:
    """Takes turns: says `lines[n-1]` on turn n (completed unless listed in `stops_on`)."""

    def __init__(self, lines, stops_on=()):
        self.lines, self.stops_on, self.prompts = lines, stops_on, []

    def __call__(self, prompt: str, turn: int) -> TurnEnd:
        self.prompts.append(prompt)
        return TurnEnd(self.lines[turn - 1], completed=turn not in self.stops_on)


def run(simulation, agent, opening="Write the file.", answerer=None, client=None, **options):
    events = []
    ending = converse(
        {"max_turns": 8, **simulation}, opening, agent, answerer or answerers.ScriptedAnswerer(), client,
        lambda kind, data: events.append((kind, data)), **options,
    )  # fmt: skip
    return ending, events


def test_it_sends_each_scripted_answer_in_order_and_ends_at_the_stop_token():
    agent = Agent(["Which name?", "What content?", "Done.", "unused"])
    simulation = {"answers": ["Call it a.txt", "The word ready", "Thanks <<<END>>>", "never sent"]}

    ending, events = run(simulation, agent)

    assert agent.prompts == ["Write the file.", "Call it a.txt", "The word ready"]
    assert (ending.reason, ending.turns) == ("stop_token", 3)
    assert [(m.role, m.text) for m in ending.messages] == [
        ("task", "Write the file."), ("agent", "Which name?"), ("user", "Call it a.txt"),
        ("agent", "What content?"), ("user", "The word ready"), ("agent", "Done."),
    ]  # fmt: skip
    said = [data for kind, data in events if kind == "message"]
    assert [(d["role"], d["turn"], d["answerer"]) for d in said] == [
        ("user", 2, "scripted"),
        ("user", 3, "scripted"),
    ]


def test_the_scripted_answers_running_out_ends_the_conversation():
    ending, _ = run({"answers": ["one more"]}, Agent(["a", "b", "c"]))

    assert (ending.reason, ending.turns) == ("stop_token", 2)


@pytest.mark.parametrize(
    ("simulation", "options", "reason", "turns"),
    [
        ({"answers": ["x"] * 9, "max_turns": 2}, {}, "max_turns", 2),
        ({"answers": ["x"] * 9, "max_total_tokens": 100}, {"tokens_used": lambda: 100}, "budget", 1),
        (
            {"answers": ["x"] * 9, "check_criteria": "every_turn", "stop_on_criteria_pass": True},
            {"passed_now": iter([False, True]).__next__}, "criteria_passed", 2,
        ),
    ],
)  # fmt: skip
def test_it_stops_on_turns_tokens_and_passing_criteria_before_asking_the_answerer(
    simulation, options, reason, turns
):
    ending, _ = run(simulation, Agent(["a", "b", "c", "d"]), **options)

    assert (ending.reason, ending.turns) == (reason, turns)


def test_a_turn_that_did_not_complete_ends_the_conversation_without_an_answer():
    agent = Agent(["a", "b", "c"], stops_on=(2,))

    ending, _ = run({"answers": ["x", "y", "z"]}, agent)

    assert (ending.reason, ending.turns, len(agent.prompts)) == ("agent_stopped", 2, 2)


def test_a_failing_answerer_is_an_error_and_a_refused_budget_ends_the_conversation():
    class Broken(answerers.Answerer):
        name = "broken"

        def answer(self, simulation, conversation, client):
            raise RuntimeError("no model")

    class Spent(answerers.Answerer):
        name = "spent"

        def answer(self, simulation, conversation, client):
            raise roles.BudgetRefused("answerer", "max_usd")

    broken, _ = run({}, Agent(["a"]), answerer=Broken())
    spent, _ = run({}, Agent(["a"]), answerer=Spent())

    assert broken.reason == "error" and broken.error == "the broken answerer failed: no model"
    assert (spent.reason, spent.budget) == ("answerer_budget", "answerer.max_usd")


def test_without_a_prompt_the_answerer_opens_the_conversation():
    agent = Agent(["Hello, what do you need?", "ok"])

    ending, _ = run({"answers": ["Please write a.txt", "<<<END>>>"]}, agent, opening=None)

    assert agent.prompts == ["Please write a.txt"] and ending.reason == "stop_token"


def persona_mock(replies: list[str]) -> AnthropicMock:
    said = iter(replies)
    return AnthropicMock(responder=lambda body: Turn([text(next(said))]))


def test_the_persona_answerer_plays_its_user_through_its_own_budgeted_gateway(tmp_path):
    simulation = {
        "persona": "A terse developer", "goal": "a.txt holding ready", "constraints": ["never say please"],
        "stop_token": "<<<DONE>>>", "model": "claude-haiku-4-5", "description": "writes a file",
    }  # fmt: skip
    with persona_mock(["Call it a.txt.", "Good. <<<DONE>>>"]) as api:
        upstream = Upstream("anthropic", api.url, "sk-answerer-real-key")
        client = roles.RoleClient("answerer", tmp_path / "a.sock", upstream, {"max_calls": 5})
        try:
            agent = Agent(["Which file?", "Written."])
            ending, _ = run(simulation, agent, answerer=answerers.PersonaAnswerer(), client=client)
            calls = client.drain()
        finally:
            client.close()
        first, second = api.model_requests()

    assert (ending.reason, ending.turns) == ("stop_token", 2)
    assert first["headers"]["x-api-key"] == "sk-answerer-real-key"
    system = first["body"]["system"]
    assert "A terse developer" in system and "a.txt holding ready" in system and "<<<DONE>>>" in system
    assert "never say please" in system and "Write the file." in system and "writes a file" in system
    assert first["body"]["model"] == "claude-haiku-4-5"
    # The agent speaks as the persona's "user", the persona's own replies are "assistant".
    assert [(m["role"], m["content"]) for m in second["body"]["messages"]] == [
        ("user", "Which file?"), ("assistant", "Call it a.txt."), ("user", "Written."),
    ]  # fmt: skip
    assert [(c["role"], c["status"], c["input_tokens"]) for c in calls] == [
        ("answerer", 200, 300), ("answerer", 200, 300),
    ]  # fmt: skip
    assert client.totals().turns == 2 and client.totals().output_tokens == 80


def test_a_roles_budget_refuses_its_next_call(tmp_path):
    with persona_mock(["first"] * 5) as api:
        client = roles.RoleClient(
            "judge", tmp_path / "j.sock", Upstream("anthropic", api.url, "k"), {"max_output_tokens": 50}
        )
        try:
            client.post({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
            client.post({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
            with pytest.raises(roles.BudgetRefused, match="the judge's max_output_tokens budget is used up"):
                client.post({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
        finally:
            client.close()
        assert len(api.model_requests()) == 2


def test_the_persona_opens_when_the_task_gives_no_prompt():
    messages = answerers._messages([])
    assert messages == [{"role": "user", "content": answerers.OPENING_REQUEST}]
    later = answerers._messages([Message("user", "hi agent"), Message("agent", "hello")])
    assert [m["role"] for m in later] == ["user", "assistant", "user"]


def test_the_judge_reads_the_conversation_when_asked(tmp_path):
    dialog = [{"role": "task", "text": "Ask me."}, {"role": "agent", "text": "What?"},
              {"role": "user", "text": 'Repeat: "hello"'}, {"role": "agent", "text": "hello"}]  # fmt: skip
    context = GradingContext(workspace=tmp_path, dialog=dialog)

    prompt = build_prompt({"prompt": "Grade it.", "include_dialog": True}, context)

    assert '[USER (simulated)]\nRepeat: "hello"' in prompt and "[AGENT]\nhello" in prompt
    assert "[USER]\nAsk me." in prompt
    assert "conversation" not in build_prompt({"prompt": "Grade it."}, context).lower()
    # Too long: the oldest messages go first.
    assert dialog_text(dialog, 30) == "[AGENT]\nhello"
