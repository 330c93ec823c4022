"""Simulated users through a real worker: the real Claude Code CLI (against a mock model) asks
questions, an answerer replies, and the agent resumes its session each turn. The task passes only
if the agent used what the answerer told it: the file's name and content are nowhere else."""

import json

import pytest
from django.conf import settings

from conftest import WorkerProcess, wait_for
from runs_app.launching import launch_run
from runs_app.models import Trial, TrialEvent
from runs_app.tests.factories import import_folder_tasks, make_experiment, make_task
from runs_app.tests.mock_servers import AnthropicMock, Turn, text, tool_use

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not (settings.BASE_DIR / "node_modules" / ".bin" / "claude").exists(),
        reason="run `make agents` (npm ci) for the claude CLI",
    ),
]

FILE, WORD = "settings-7f3a.txt", "ready-42"
ASK_NAME, ASK_CONTENT, DONE = "What should the file be called?", "And what should it say?", "Written."
PROMPT = "I need a small settings file. Ask me what you need to know."
TASK = f"""
task_id: ask-then-write
description: the agent must ask for the file's name and content, then write it
initial_prompt: "{PROMPT}"
agent: {{type: claude-code}}
sandbox: {{python: null}}
simulation:
  enabled: true
  max_turns: 5
SIMULATIONsuccess_criteria:
  - type: file_contains
    path: {FILE}
    includes: [{WORD}]
    description: the file the user asked for, with the content the user gave
"""
SCRIPTED = f"""  answers:
    - "Call it {FILE}."
    - "Just the word {WORD}."
    - "Thanks, that is all. <<<END>>>"
"""
PERSONA = """  persona: A developer who answers exactly what is asked, in one sentence.
  goal: a settings file with the name and the content this user has in mind
  stop_token: "<<<DONE>>>"
  model: claude-haiku-4-5
"""
EXPERIMENT = """
experiment_id: simulated
variants:
  - variant_id: claude
    agent: {type: claude-code, model: claude-sonnet-4-6, max_retries: 0, allowed_tools: [Bash]}
"""


def _user_texts(body: dict) -> list[str]:
    """The text a request's user messages hold (tool results aside), in order."""
    texts = []
    for message in body.get("messages") or []:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        texts += [str(block.get("text", "")) for block in blocks if block.get("type") == "text"]
    return texts


def agent_model(body: dict) -> Turn:
    """The agent's model: asks for the name, then the content, then writes what it was told."""
    last = (body.get("messages") or [{}])[-1]
    content = last.get("content")
    if isinstance(content, list) and any(block.get("type") == "tool_result" for block in content):
        return Turn([text(DONE)])
    said = "\n".join(_user_texts(body))
    if FILE in said and WORD in said:
        return Turn([tool_use("Bash", {"command": f"echo {WORD} > {FILE}", "description": "write"})])
    return Turn([text(ASK_CONTENT if FILE in said else ASK_NAME)])


def persona_model(body: dict) -> Turn:
    """The simulated user's model: answers the agent's last question, ends once it is done."""
    agent_said = (body.get("messages") or [{}])[-1].get("content", "")
    if ASK_NAME in agent_said:
        return Turn([text(f"Call it {FILE}.")])
    if ASK_CONTENT in agent_said:
        return Turn([text(f"Just the word {WORD}.")])
    return Turn([text("Perfect. <<<DONE>>>")])


def model(body: dict) -> Turn:
    if body.get("tools"):
        return agent_model(body)
    if "playing a human user" in str(body.get("system") or ""):
        return persona_model(body)
    return Turn([text("ok")])  # the CLI's own side requests


def run_conversation(tmp_path, simulation: str) -> tuple[Trial, list[dict]]:
    make_task(tmp_path, "ask-then-write", TASK.replace("SIMULATION", simulation))
    import_folder_tasks(tmp_path)
    experiment = make_experiment(tmp_path, EXPERIMENT)
    with AnthropicMock(responder=model) as api:
        env = {"ANTHROPIC_API_KEY": "sk-test-agent-and-answerer", "ANTHROPIC_BASE_URL": api.url}
        worker = WorkerProcess(tmp_path, extra_env=env).start()
        try:
            run = launch_run(experiment)

            def finished():
                run.refresh_from_db()
                return run.is_final

            wait_for(finished, timeout=200, message=lambda: worker.log()[-4000:])
        finally:
            worker.kill()
        requests = api.model_requests()
    return Trial.objects.get(run=run), requests


def test_claude_resumes_its_session_with_the_scripted_answers_and_passes_only_by_using_them(tmp_path):
    trial, requests = run_conversation(tmp_path, SCRIPTED)

    assert trial.status == "passed", (trial.error_category, trial.error_message, trial.agent_stderr[-2000:])
    said = [e.data for e in TrialEvent.objects.filter(trial=trial, kind="message", data__role="user")]
    assert [(d["text"], d["turn"]) for d in said] == [(f"Call it {FILE}.", 2), (f"Just the word {WORD}.", 3)]
    ended = TrialEvent.objects.get(trial=trial, kind="system", data__subtype="conversation_end").data
    assert (ended["reason"], ended["turns"]) == ("stop_token", 3)
    # Each later turn resumed the same session: its request carries the whole conversation.
    last_turn = [r for r in requests if r["body"].get("tools")][-1]["body"]
    assert PROMPT in "\n".join(_user_texts(last_turn))
    dialog = trial.trajectory["dialog"]
    assert [m["role"] for m in dialog] == ["task", "agent", "user", "agent", "user", "agent"]
    assert dialog[1]["text"] == ASK_NAME and dialog[-1]["text"] == DONE
    assert trial.role_usage == {}  # the scripted answerer calls no model


def test_the_persona_answerer_plays_the_user_through_its_own_gateway_and_is_counted_apart(tmp_path):
    trial, requests = run_conversation(tmp_path, PERSONA)

    assert trial.status == "passed", (trial.error_category, trial.error_message, trial.agent_stderr[-2000:])
    persona_calls = [r for r in requests if "playing a human user" in str(r["body"].get("system") or "")]
    assert len(persona_calls) == 3 and {r["body"]["model"] for r in persona_calls} == {"claude-haiku-4-5"}
    answerer = trial.role_usage["answerer"]
    assert answerer["calls"] == 3 and answerer["output_tokens"] == 3 * 40
    assert trial.answerer_cost_usd == answerer["cost_usd"] > 0
    # The agent's own counts leave the answerer's calls out.
    agent_calls = TrialEvent.objects.filter(trial=trial, kind="usage", data__source="gateway").exclude(
        data__has_key="role"
    )
    assert trial.input_tokens == sum(e.data["input_tokens"] for e in agent_calls)
    roles = TrialEvent.objects.filter(trial=trial, kind="usage", data__role="answerer")
    assert roles.count() == 3
    ended = TrialEvent.objects.get(trial=trial, kind="system", data__subtype="conversation_end").data
    assert ended["reason"] == "stop_token"
    assert json.dumps(trial.trajectory).count(WORD) >= 2


def test_the_trial_page_shows_the_conversation(tmp_path, client, admin_user):
    trial, _ = run_conversation(tmp_path, SCRIPTED)
    client.force_login(admin_user)

    page = client.get(f"/runs/{trial.run_id}/trials/{trial.pk}/").content.decode()

    assert "<h2>Conversation</h2>" in page and "user (simulated)" in page
    assert ASK_NAME in page and f"Just the word {WORD}." in page
    assert "conversation ended" in page
