"""ATIF trajectories: a trial's transcript exported, an ATIF file imported into a trial of an
imported run (shown on its page, escaped), files that break the schema refused by step and field,
and the round trip export -> import -> export giving the same JSON."""

import copy
import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from runs_app.analysis import atif
from runs_app.analysis.atif import AtifError, read_trajectory
from runs_app.launching import launch_run
from runs_app.models import Run, Trial, TrialEvent
from runs_app.tests.factories import import_folder_tasks, make_experiment, make_task
from runs_app.tests.workers import wait_for_run

FIXTURES = Path(__file__).parent / "fixtures"
# Written by coder-eval 0.12.16's ATIF writer from a recorded Claude Code stream
# (fixtures/atif/make_coder_eval_trajectory.py).
CODER_EVAL_ATIF = FIXTURES / "atif" / "coder-eval-claude-write.trajectory.json"


def problems(document: dict) -> list[str]:
    with pytest.raises(AtifError) as caught:
        read_trajectory(json.dumps(document), "t.json")
    return caught.value.problems


def test_it_reads_a_trajectory_written_by_coder_eval_as_it_was_written():
    text = CODER_EVAL_ATIF.read_text()
    trajectory = read_trajectory(text)
    assert trajectory.model_dump(mode="json", exclude_none=True) == json.loads(text)
    assert [s.source for s in trajectory.steps] == ["user", "agent", "agent", "agent"]


def test_it_refuses_a_file_that_breaks_the_schema_naming_the_step_and_field():
    good = json.loads(CODER_EVAL_ATIF.read_text())

    broken = copy.deepcopy(good)
    del broken["agent"]["version"]
    assert problems(broken) == ["t.json: agent.version: is required"]

    broken = copy.deepcopy(good)
    broken["steps"][2]["step_id"] = 7
    assert problems(broken) == [
        "t.json: steps[2] (step_id 7): step_id must be 3 (step ids count 1, 2, 3… in order)"
    ]

    broken = copy.deepcopy(good)
    broken["steps"][0]["tool_calls"] = [{"tool_call_id": "a", "function_name": "Bash", "arguments": {}}]
    assert problems(broken) == [
        "t.json: steps[0] (step_id 1): tool_calls is only allowed on an agent step "
        "(this step's source is 'user')"
    ]

    broken = copy.deepcopy(good)
    broken["steps"][3]["observation"] = {"results": [{"source_call_id": "toolu_e21928328bf845298229"}]}
    assert problems(broken) == [
        "t.json: steps[3] (step_id 4): observation.results[0].source_call_id 'toolu_e21928328bf845298229' "
        "names no tool call of this step (an observation answers a call of its own step)"
    ]

    broken = copy.deepcopy(good)
    del broken["steps"][1]["source"]
    assert problems(broken) == ["t.json: steps[1].source (step_id 2): is required"]

    broken = copy.deepcopy(good)
    broken["schema_version"] = "ATIF-v2.0"
    assert problems(broken)[0].startswith("t.json: schema_version: String should match pattern")
    assert problems({**good, "steps": []})[0].startswith("t.json: steps: List should have at least 1 item")
    with pytest.raises(AtifError, match=r"t.json: not JSON"):
        read_trajectory("{", "t.json")


CALL = {"type": "tool_call", "name": "Bash", "input": {"command": "echo hi > out.txt"}, "status": "success"}
AGENT_LINES = [
    {"type": "message", "text": "I will write <b>out.txt</b>"},
    CALL,
    {"type": "usage", "input_tokens": 120, "output_tokens": 30, "cost_usd": 0.002},
    {"type": "message", "text": "done <script>alert(1)</script>"},
]


@pytest.mark.django_db(transaction=True)
def test_a_trial_exports_as_atif_and_round_trips_through_an_imported_trial(
    tmp_path, celery_worker_process, admin_client
):
    make_task(
        tmp_path,
        "writes",
        "task_id: writes\ninitial_prompt: write out.txt\nsuccess_criteria:\n"
        "  - {type: file_exists, path: out.txt}\n",
    )
    import_folder_tasks(tmp_path)
    script = "; ".join(f"echo {json.dumps(json.dumps(line))}" for line in AGENT_LINES) + "; echo hi > out.txt"
    experiment = make_experiment(
        tmp_path,
        "experiment_id: atif\nvariants:\n"
        f"  - variant_id: v\n    agent: {{type: command, command: {json.dumps(script)}}}\n",
    )
    run = wait_for_run(launch_run(experiment), timeout=90, worker=celery_worker_process)
    trial = Trial.objects.get(run=run)
    assert trial.status == Trial.Status.PASSED

    response = admin_client.get(reverse("trial_atif", args=[run.pk, trial.pk]))
    assert response.status_code == 200 and "attachment" in response["Content-Disposition"]
    exported = json.loads(response.content)
    assert exported["agent"]["name"] == "command" and exported["schema_version"] == "ATIF-v1.7"
    steps = exported["steps"]
    assert [(s["step_id"], s["source"], s["message"]) for s in steps] == [
        (1, "user", "write out.txt"),
        (2, "agent", "I will write <b>out.txt</b>"),
        (3, "agent", "done <script>alert(1)</script>"),
    ]
    assert steps[1]["tool_calls"] == [
        {
            "tool_call_id": "call_0",
            "function_name": "Bash",
            "arguments": {"command": "echo hi > out.txt"},
            "extra": {"result_status": "success"},
        }
    ]
    assert exported["final_metrics"]["total_completion_tokens"] == 30
    out = io.StringIO()
    call_command("export_atif", str(trial.pk), stdout=out)
    assert json.loads(out.getvalue()) == exported
    assert_coder_eval_reads(exported, tmp_path)

    # into a trial of an imported (historical) run: the exported run, read back
    call_command("export_coder_eval_run", str(run.pk), str(tmp_path / "ce"), stdout=io.StringIO())
    assert json.loads((tmp_path / "ce/v/writes/00/trajectory.json").read_text()) == exported
    call_command("import_coder_eval_run", str(tmp_path / "ce"), "--experiment", "back", stdout=io.StringIO())
    historical = Trial.objects.get(run__historical=True)
    # the run directory's trajectory.json came along (as coder-eval's `--format harbor` writes it)
    assert atif.trial_trajectory(historical) == exported
    assert historical.events.filter(kind="message", data__atif_step=3).exists()
    (tmp_path / "t.json").write_text(json.dumps(exported))
    out = io.StringIO()
    call_command("import_atif", str(historical.pk), str(tmp_path / "t.json"), stdout=out)
    assert "5 transcript events" in out.getvalue()  # a note, 3 messages, 1 call

    again = io.StringIO()
    call_command("export_atif", str(historical.pk), stdout=again)
    assert json.loads(again.getvalue()) == exported

    page = admin_client.get(historical.get_absolute_url()).content.decode()
    assert "done &lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert(1)" not in page
    assert "user, step 1" in page and "imported ATIF trajectory" in page

    # a trial that ran here keeps its own transcript
    with pytest.raises(CommandError, match="ran here and keeps the transcript it recorded"):
        call_command("import_atif", str(trial.pk), str(tmp_path / "t.json"))


@pytest.mark.django_db
def test_the_trial_page_imports_a_coder_eval_trajectory_for_its_owner_only(admin_client, member):
    call_command("import_coder_eval_run", str(FIXTURES / "coder-eval-runs" / "ab"), stdout=io.StringIO())
    run = Run.objects.get()
    trial = run.trials.order_by("pk").first()
    url = reverse("trial_atif_import", args=[run.pk, trial.pk])
    page = admin_client.get(trial.get_absolute_url()).content.decode()
    assert 'data-testid="atif-import"' in page

    member_client = Client()
    member_client.force_login(member)
    assert 'data-testid="atif-import"' not in member_client.get(trial.get_absolute_url()).content.decode()
    with CODER_EVAL_ATIF.open("rb") as handle:
        assert member_client.post(url, {"file": handle}).status_code == 403
    with CODER_EVAL_ATIF.open("rb") as handle:
        response = admin_client.post(url, {"file": handle}, follow=True)
    assert "Imported coder-eval-claude-write.trajectory.json" in response.content.decode()
    kinds = list(TrialEvent.objects.filter(trial=trial).values_list("kind", flat=True))
    assert kinds == ["system", "message", "message", "tool_call", "tool_result", "message"]
    exported = admin_client.get(reverse("trial_atif", args=[run.pk, trial.pk]))
    assert json.loads(exported.content) == json.loads(CODER_EVAL_ATIF.read_text())

    bad = io.BytesIO(b'{"schema_version": "ATIF-v1.7", "agent": {"name": "x"}, "steps": []}')
    bad.name = "bad.json"
    response = admin_client.post(url, {"file": bad}, follow=True)
    text = response.content.decode()
    assert "Nothing imported: bad.json: agent.version: is required" in text
    assert TrialEvent.objects.filter(trial=trial).count() == 6  # the refused file changed nothing


def assert_coder_eval_reads(exported: dict, tmp_path: Path) -> None:
    """coder-eval's own ATIF models, and its hydrator (what `evaluate --format harbor` grades
    from), take the exported trajectory: the tool call comes back as a command."""
    from runs_app.tests.coder_eval_cli import coder_eval_python

    check = (
        "import sys; from coder_eval.harbor.atif_models import Trajectory; "
        "from coder_eval.harbor.atif_hydrate import trajectory_to_turn_records as turns; "
        "t = Trajectory.model_validate_json(open(sys.argv[1]).read()); "
        "print([c.parameters for r in turns(t) for c in r.commands])"
    )
    path = tmp_path / "exported.json"
    path.write_text(json.dumps(exported))
    done = subprocess.run(
        [str(coder_eval_python()), "-c", check, str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[{'command': 'echo hi > out.txt'}]"


@pytest.mark.django_db
def test_a_run_directory_with_an_invalid_trajectory_is_refused_by_file_step_and_field(tmp_path):
    shutil.copytree(FIXTURES / "coder-eval-runs" / "ab", tmp_path / "ab")
    task_json = sorted((tmp_path / "ab").glob("*/**/task.json"))[0]
    broken = json.loads(CODER_EVAL_ATIF.read_text())
    broken["steps"][1]["source"] = "assistant"
    task_json.with_name("trajectory.json").write_text(json.dumps(broken))
    with pytest.raises(CommandError) as caught:
        call_command("import_coder_eval_run", str(tmp_path / "ab"), stdout=io.StringIO())
    where = task_json.with_name("trajectory.json")
    assert f"{where}: steps[1].source (step_id 2): Input should be 'system', 'user' or 'agent'" in str(
        caught.value
    )
    assert not Run.objects.exists()


def test_it_refuses_json_nested_too_deeply():
    with pytest.raises(AtifError, match="nested too deeply"):
        read_trajectory("[" * 100_000 + "]" * 100_000, "deep.json")


@pytest.mark.django_db
def test_an_imported_coder_eval_trial_without_a_trajectory_exports_its_commands():
    recorded = FIXTURES / "coder-eval-runs" / "report-schema"
    call_command("import_coder_eval_run", str(recorded), stdout=io.StringIO(), stderr=io.StringIO())
    trial = Trial.objects.filter(events__kind="tool_call").distinct().order_by("pk").first()
    calls = list(trial.events.filter(kind="tool_call").order_by("seq"))
    exported = atif.trial_trajectory(trial)
    read_trajectory(json.dumps(exported))  # valid
    steps = exported["steps"]
    assert steps[0] == {"step_id": 1, "source": "user", "message": trial.prompt}
    made = [c for s in steps for c in s.get("tool_calls", [])]
    assert [c["tool_call_id"] for c in made] == [c.data["id"] for c in calls]
    assert all(c["extra"]["result_status"] in ("success", "error") for c in made)
    answered = [r["source_call_id"] for s in steps for r in s.get("observation", {}).get("results", [])]
    assert answered == [c.data["id"] for c in calls]


@pytest.mark.django_db
def test_thinking_parallel_calls_and_a_simulated_reply_become_steps_in_order():
    from django.utils import timezone

    from runs_app.tests.web.builders import finish_trial, launched_run

    trial = finish_trial(launched_run().trials.order_by("pk").first(), "passed")
    events = [
        ("message", {"thinking": True, "text": "plan"}),
        ("message", {"text": "two calls"}),
        ("tool_call", {"id": "a", "name": "Read", "input": {"path": "x"}}),
        ("tool_call", {"id": "b", "name": "Bash", "input": {"command": "ls"}}),
        ("tool_result", {"id": "b", "output": "x", "is_error": True}),
        ("tool_result", {"id": "a", "output": {"lines": 1}}),
        ("tool_result", {"id": "zz", "output": "a result of no recorded call"}),
        ("message", {"role": "user", "text": "and now?", "turn": 2}),
        ("tool_call", {"id": "c", "name": "Bash", "input": "raw"}),
    ]
    now = timezone.now()
    TrialEvent.objects.bulk_create(
        TrialEvent(trial=trial, seq=i, at=now, kind=kind, data=data)
        for i, (kind, data) in enumerate(events, 1)
    )
    steps = atif.trial_trajectory(trial)["steps"]
    assert [(s["source"], s["message"], s.get("reasoning_content")) for s in steps] == [
        ("user", trial.prompt, None),
        ("agent", "two calls", "plan"),
        ("user", "and now?", None),
        ("agent", "", None),
    ]
    assert [c["tool_call_id"] for c in steps[1]["tool_calls"]] == ["a", "b"]
    assert steps[1]["observation"]["results"] == [
        {"source_call_id": "b", "content": "x", "extra": {"is_error": True}},
        {"source_call_id": "a", "content": '{"lines": 1}'},
    ]
    assert steps[3]["tool_calls"][0]["arguments"] == {"input": "raw"}
