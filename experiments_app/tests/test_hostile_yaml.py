"""Hostile YAML never kills a process: the size and depth are checked before libyaml builds
anything, and every refusal is an error at its line (a form error, an import problem), never a
crash. 100,000 nested `[` segfaulted PyYAML's C composer (the uvicorn worker, `import_tasks`
exit 139); 500 levels raised RecursionError in the form (a 500)."""

import subprocess
import sys

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from experiments_app.models import Experiment, Task, TaskSet
from experiments_app.specs.loading import load_tasks
from experiments_app.specs.yaml_errors import MAX_YAML_BYTES
from experiments_app.tests.factories import smoke_experiment
from experiments_app.tests.test_views_experiments import _form_data, _two_variants

DEEP = "[" * 100_000
BILLION_LAUGHS = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]" for i in range(8)]
)
HOSTILE = {
    "100000 nested [": (DEEP, "nested more than 40 levels deep"),
    "500 nested [": ("[" * 500 + "]" * 500, "nested more than 40 levels deep"),
    "a billion laughs": (BILLION_LAUGHS, "alias bomb"),
    "an alias loop": ("a: &a [*a]", "contains it (a loop)"),
    "an impossible date": ("a: 2024-02-30", "a value cannot be read as its type: day is out of range"),
    "a tagged non-number": ("a: 1\nb: !!int x", "a value cannot be read as its type: invalid literal"),
    "3 MB": ("a: " + "x" * (MAX_YAML_BYTES + 1), "more than the 2,097,152 evalsite reads"),
}


def test_100000_nested_brackets_are_refused_before_libyaml_builds_them():
    # In a process of its own: a regression would segfault it, not this test run.
    code = (
        "from experiments_app.specs.yaml_errors import load_yaml\n"
        "try:\n    load_yaml('[' * 100_000)\nexcept Exception as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=settings.BASE_DIR, capture_output=True, text=True)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "line 1: the YAML is nested more than 40 levels deep"


def test_the_import_command_refuses_a_deep_task_file_and_exits_normally(tmp_path):
    (tmp_path / "deep.yaml").write_text(DEEP)
    done = subprocess.run(
        [sys.executable, "manage.py", "import_tasks", str(tmp_path / "deep.yaml")],
        cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert done.returncode == 1, (done.returncode, done.stderr)  # a CommandError, not a signal
    assert "deep.yaml:1: the YAML is nested more than 40 levels deep" in done.stderr


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_task_file_is_an_import_problem_at_its_line(tmp_path, name):
    text, message = HOSTILE[name]
    (tmp_path / "task.yaml").write_text(text)

    result = load_tasks([tmp_path])

    assert not result.ok and any(message in str(issue) for issue in result.errors), result.errors


def test_a_dataset_row_nested_too_deeply_is_an_import_problem(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"id": "a"}\n' + "[" * 100_000 + "\n")
    (tmp_path / "task.yaml").write_text(
        "task_id: rows\ninitial_prompt: go ${row.id}\ndataset: {paths: [rows.jsonl]}\n"
        "success_criteria:\n  - {type: file_exists, path: a}\n"
    )

    result = load_tasks([tmp_path])

    assert any("rows.jsonl:2" in str(e) and "nested too deeply" in str(e) for e in result.errors), (
        result.errors
    )


@pytest.mark.django_db
def test_a_task_set_upload_of_100000_nested_brackets_is_refused_with_a_message(admin_client):
    TaskSet.objects.create(name="uploaded")
    upload = reverse("taskset_upload", args=["uploaded"])

    response = admin_client.post(
        upload, {"file": SimpleUploadedFile("deep.yaml", DEEP.encode())}, follow=True
    )

    page = response.content.decode()
    assert response.status_code == 200 and "nested more than 40 levels deep" in page
    assert "Nothing was imported" in page and not Task.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize(
    "form_name, field",
    [
        ("form", "run_limits"), ("form", "other_defaults"), ("form", "gates"),
        (1, "options"), (1, "run_limits"), (1, "other"),
    ],
)  # fmt: skip
def test_every_yaml_field_of_the_experiment_form_answers_a_form_error(member_client, name, form_name, field):
    smoke_experiment()
    text, message = HOSTILE[name]
    key = field if form_name == "form" else f"variants-{form_name}-{field}"

    response = member_client.post(reverse("experiment_create"), _form_data(*_two_variants(), **{key: text}))

    assert response.status_code == 200
    form = response.context["form"] if form_name == "form" else response.context["formset"][form_name]
    assert any(message in error for error in form.errors.get(field, [])), form.errors
    assert not Experiment.objects.filter(slug="ab-test").exists()
