"""coder-eval's trajectory, reference, CLI-recording and agent-as-judge criteria, graded by a real
worker after the real Claude Code CLI ran against a scripted model (the mock server scripts the
tool calls a model would make; a second one plays the judge's model)."""

import json

import pytest
from django.conf import settings

from conftest import WorkerProcess, wait_for
from runs_app.engine.criteria.agent_judge import VERDICT_TOOL
from runs_app.launching import LaunchOptions, launch_run
from runs_app.models import CriterionResult, Trial
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

SOLUTION = "def add(a, b):\n    total = a + b\n    return total\n"
REFERENCE = "def add(a, b):\n    return a + b\n"
TASK = """
task_id: graded
description: every criterion a suite uses
initial_prompt: Write solution.py, list the projects with uip, then use the pdf skill.
agent: {type: claude-code, model: claude-sonnet-4-6, allowed_tools: [Bash, Write, Skill], max_retries: 0}
reference: {directory: ref}
expected_commands: 4
sandbox:
  python: null
  record_cli:
    - tool: uip
      stderr: "not configured"
      responses:
        - when: {verb: projects list}
          stdout: '[{"id": "proj-1"}]'
success_criteria:
  - {type: reference_comparison, agent_file: solution.py, reference_file: solution.py, description: ast}
  - {type: reference_comparison, agent_file: solution.py, reference_file: solution.py,
     comparison_method: token, similarity_threshold: 0.5, description: token}
  - {type: reference_comparison, agent_file: solution.py, reference_file: solution.py,
     comparison_method: complexity, similarity_threshold: 0.3, description: complexity}
  - {type: commands_efficiency, expected_commands: 2, description: a budget of two}
  - {type: skill_triggered, skill_name: pdf, expected_skill: pdf, description: pdf engaged}
  - {type: skill_triggered, skill_name: docx, expected_skill: pdf, description: docx not engaged}
  - {type: cli_called, tool: uip, verb: projects list, flags: {format: json}, value_flags: [format],
     description: listed the projects as JSON}
  - {type: cli_called, tool: uip, verb: projects delete, min_count: 0, max_count: 0,
     description: deleted nothing}
  - {type: agent_judge, prompt: "Is add() right?", files: [solution.py], description: the judge}
"""
EXPERIMENT = """
experiment_id: criteria
variants:
  - variant_id: agent
"""


def test_the_worker_grades_coder_evals_criteria_after_the_real_claude_cli(tmp_path):
    agent_script = [
        Turn([tool_use("Write", {"file_path": "solution.py", "content": SOLUTION})]),
        Turn([tool_use("Bash", {"command": "uip projects list --format json && cat cli_mocks/calls.jsonl"})]),
        Turn([tool_use("Skill", {"skill": "anthropic-skills:pdf"})]),
        Turn([text("Done.")]),
    ]
    verdict = {"score": 0.8, "rationale": "add() is   right.", "findings": ["solution.py:3 - correct"]}
    judge_script = [
        Turn([tool_use("Bash", {"command": "cat solution.py && ls -a"})]),
        Turn([tool_use(VERDICT_TOOL, verdict)]),
        Turn([text("Verdict submitted.")]),
    ]
    make_task(tmp_path, "graded", TASK, {"ref/solution.py": REFERENCE})
    import_folder_tasks(tmp_path)
    experiment = make_experiment(tmp_path, EXPERIMENT)
    with AnthropicMock(agent_script) as agent_api, AnthropicMock(judge_script) as judge_api:
        env = {
            "ANTHROPIC_API_KEY": "sk-test-judge-and-agent",
            "ANTHROPIC_BASE_URL": judge_api.url,  # the judge's API (the agent's is its base_url)
            "EVALSITE_JUDGE_PROVIDER": "anthropic",
            "EVALSITE_JUDGE_MODEL": "claude-judge-test",
        }
        worker = WorkerProcess(tmp_path, extra_env=env).start()
        try:
            overrides = [f"agent.base_url={agent_api.url}"]
            run = launch_run(experiment, options=LaunchOptions(task_slugs=["graded"], overrides=overrides))
            ended = lambda: Trial.objects.get(run=run).is_final  # noqa: E731
            wait_for(ended, timeout=200, message=lambda: worker.log()[-4000:])
        finally:
            worker.kill()
        judge_requests = judge_api.model_requests()

    trial = Trial.objects.get(run=run)
    results = {r.description: r for r in CriterionResult.objects.filter(trial=trial)}
    assert trial.status in ("passed", "failed"), (trial.error_message, trial.agent_stderr[-2000:])
    assert set(results) == {
        "ast", "token", "complexity", "a budget of two", "pdf engaged", "docx not engaged",
        "listed the projects as JSON", "deleted nothing", "the judge",
    }  # fmt: skip
    assert all(not r.error for r in results.values()), {k: r.error for k, r in results.items() if r.error}
    # The reference's AST is a prefix-like subsequence of the agent's: difflib's ratio, 0 < r < 1.
    assert 0.5 < results["ast"].score < 1.0 and results["ast"].pass_threshold == 0.8
    assert results["token"].pass_threshold == 0.5 and results["token"].passed
    assert results["complexity"].details["agent"]["function_count"] == 1
    # Three tool calls against a budget of two: 2 / 3.
    assert results["a budget of two"].score == pytest.approx(2 / 3)
    pdf, docx = results["pdf engaged"], results["docx not engaged"]
    assert pdf.score == 1.0 and pdf.details["observed_label"] == "yes"
    assert docx.score == 1.0 and docx.details["expected_label"] == "no"
    assert results["listed the projects as JSON"].score == 1.0
    assert results["listed the projects as JSON"].details["match_count"] == 1
    assert results["deleted nothing"].score == 1.0
    # The shim answered from the matching rule, and its log holds the argv as a list.
    bash = next(call for call in trial.trajectory["tool_calls"] if call["name"] == "Bash")
    answered, log = bash["output"].split('[{"id": "proj-1"}]', 1)  # the rule's stdout, then the log
    logged = json.loads(log)
    assert logged["argv"] == ["projects", "list", "--format", "json"] and logged["rule"] == 0
    judged = results["the judge"]
    assert judged.score == 0.8 and judged.passed and judged.details["rationale"] == "add() is right."
    assert judged.details["findings"] == ["solution.py:3 - correct"]
    assert judged.details["model"] == "claude-judge-test"
    # The judge's calls went through the judge's gateway: counted as the judge's.
    assert trial.role_usage["judge"]["calls"] == len(judge_requests) >= 2
    assert trial.trajectory["commands"] == {"actual": 3, "expected": 4, "efficiency": 1.0}
    # What ran the trial, one fingerprint per component, kept on the run too.
    parts = trial.components
    assert parts["agent"]["value"].startswith("claude-code 2.") and len(parts["agent"]["fingerprint"]) == 12
    assert parts["grader"]["value"].endswith("; judge anthropic/claude-judge-test")
    assert parts["environment"]["value"]["sandbox"].startswith("bubblewrap ")
    run.refresh_from_db()
    assert run.components[str(trial.variant_id)]["agent"] == {
        parts["agent"]["fingerprint"]: parts["agent"]["value"]
    }
    system = judge_requests[0]["body"]["system"]
    assert "strict code reviewer" in json.dumps(system)
    assert VERDICT_TOOL in json.dumps(judge_requests[0]["body"]["tools"])


OPTIONS_TASK = """
task_id: options
description: the Claude Code options coder-eval passes
initial_prompt: Write what you see into seen.txt.
agent:
  type: claude-code
  model: claude-sonnet-4-6
  allowed_tools: [Bash, Skill]
  max_retries: 0
  system_prompt: You are the options probe.
  system_prompt_mode: replace
  plugins: [{type: local, path: plugin}]
  claude_settings: {env: {EVAL_MARK: from-settings}}
  context_window: 200000
sandbox: {python: null}
success_criteria:
  - {type: file_contains, path: seen.txt, includes: [from-settings, "200000"], description: seen}
"""
SKILL = "---\nname: hello\ndescription: Greets in the house style zebra-42.\n---\nSay hello.\n"


def test_the_claude_code_options_reach_the_real_cli_through_the_worker(tmp_path):
    script = [
        Turn([tool_use("Bash", {"command": "echo $EVAL_MARK $CLAUDE_CODE_AUTO_COMPACT_WINDOW > seen.txt"})]),
        Turn([text("Done.")]),
    ]
    files = {"plugin/skills/hello/SKILL.md": SKILL, "plugin/.claude-plugin/plugin.json": '{"name": "probe"}'}
    make_task(tmp_path, "options", OPTIONS_TASK, files)
    import_folder_tasks(tmp_path)
    experiment = make_experiment(tmp_path, EXPERIMENT)
    with AnthropicMock(script) as api:
        worker = WorkerProcess(tmp_path, extra_env={"ANTHROPIC_API_KEY": "sk-test-options"}).start()
        try:
            overrides = [f"agent.base_url={api.url}"]
            run = launch_run(experiment, options=LaunchOptions(task_slugs=["options"], overrides=overrides))
            ended = lambda: Trial.objects.get(run=run).is_final  # noqa: E731
            wait_for(ended, timeout=200, message=lambda: worker.log()[-4000:])
        finally:
            worker.kill()
        bodies = json.dumps([request["body"] for request in api.model_requests()])

    trial = Trial.objects.get(run=run)
    # claude_settings' env and context_window reached the CLI (its Bash tool inherits them).
    assert trial.status == "passed", (trial.error_message, trial.agent_stderr[-2000:])
    assert "zebra-42" in bodies  # the plugin's skill, from the bundle, offered to the model
    first = api.model_requests()[0]["body"]["system"]
    assert "You are the options probe." in json.dumps(first)
