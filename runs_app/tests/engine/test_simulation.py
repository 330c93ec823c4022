"""Simulated users through a real worker: the real Claude Code CLI (against a mock model) asks
questions, an answerer replies, and the agent resumes its session each turn. The task passes only
if the agent used what the answerer told it: the file's name and content are nowhere else."""

import json

import pytest
from django.conf import settings

from conftest import WorkerProcess, wait_for
from runs_app.analysis.coder_eval_run import evaluation_result
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


def run_task(tmp_path, task: str, responder, experiment: str = EXPERIMENT) -> tuple[Trial, list[dict]]:
    """One task's run through a real worker whose every model (the agent's, the answerer's, the
    judge's) is the mock answering with `responder`; the trial and the model requests."""
    make_task(tmp_path, "task", task)
    import_folder_tasks(tmp_path)
    launched = make_experiment(tmp_path, experiment)
    with AnthropicMock(responder=responder) as api:
        env = {"ANTHROPIC_API_KEY": "sk-test-every-role", "ANTHROPIC_BASE_URL": api.url}
        worker = WorkerProcess(tmp_path, extra_env=env).start()
        try:
            run = launch_run(launched)

            def finished():
                run.refresh_from_db()
                return run.is_final

            wait_for(finished, timeout=200, message=lambda: worker.log()[-4000:])
        finally:
            worker.kill()
        requests = api.model_requests()
    return Trial.objects.get(run=run), requests


def run_conversation(tmp_path, simulation: str) -> tuple[Trial, list[dict]]:
    return run_task(tmp_path, TASK.replace("SIMULATION", simulation), model)


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
    # A coder-eval run record says how the conversation went, as coder-eval's telemetry does.
    telemetry = evaluation_result(trial)["simulation"]
    assert (telemetry["stop_reason"], telemetry["total_turns"], telemetry["simulator_failures"]) == (
        "stop_token",
        3,
        0,
    )


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


def test_the_answerers_budget_ends_the_conversation_and_the_trial_is_graded_and_flagged(tmp_path):
    budgeted = PERSONA + "budgets:\n  answerer: {max_calls: 1}\n"  # the task's own key
    trial, requests = run_conversation(tmp_path, budgeted)

    # One answer (the file's name), then the refused call: the content never came, so it fails.
    assert (trial.status, trial.budget_exceeded) == ("failed", "answerer.max_calls"), trial.error_message
    persona_calls = [r for r in requests if "playing a human user" in str(r["body"].get("system") or "")]
    assert len(persona_calls) == 1 and trial.role_usage["answerer"]["calls"] == 1
    ended = TrialEvent.objects.get(trial=trial, kind="system", data__subtype="conversation_end").data
    assert ended["reason"] == "answerer_budget"


def test_the_trial_page_shows_the_conversation(tmp_path, client, admin_user):
    trial, _ = run_conversation(tmp_path, SCRIPTED)
    client.force_login(admin_user)

    page = client.get(f"/runs/{trial.run_id}/trials/{trial.pk}/").content.decode()

    assert "<h2>Conversation</h2>" in page and "user (simulated)" in page
    assert ASK_NAME in page and f"Just the word {WORD}." in page
    assert "conversation ended" in page


# coder-eval's upstream example `tasks/python_cli_simulated_judged/echo_simulated_judged.yaml`,
# in its shape: a persona answerer gives the request only when asked, and a judge that reads the
# conversation grades the echo.
ECHO = "hello, world -- evalsite reads coder-eval tasks as they are."
UPSTREAM_TASK = f"""
task_id: python-echo-simulated-judged
description: >
  Minimal smoke test for simulation + llm_judge with include_dialog. The agent
  is told only to ask the user what they want; the simulated user supplies an
  exact string to echo.
tags: [python, simulation, llm-judge]
run_limits:
  max_turns: 4
  task_timeout: 900
  turn_timeout: 120
initial_prompt: "Ask me what I would like to do. Do not assume anything about the task."
agent:
  type: claude-code
  permission_mode: acceptEdits
  allowed_tools: ["Bash", "Read", "Write", "Edit"]
  system_prompt: |
    You are a literal-minded assistant. When the user asks you to echo a string, reply with
    that exact string verbatim and nothing else.
sandbox:
  driver: tempdir
  python: {{}}
simulation:
  enabled: true
  persona: |
    You are a user with one specific request. You give the request only when asked.
  goal: |
    When (and only when) the agent asks what you want, reply with exactly this instruction:
      Repeat this as-is without anything else: "{ECHO}"
    When the agent has produced the echoed text, reply with exactly <<<END>>>.
  constraints:
    - "Do not volunteer the request before being asked."
    - "Do not modify the string in any way when you give it."
  max_turns: 4
  stop_token: "<<<END>>>"
  stop_on_criteria_pass: false
  check_criteria: end_of_dialog
  n_trials: 1
success_criteria:
  - type: llm_judge
    description: "Agent echoed the user's string exactly"
    prompt: |
      Look at the DIALOG block. Grade whether the agent reproduced the string the simulated
      user gave, verbatim: 1.0 exact, 0.0 paraphrased or invented.
    include_dialog: true
    include_agent_output: true
    model: "anthropic.claude-sonnet-4-6"
    temperature: 0.0
    max_tokens: 400
    weight: 1.0
    pass_threshold: 0.9
"""
ASK = "What would you like me to do?"


def echo_model(body: dict) -> Turn:
    """The agent, the simulated user and the judge of the upstream example, by their requests."""
    tools = [tool.get("name") for tool in body.get("tools") or []]
    if "submit_verdict" in tools:  # the judge: did the agent say back what the user asked for?
        prompt = body["messages"][0]["content"]
        dialog = prompt.split("## The conversation", 1)[1] if "## The conversation" in prompt else ""
        echoed = f"[AGENT]\n{ECHO}" in dialog and "[USER (simulated)]\nRepeat this as-is" in dialog
        verdict = {"score": 1.0 if echoed else 0.0, "rationale": "compared the echo with the request"}
        return Turn([tool_use("submit_verdict", verdict)])
    if tools:  # the agent
        said = _user_texts(body)[-1] if _user_texts(body) else ""
        request = said.partition('"')[2].rpartition('"')[0]
        return Turn([text(request or ASK)])
    if "playing a human user" in str(body.get("system") or ""):
        agent_said = (body.get("messages") or [{}])[-1].get("content", "")
        if ASK in agent_said:
            return Turn([text(f'Repeat this as-is without anything else: "{ECHO}"')])
        return Turn([text("<<<END>>>")])
    return Turn([text("ok")])


def test_coder_eval_s_simulated_and_judged_example_imports_and_runs(tmp_path):
    experiment = EXPERIMENT.replace("allowed_tools: [Bash]", "max_turns: 4")
    trial, _ = run_task(tmp_path, UPSTREAM_TASK, echo_model, experiment)

    assert trial.status == "passed", (trial.error_category, trial.error_message, trial.agent_stderr[-2000:])
    judge = trial.criterion_results.get()
    assert judge.type == "llm_judge" and judge.score == 1.0
    assert [m["role"] for m in trial.trajectory["dialog"]] == ["task", "agent", "user", "agent"]
    assert trial.trajectory["dialog"][-1]["text"] == ECHO
    # Each role's calls are counted apart: the agent's on the trial, the others by role.
    assert trial.role_usage["answerer"]["calls"] == 2 and trial.role_usage["judge"]["calls"] == 1
    assert trial.judge_cost_usd == trial.role_usage["judge"]["cost_usd"]
