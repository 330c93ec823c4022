import pytest
from django.urls import reverse

from experiments_app.models import Task, TaskSet
from experiments_app.tests.factories import smoke_experiment

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("name", ["taskset_list", "task_list"])
def test_it_sends_anonymous_visitors_to_login(client, name):
    response = client.get(reverse(name))

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_it_shows_task_sets_and_their_tasks_to_any_member(client, outsider):
    smoke_experiment()
    client.force_login(outsider)

    listing = client.get(reverse("taskset_list"))
    detail = client.get(reverse("taskset_detail", args=["examples"]))

    assert listing.status_code == 200
    assert [(s.name, s.task_count) for s in listing.context["task_sets"]] == [("examples", 14)]
    assert b"/edit/" not in listing.content  # no edit links for non-staff
    assert detail.status_code == 200
    assert len(detail.context["tasks"]) == 14
    assert b"fix-mean" in detail.content


@pytest.mark.parametrize("method", ["get", "post"])
def test_it_lets_only_staff_edit_a_task_set(client, outsider, method):
    smoke_experiment()
    client.force_login(outsider)

    response = getattr(client, method)(reverse("taskset_edit", args=["examples"]), {"name": "hijacked"})

    assert response.status_code == 403
    assert TaskSet.objects.filter(name="examples").exists()


def test_it_lets_staff_rename_a_task_set_and_add_or_remove_tasks_found_by_search(admin_client):
    smoke_experiment()
    smoke = sorted(Task.objects.filter(tags__icontains="smoke").values_list("pk", flat=True))
    url = reverse("taskset_edit", args=["examples"])

    renamed = admin_client.post(url, {"save": "1", "name": "smoke-only", "description": "quick ones"})
    assert renamed.status_code == 302 and renamed["Location"] == reverse("taskset_edit", args=["smoke-only"])
    url = reverse("taskset_edit", args=["smoke-only"])
    TaskSet.objects.get().tasks.clear()

    found = admin_client.get(url, {"tag": "smoke"})
    assert sorted(task.pk for task, _ in found.context["rows"]) == smoke  # the search narrows the list
    added = admin_client.post(f"{url}?tag=smoke", {"action": "add", "tasks": [str(pk) for pk in smoke]})
    assert added.status_code == 302 and "tag=smoke" in added["Location"]
    assert sorted(TaskSet.objects.get().tasks.values_list("pk", flat=True)) == smoke
    admin_client.post(url, {"action": "remove", "tasks": [str(smoke[0])]})
    assert sorted(TaskSet.objects.get().tasks.values_list("pk", flat=True)) == smoke[1:]


def test_staff_create_and_archive_task_sets_and_members_may_not(admin_client, member):
    from django.test import Client

    someone = Client()
    someone.force_login(member)
    assert someone.post(reverse("taskset_create"), {"save": "1", "name": "mine"}).status_code == 403
    created = admin_client.post(
        reverse("taskset_create"), {"save": "1", "name": "nightly", "description": ""}
    )
    assert created.status_code == 302 and TaskSet.objects.filter(name="nightly").exists()
    edit = reverse("taskset_edit", args=["nightly"])
    admin_client.post(edit, {"save": "1", "name": "nightly", "description": "", "archived": "on"})

    listed = admin_client.get(reverse("taskset_list")).context["task_sets"]
    with_archived = admin_client.get(reverse("taskset_list"), {"archived": "1"}).context["task_sets"]
    assert "nightly" not in [t.name for t in listed] and "nightly" in [t.name for t in with_archived]


def test_staff_upload_tasks_into_a_set_and_export_it_as_a_zip(admin_client, tmp_path):
    import io
    import zipfile

    from django.core.files.uploadedfile import SimpleUploadedFile

    TaskSet.objects.create(name="uploaded")
    good = b"task_id: up-one\ninitial_prompt: go\nsuccess_criteria:\n  - {type: file_exists, path: a}\n"
    bad = b"task_id: up-two\ninitial_prompt: go\nsuccess_criteria:\n  - {type: file_exsts, path: a}\n"
    upload = reverse("taskset_upload", args=["uploaded"])

    refused = admin_client.post(upload, {"file": SimpleUploadedFile("two.yaml", bad)}, follow=True)
    assert (
        "Nothing was imported" in refused.content.decode() and not Task.objects.filter(slug="up-two").exists()
    )
    admin_client.post(upload, {"file": SimpleUploadedFile("one.yaml", good)})
    assert list(TaskSet.objects.get(name="uploaded").tasks.values_list("slug", flat=True)) == ["up-one"]

    exported = admin_client.get(reverse("taskset_export", args=["uploaded"]))
    assert exported["Content-Type"] == "application/zip"
    names = zipfile.ZipFile(io.BytesIO(exported.content)).namelist()
    assert any(name.endswith(".yaml") and "up-one" in name for name in names), names


def test_it_filters_tasks_by_tag_and_text(member_client, django_assert_max_num_queries):
    smoke_experiment()
    member_client.get(reverse("task_list"))

    with django_assert_max_num_queries(6):  # session, user, tag match, count, page, task sets
        smoke = member_client.get(reverse("task_list"), {"tag": "smoke"})
    by_text = member_client.get(reverse("task_list"), {"q": "slugify"})

    assert len(smoke.context["page"]) == 3
    assert [t.slug for t in by_text.context["page"]] == ["slugify"]


def test_it_shows_a_task_with_its_prompt_criteria_and_yaml(member_client):
    smoke_experiment()
    task = Task.objects.get(slug="fix-mean")

    response = member_client.get(reverse("task_detail", args=["fix-mean"]))

    assert response.status_code == 200
    body = response.content.decode()
    assert "Our nightly report shows wrong averages" in body
    assert len(response.context["criteria"]) == len(task.spec["success_criteria"])
    assert "task_id: fix-mean" in body


def test_it_imports_and_shows_a_task_whose_id_holds_dots(member_client, tmp_path):
    from experiments_app.definitions import import_tasks

    (tmp_path / "task.yaml").write_text(
        "task_id: my.task\ninitial_prompt: Create out.txt\n"
        "success_criteria:\n  - type: file_exists\n    path: out.txt\n"
    )
    import_tasks([tmp_path])

    response = member_client.get(reverse("task_detail", args=["my.task"]))

    assert response.status_code == 200 and b"my.task" in response.content
    assert Task.objects.get(slug="my.task").full_clean() is None


def _zip(files: dict[str, bytes]) -> bytes:
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in files.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def _harbor_files(prefix: str = "") -> dict[str, bytes]:
    """The example hello-world Harbor task's files, under `prefix`."""
    from django.conf import settings

    folder = settings.BASE_DIR / "examples" / "harbor" / "hello-world"
    return {
        prefix + path.relative_to(folder).as_posix(): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_staff_upload_harbor_folders_beside_yaml_tasks_into_a_set(admin_client):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from experiments_app.specs.bundles import read_bundle

    TaskSet.objects.create(name="mixed")
    upload = reverse("taskset_upload", args=["mixed"])
    suite = _zip(
        {
            **_harbor_files("suite/hello-world/"),
            "suite/yaml-one/task.yaml": b"task_id: yaml-one\ninitial_prompt: go\n"
            b"success_criteria:\n  - {type: file_exists, path: a}\n",
            # coder-eval's container task: its build context travels with it.
            "suite/boxed/task.yaml": b"task_id: boxed\ninitial_prompt: go\nsandbox:\n  driver: docker\n"
            b"  python: null\n  docker: {dockerfile_path: env/Dockerfile}\n"
            b"success_criteria:\n  - {type: file_exists, path: a}\n",
            "suite/boxed/env/Dockerfile": b"FROM debian:bookworm-slim\nCOPY data.txt /data.txt\n",
            "suite/boxed/env/data.txt": b"42\n",
        }
    )
    # A zip of one folder's contents is that folder: the zip's name is the task's id.
    single = _zip(_harbor_files())

    admin_client.post(upload, {"file": SimpleUploadedFile("suite.zip", suite)})
    admin_client.post(upload, {"file": SimpleUploadedFile("greeting.zip", single)})

    members = TaskSet.objects.get(name="mixed").tasks.order_by("slug")
    assert list(members.values_list("slug", flat=True)) == ["boxed", "greeting", "hello-world", "yaml-one"]
    assert members.get(slug="greeting").bundle_id == members.get(slug="hello-world").bundle_id
    assert members.get(slug="hello-world").spec["sandbox"]["driver"] == "docker"
    boxed = members.get(slug="boxed")
    assert boxed.spec["sandbox"]["docker"] == {"dockerfile_path": "env/Dockerfile"}
    assert sorted(read_bundle(bytes(boxed.bundle.data))) == ["env/Dockerfile", "env/data.txt", "task.yaml"]


def test_it_shows_a_harbor_folders_problems_at_their_lines_and_imports_nothing(admin_client):
    from django.core.files.uploadedfile import SimpleUploadedFile

    TaskSet.objects.create(name="mixed")
    files = _harbor_files("hello-world/")
    files["hello-world/task.toml"] = files["hello-world/task.toml"].replace(
        b"allow_internet = false", b"allow_internet = true\ngpus = 2"
    )
    del files["hello-world/tests/test.sh"]

    response = admin_client.post(
        reverse("taskset_upload", args=["mixed"]),
        {"file": SimpleUploadedFile("bad.zip", _zip(files))},
        follow=True,
    )

    body = response.content.decode()
    assert "Nothing was imported: 3 problem(s)." in body
    assert "hello-world/task.toml:21: environment.gpus: Harbor&#x27;s environment.gpus (GPUs:" in body
    assert "hello-world/task.toml:20: environment.allow_internet:" in body
    assert "hello-world/tests/test.sh: not found" in body
    assert "evalsite-upload-" not in body
    assert not Task.objects.exists()


def test_it_shows_a_harbor_task_with_its_instruction_verifier_and_task_toml(member_client):
    from django.conf import settings

    from experiments_app.definitions import import_tasks

    import_tasks([settings.BASE_DIR / "examples" / "harbor" / "hello-world"])

    response = member_client.get(reverse("task_detail", args=["hello-world"]))

    body = response.content.decode()
    assert response.status_code == 200
    assert "Create a file named `hello.txt`" in body
    assert [c["type"] for c in response.context["criteria"]] == ["verifier"]
    assert "allow_internet = false" in body
