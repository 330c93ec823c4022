"""What an agent's turn is, as coder-eval 0.12.16 runs it, through a real worker: every prompt
(each turn of a simulated conversation too) starts with the agent's working directory and a blank
line unless the variant asks for the bare prompt, and `run_limits.turn_timeout` is a wall clock
on each turn whose end makes the trial an `error`."""

import json
import re

import pytest
from django.conf import settings

from conftest import WorkerProcess
from experiments_app.definitions import import_tasks
from runs_app.launching import LaunchOptions, launch_run
from runs_app.models import Trial
from runs_app.tests.factories import import_folder_tasks, make_experiment, make_task
from runs_app.tests.mock_servers import AnthropicMock, Turn, text, tool_use
from runs_app.tests.workers import wait_for_run

pytestmark = pytest.mark.django_db(transaction=True)

# The agent says where it runs, then what it was sent, between brackets.
ECHO = "printf '[%s|' \"$PWD\"; cat; printf ']'; echo done > out.txt"
TASK = """
task_id: {slug}
initial_prompt: "Write out.txt"
sandbox: {{python: null}}
{extra}
success_criteria:
  - type: file_exists
    path: out.txt
"""
CONVERSATION = """simulation:
  enabled: true
  max_turns: 2
  answers: ["Now the second turn."]
"""
EXPERIMENT = """
experiment_id: preamble
max_parallel: 4
variants:
  - variant_id: coder-eval
    agent: {{type: command, command: {command}}}
  - variant_id: bare
    agent: {{type: command, command: {command}, working_directory_preamble: false}}
"""


def test_every_prompt_names_the_working_directory_unless_the_variant_sends_it_bare(tmp_path):
    make_task(tmp_path, "once", TASK.format(slug="once", extra=""))
    make_task(tmp_path, "talk", TASK.format(slug="talk", extra=CONVERSATION))
    import_folder_tasks(tmp_path)
    experiment = make_experiment(tmp_path, EXPERIMENT.format(command=json.dumps(ECHO)))
    worker = WorkerProcess(tmp_path).start()
    run = wait_for_run(launch_run(experiment), timeout=90, worker=worker)

    trials = {
        (t.task_version.task.slug, t.variant.slug): t
        for t in Trial.objects.filter(run=run).select_related("task_version__task", "variant")
    }
    assert {t.status for t in trials.values()} == {"passed"}, [t.error_message for t in trials.values()]

    def sent(trial: Trial) -> list[tuple[str, str]]:
        return re.findall(r"\[([^|\]]*)\|([^\]]*)\]", trial.agent_stdout)

    ((cwd, prompt),) = sent(trials["once", "coder-eval"])
    assert cwd.startswith("/") and prompt == f"Your working directory is: {cwd}\n\nWrite out.txt"
    # Each turn of a conversation, the simulated user's reply too (coder-eval's orchestrator).
    (cwd, first), (_, second) = sent(trials["talk", "coder-eval"])
    assert first == f"Your working directory is: {cwd}\n\nWrite out.txt"
    assert second == f"Your working directory is: {cwd}\n\nNow the second turn."
    assert [prompt for _, prompt in sent(trials["once", "bare"])] == ["Write out.txt"]
    assert [prompt for _, prompt in sent(trials["talk", "bare"])] == ["Write out.txt", "Now the second turn."]
    # A comparison of the two variants names the difference in what their agents were sent.
    assert trials["once", "coder-eval"].components["agent"]["value"] == "command"
    assert trials["once", "bare"].components["agent"]["value"] == "command; bare prompt"


SLEEPER = """
experiment_id: sleeper
max_parallel: 2
variants:
  - variant_id: slow
    agent:
      type: command
      command: "echo started; echo partial > out.txt; sleep 25; echo late > out.txt"
"""


def test_a_turn_past_turn_timeout_is_an_error_that_says_so_and_is_not_graded(tmp_path):
    limits = "run_limits: {turn_timeout: 10, task_timeout: 120}"
    make_task(tmp_path, "turn-bound", TASK.format(slug="turn-bound", extra=limits))
    import_folder_tasks(tmp_path)
    experiment = make_experiment(tmp_path, SLEEPER)
    worker = WorkerProcess(tmp_path).start()
    run = wait_for_run(launch_run(experiment), timeout=120, worker=worker)

    turn = Trial.objects.get(run=run)
    assert (turn.status, turn.error_category, turn.timed_out) == ("error", "timeout", True)
    assert turn.error_message == "Agent turn timed out after 10s (iteration 1)"
    assert not turn.criterion_results.exists()  # coder-eval does not grade it either
    assert 9 < turn.agent_seconds < 20 and "started" in turn.agent_stdout


CORPUS = settings.BASE_DIR / "experiments_app" / "tests" / "corpus" / "coder_eval_round2"
NODE_BIN = settings.BASE_DIR / "node_modules" / ".bin"
SLOW_BASH = 'python3 -c "import time; time.sleep(25)"; echo done > done.txt'


@pytest.mark.skipif(
    not (NODE_BIN / "claude").exists(), reason="run `make agents` (npm ci) for the claude CLI"
)
def test_the_real_claude_cli_on_the_corpus_file_ends_as_coder_eval_does(tmp_path):
    """`engine_1_turn_timeout.yaml` with the model scripted to run a 25 s command: coder-eval
    0.12.16 (its bundled Claude Code, the same mock) ends it ERROR, "Agent turn timed out after
    10s (iteration 1)", after sending "Your working directory is: <dir>\\n\\n<prompt>"."""
    import_tasks([CORPUS / "engine_1_turn_timeout.yaml"])
    experiment = make_experiment(
        tmp_path,
        "experiment_id: claude\nvariants:\n  - variant_id: claude\n"
        "    agent: {type: claude-code, model: claude-sonnet-4-6, max_retries: 0}\n",
    )
    script = [Turn([tool_use("Bash", {"command": SLOW_BASH, "description": "wait"})]), Turn([text("Done.")])]
    with AnthropicMock(script) as api:
        worker = WorkerProcess(tmp_path, extra_env={"ANTHROPIC_API_KEY": "sk-test-not-a-real-key"}).start()
        run = launch_run(experiment, options=LaunchOptions(overrides=[f"agent.base_url={api.url}"]))
        wait_for_run(run, timeout=120, worker=worker)
        asked = [r for r in api.model_requests() if r["body"].get("tools")]

    trial = Trial.objects.get(run=run)
    assert (trial.status, trial.error_category) == ("error", "timeout"), trial.error_message
    assert trial.error_message == "Agent turn timed out after 10s (iteration 1)"
    content = asked[0]["body"]["messages"][0]["content"]
    said = content if isinstance(content, str) else content[-1]["text"]
    assert re.fullmatch(
        r"Your working directory is: /\S+\n\nRun `sleep 25`, then write done.txt holding the word done\.",
        said,
    ), said
