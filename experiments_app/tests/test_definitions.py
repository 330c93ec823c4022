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
