import os
import shutil
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from experiments_app.definitions import ImportFailed, import_experiment, import_tasks, store_recorded_task
from experiments_app.models import Experiment, Task, TaskSet, TaskVersion

EXAMPLES = settings.BASE_DIR / "examples"

pytestmark = pytest.mark.django_db


@pytest.fixture
def suite(tmp_path) -> Path:
    """A private copy of the example tasks that a test may break."""
    return Path(shutil.copytree(EXAMPLES / "tasks", tmp_path / "tasks"))


def test_it_imports_every_example_task():
    report = import_tasks([EXAMPLES / "tasks"], task_set="examples")

    example_ids = sorted(p.parent.name for p in (EXAMPLES / "tasks").glob("*/task.yaml"))
    assert len(example_ids) >= 12
    assert sorted(report.created) == sorted(Task.objects.values_list("slug", flat=True))
    assert len(report.created) == len(example_ids)
    assert TaskSet.objects.get(name="examples").tasks.count() == len(example_ids)
    assert TaskVersion.objects.count() == len(example_ids)
    assert all(task.bundle.size > 0 for task in Task.objects.select_related("bundle"))


def test_it_imports_the_demo_experiments():
    import_tasks([EXAMPLES / "tasks"])

    demo = import_experiment(EXAMPLES / "experiments" / "demo.yaml", root=EXAMPLES).experiment
    import_experiment(EXAMPLES / "experiments" / "smoke.yaml", root=EXAMPLES)

    assert {v.slug for v in demo.variants.all()} >= {"reference", "no-op", "scripted", "claude"}
    assert demo.baseline.slug == "no-op"
    assert demo.repeats == 2
    assert demo.selected_tasks().count() == Task.objects.count()
    smoke = Experiment.objects.get(slug="smoke")
    assert 0 < smoke.selected_tasks().count() < Task.objects.count()


def test_it_imports_nothing_when_one_file_in_the_folder_is_bad(suite):
    bad = suite / "zz-broken" / "task.yaml"
    bad.parent.mkdir()
    bad.write_text("task_id: broken\ninitial_prompt: hi\nsuccess_criteria:\n  - type: no_such_check\n")

    with pytest.raises(ImportFailed) as excinfo:
        import_tasks([suite])

    assert any("zz-broken/task.yaml:4" in issue for issue in excinfo.value.issues)
    assert Task.objects.count() == 0
    assert TaskVersion.objects.count() == 0


def test_it_treats_an_unchanged_reimport_as_a_no_op(suite):
    import_tasks([suite])

    report = import_tasks([suite])

    assert report.created == [] and report.updated == []
    assert len(report.unchanged) == Task.objects.count()
    assert set(Task.objects.values_list("version", flat=True)) == {1}
    assert TaskVersion.objects.count() == Task.objects.count()


def test_it_makes_a_new_version_of_a_changed_task_and_keeps_the_old_one(suite):
    import_tasks([suite])
    task_yaml = next(suite.glob("*/task.yaml"))
    slug = Task.objects.get(source_path__endswith=f"{task_yaml.parent.name}/task.yaml").slug
    old = Task.objects.get(slug=slug)
    old_digest, old_yaml = old.bundle_id, old.source_yaml
    task_yaml.write_text(task_yaml.read_text().replace("description:", "description: (v2)", 1))

    report = import_tasks([suite])

    assert report.updated == [slug]
    task = Task.objects.get(slug=slug)
    assert task.version == 2
    assert task.bundle_id != old_digest
    v1 = task.versions.get(number=1)
    assert (v1.bundle_id, v1.source_yaml) == (old_digest, old_yaml)
    assert task.versions.get(number=2).bundle_id == task.bundle_id


def test_it_makes_a_new_version_when_only_a_template_file_changes(suite):
    import_tasks([suite])
    template_file = next(p for p in suite.glob("*/template/*.py"))
    template_file.write_text(template_file.read_text() + "\n# changed\n")

    report = import_tasks([suite])

    assert len(report.updated) == 1


def test_it_round_trips_export_and_import_to_the_same_digests(suite, tmp_path):
    import_tasks([suite], task_set="mine")
    before = dict(Task.objects.values_list("slug", "bundle_id"))

    out = tmp_path / "exported"
    call_command("export_tasks", "--set", "mine", str(out))
    Task.objects.all().delete()
    report = import_tasks([out])

    assert sorted(report.created) == sorted(before)
    assert dict(Task.objects.values_list("slug", "bundle_id")) == before


def test_it_refuses_an_experiment_naming_a_missing_task_set(tmp_path):
    yaml_file = tmp_path / "exp.yaml"
    yaml_file.write_text(
        "experiment_id: needs-set\ntask_sets: [nope]\nvariants:\n  - variant_id: a\n    agent: {type: none}\n"
    )

    with pytest.raises(ImportFailed, match="no task set named 'nope'"):
        import_experiment(yaml_file)
    assert not Experiment.objects.exists()


def test_it_replaces_variants_on_reimport(tmp_path):
    yaml_file = tmp_path / "exp.yaml"
    yaml_file.write_text(
        "experiment_id: ab\nvariants:\n  - variant_id: a\n    agent: {type: none}\n"
        "  - variant_id: b\n    agent: {type: oracle}\n"
    )
    import_experiment(yaml_file)
    yaml_file.write_text(
        "experiment_id: ab\nbaseline: c\nvariants:\n  - variant_id: c\n    agent: {type: none}\n"
    )

    experiment = import_experiment(yaml_file).experiment

    assert list(experiment.variants.values_list("slug", flat=True)) == ["c"]
    assert experiment.baseline.slug == "c"


def test_the_command_lists_every_problem_and_exits_with_an_error(suite):
    for name in ("aa-bad", "zz-bad"):
        (suite / name).mkdir()
        (suite / name / "task.yaml").write_text("task_id: [not, a, string]\n")

    with pytest.raises(CommandError) as excinfo:
        call_command("import_tasks", str(suite))

    message = str(excinfo.value)
    assert "nothing imported" in message
    assert "aa-bad/task.yaml:1" in message and "zz-bad/task.yaml:1" in message
    assert Task.objects.count() == 0


def test_a_task_first_known_from_a_run_record_becomes_runnable_when_its_yaml_is_imported(tmp_path):
    text = "task_id: seen\ninitial_prompt: Create out.txt\n"
    text += "success_criteria:\n  - type: file_exists\n    path: out.txt\n"
    store_recorded_task(
        "seen", spec={"task_id": "seen"}, source_yaml=text, yaml_name="task.yaml", prompt="Create out.txt",
        description="", tags=[], source_path="runs/x", warnings=[],
    )  # fmt: skip
    (tmp_path / "task.yaml").write_text(text)

    report = import_tasks([tmp_path])

    task = Task.objects.get(slug="seen")
    assert report.updated == ["seen"] and report.unchanged == []
    assert task.skip is False and task.version == 2


# --- container tasks: Harbor folders and coder-eval's driver: docker ----------------------------

CONTAINER_TASK = """\
task_id: count-lines
initial_prompt: "Write the number of lines of /app/data.txt to /app/count.txt."
sandbox:
  driver: docker
  python: null
  docker:
    dockerfile_path: environment/Dockerfile
    working_dir: auto
  limits: {max_cpus: 1, max_memory_mb: 512}
success_criteria:
  - type: file_contains
    path: count.txt
    includes: ["3"]
"""


@pytest.fixture
def containers(tmp_path) -> Path:
    """The example Harbor tasks and a coder-eval docker task, side by side in one folder."""
    root = Path(shutil.copytree(EXAMPLES / "harbor", tmp_path / "containers"))
    (root / "count-lines" / "environment").mkdir(parents=True)
    (root / "count-lines" / "task.yaml").write_text(CONTAINER_TASK)
    (root / "count-lines" / "environment" / "Dockerfile").write_text(
        "FROM debian:bookworm-slim\nWORKDIR /app\n"
    )
    (root / "count-lines" / "environment" / "data.txt").write_text("a\nb\nc\n")
    return root


def test_the_command_imports_harbor_folders_beside_yaml_container_tasks(containers):
    from experiments_app.specs.bundles import read_bundle

    call_command("import_tasks", str(containers), "--set", "containers")

    tasks = {task.slug: task for task in TaskSet.objects.get(name="containers").tasks.all()}
    assert sorted(tasks) == ["count-lines", "hello-world", "shout-and-count"]
    hello = tasks["hello-world"]
    version = hello.current_version()
    assert version.yaml_path == "task.toml" and hello.source_yaml.startswith('version = "1.0"')
    assert hello.prompt.startswith("Create a file named `hello.txt`")
    assert (
        hello.spec["sandbox"]["driver"] == "docker" and hello.spec["initial_prompt_file"] == "instruction.md"
    )
    assert hello.spec["success_criteria"][0]["type"] == "verifier"
    assert "category:file-operations" in hello.tags
    assert sorted(read_bundle(bytes(hello.bundle.data))) == [
        "environment/Dockerfile",
        "instruction.md",
        "solution/solve.sh",
        "task.toml",
        "tests/test.sh",
    ]
    counted = tasks["count-lines"]
    assert counted.spec["sandbox"]["docker"] == {
        "dockerfile_path": "environment/Dockerfile",
        "working_dir": "auto",
    }
    assert sorted(read_bundle(bytes(counted.bundle.data))) == [
        "environment/Dockerfile",
        "environment/data.txt",
        "task.yaml",
    ]
    assert import_tasks([containers]).unchanged == ["count-lines", "hello-world", "shout-and-count"]


def test_it_makes_a_new_version_when_a_harbor_folders_test_changes(containers):
    import_tasks([containers])
    (containers / "hello-world" / "tests" / "test.sh").write_text(
        "#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n"
    )

    report = import_tasks([containers])

    assert report.updated == ["hello-world"]
    assert Task.objects.get(slug="hello-world").version == 2


def test_it_exports_a_harbor_task_as_its_folder_and_reimports_it_unchanged(containers, tmp_path):
    import_tasks([containers], task_set="mine")
    before = dict(Task.objects.values_list("slug", "bundle_id"))

    out = tmp_path / "exported"
    call_command("export_tasks", "--set", "mine", str(out))
    for name in (
        "task.toml",
        "instruction.md",
        "environment/Dockerfile",
        "tests/test.sh",
        "solution/solve.sh",
    ):
        assert (out / "hello-world" / name).read_bytes() == (containers / "hello-world" / name).read_bytes()
    assert os.access(out / "hello-world" / "tests" / "test.sh", os.X_OK)
    Task.objects.all().delete()
    import_tasks([out])

    assert dict(Task.objects.values_list("slug", "bundle_id")) == before


def test_the_command_names_each_harbor_problem_at_its_line(containers):
    toml = containers / "hello-world" / "task.toml"
    toml.write_text(toml.read_text().replace("allow_internet = false", "allow_internet = true"))
    (containers / "shout-and-count" / "instruction.md").unlink()

    with pytest.raises(CommandError) as excinfo:
        call_command("import_tasks", str(containers))

    message = str(excinfo.value)
    assert "nothing imported: 2 problem(s)" in message
    assert (
        f"{containers}/hello-world/task.toml:20: environment.allow_internet: allow_internet = true" in message
    )
    assert f"{containers}/shout-and-count/instruction.md: not found" in message
    assert Task.objects.count() == 0
