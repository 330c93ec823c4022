"""A third-party agent kind, installed as a package with an `evalsite.agents` entry point, is one
kind among the others: task and experiment YAML name it, the experiment form offers it, the API
accepts it, and a real worker runs it."""

import textwrap
from pathlib import Path

import pytest
from django.urls import reverse

from conftest import WorkerProcess, purge_broker
from experiments_app.definitions import ImportFailed, import_tasks
from experiments_app.specs import agent_kinds
from runs_app.launching import launch_run
from runs_app.models import Trial
from runs_app.tests.factories import import_folder_tasks, make_experiment, make_task
from runs_app.tests.workers import wait_for_run

pytestmark = pytest.mark.django_db(transaction=True)

PLUGIN = '''
"""A plugin agent kind: runs a shell command (through the runner's sandbox) that writes a file."""

from runs_app.engine.agents.base import AgentInvocation, AgentKind
from runs_app.engine.agents.none import SilentParser


class StampAgent(AgentKind):
    name = "stamp"

    def prepare(self, prompt, workspace, home, config, secrets):
        return AgentInvocation(argv=["sh", "-c", "echo stamped by a plugin > stamp.txt"])

    def parser(self, config=None):
        return SilentParser()
'''


def install(site: Path, monkeypatch, module: str, source: str, group: str, entry: str) -> Path:
    """A tiny installed distribution: a module and its .dist-info with one entry point, on
    sys.path (importlib.metadata finds distributions there, as pip would have installed it)."""
    (site / module).mkdir(parents=True)
    (site / module / "__init__.py").write_text(source)
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{entry}\n")
    monkeypatch.syspath_prepend(str(site))
    return site


@pytest.fixture
def plugin(tmp_path, monkeypatch) -> Path:
    return install(
        tmp_path / "site", monkeypatch, "evalsite_stamp_agent", PLUGIN, "evalsite.agents",
        "stamp = evalsite_stamp_agent:StampAgent",
    )  # fmt: skip


def stamp_suite(folder: Path):
    make_task(
        folder,
        "stamped",
        """
        task_id: stamped
        initial_prompt: stamp it
        agent: {type: stamp}
        success_criteria:
          - type: file_contains
            path: stamp.txt
            includes: [stamped by a plugin]
        """,
    )
    import_folder_tasks(folder)
    return make_experiment(
        folder,
        """
        experiment_id: plugins
        variants:
          - variant_id: stamp
            agent: {type: stamp}
        """,
    )


def test_a_kind_that_is_not_installed_is_refused_on_import(tmp_path):
    task = tmp_path / "tasks" / "t.yaml"
    task.parent.mkdir()
    task.write_text(
        textwrap.dedent("""
        task_id: t
        initial_prompt: x
        agent: {type: stamp}
        success_criteria: [{type: file_exists, path: a}]
    """)
    )

    with pytest.raises(ImportFailed, match=r"t\.yaml:4: agent\.type: unknown agent type 'stamp'"):
        import_tasks([task.parent])


def test_an_installed_plugin_kind_imports_shows_in_the_form_and_runs(plugin, tmp_path, member_client):
    assert agent_kinds.known_kinds()[-1] == "stamp"
    experiment = stamp_suite(tmp_path)

    form = member_client.get(reverse("experiment_create"))
    choices = [value for value, _ in form.context["formset"].empty_form.fields["agent_type"].choices]
    assert "stamp" in choices

    purge_broker()
    worker = WorkerProcess(tmp_path, extra_env={"PYTHONPATH": str(plugin)}).start()
    try:
        run = wait_for_run(launch_run(experiment), timeout=120, worker=worker)
    finally:
        worker.kill()
    trial = Trial.objects.get(run=run)
    assert trial.status == "passed", (trial.error_category, trial.error_message, worker.log()[-3000:])
    assert trial.config["agent"]["type"] == "stamp"


def test_the_api_accepts_a_plugin_kind_for_every_variant(plugin, tmp_path, client, member):
    from runs_app.tokens import create_token

    stamp_suite(tmp_path)
    _, token = create_token(member, "ci")
    headers = {"Authorization": f"Bearer {token}"}

    ok = client.post(
        "/api/experiments/plugins/runs", {"agent_type": "stamp"}, "application/json", headers=headers
    )
    bad = client.post(
        "/api/experiments/plugins/runs", {"agent_type": "stmp"}, "application/json", headers=headers
    )

    assert ok.status_code == 201, ok.content
    assert bad.status_code == 422 and "unknown agent type 'stmp'" in bad.json()["detail"]


ANSWERER_PLUGIN = '''
"""A plugin answerer: tells the agent which word to write, then ends the conversation."""

from runs_app.engine.simulation.answerers import Answerer, Reply


class Dictator(Answerer):
    name = "dictator"

    def answer(self, simulation, conversation, client):
        if any(message.role == "user" for message in conversation):
            return Reply("", stop=True)
        return Reply("write the word plugged-in")
'''
# Writes what the user's latest message asks for (its prompt, on stdin), each turn.
ECHO_AGENT = "cat > said.txt; cat said.txt | sed -n 's/^write the word //p' > word.txt; cat word.txt"


def test_an_installed_answerer_plays_the_user_through_a_real_worker(tmp_path, monkeypatch):
    site = install(
        tmp_path / "site", monkeypatch, "evalsite_dictator", ANSWERER_PLUGIN, "evalsite.answerers",
        "dictator = evalsite_dictator:Dictator",
    )  # fmt: skip
    make_task(
        tmp_path,
        "dictated",
        """
        task_id: dictated
        initial_prompt: wait for the word
        simulation: {enabled: true, answerer: dictator, max_turns: 3}
        success_criteria:
          - type: file_contains
            path: word.txt
            includes: [plugged-in]
        """,
    )
    import_folder_tasks(tmp_path)
    experiment = make_experiment(
        tmp_path,
        f"""
        experiment_id: dictated
        variants:
          - variant_id: echo
            agent: {{type: command, command: "{ECHO_AGENT}"}}
        """,
    )
    purge_broker()
    worker = WorkerProcess(tmp_path, extra_env={"PYTHONPATH": str(site)}).start()
    try:
        run = wait_for_run(launch_run(experiment), timeout=120, worker=worker)
    finally:
        worker.kill()
    trial = Trial.objects.get(run=run)
    assert trial.status == "passed", (trial.error_category, trial.error_message, worker.log()[-3000:])
    assert [(m["role"], m["text"]) for m in trial.trajectory["dialog"]] == [
        ("task", "wait for the word"), ("agent", ""), ("user", "write the word plugged-in"),
        ("agent", ""),
    ]  # fmt: skip
