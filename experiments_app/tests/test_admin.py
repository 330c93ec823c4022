import io
import zipfile

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from experiments_app.definitions import import_tasks
from experiments_app.models import Task, TaskSet

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:experiments_app_task_changelist")
UPLOAD = reverse("admin:experiments_app_task_upload")
GOOD_TASK = b"""task_id: uploaded-task
description: from the admin
initial_prompt: Create hello.txt
tags: [upload]
success_criteria:
  - type: file_exists
    path: hello.txt
"""


@pytest.fixture
def examples():
    import_tasks([settings.BASE_DIR / "examples" / "tasks"], task_set="examples")


def _zip(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in files.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def test_it_lists_the_imported_example_tasks(admin_client, examples):
    response = admin_client.get(CHANGELIST)

    assert response.status_code == 200
    for slug in Task.objects.values_list("slug", flat=True):
        assert slug.encode() in response.content


def test_it_searches_tasks_by_text_and_filters_by_tag(admin_client, examples):
    task = Task.objects.first()
    tag = task.tags[0]

    by_text = admin_client.get(CHANGELIST, {"q": task.slug})
    by_tag = admin_client.get(CHANGELIST, {"tag": tag})

    assert task.slug.encode() in by_text.content
    assert by_tag.context["cl"].result_count == Task.objects.with_tags([tag], []).count()


def test_it_keeps_digest_and_version_read_only(admin_client, examples):
    task = Task.objects.first()
    url = reverse("admin:experiments_app_task_change", args=[task.pk])

    form = admin_client.get(url).context["adminform"].form

    assert "version" not in form.fields and "bundle" not in form.fields
    assert "tags" in form.fields and "skip" in form.fields


def test_it_imports_an_uploaded_yaml_file(admin_client):
    upload = SimpleUploadedFile("hello.yaml", GOOD_TASK)

    response = admin_client.post(UPLOAD, {"file": upload, "task_set": "uploads"})

    assert response.status_code == 302
    assert TaskSet.objects.get(name="uploads").tasks.get().slug == "uploaded-task"


def test_it_imports_an_uploaded_zip_of_a_task_folder(admin_client):
    archive = _zip(
        {
            "calc/task.yaml": b"task_id: zipped\ninitial_prompt: fix it\nsandbox:\n  template_sources:\n"
            b"    - type: template_dir\n      path: template\nsuccess_criteria:\n"
            b"  - type: file_exists\n    path: calc.py\n",
            "calc/template/calc.py": b"def add(a, b):\n    return a - b\n",
        }
    )

    response = admin_client.post(UPLOAD, {"file": SimpleUploadedFile("calc.zip", archive)})

    assert response.status_code == 302
    assert Task.objects.get(slug="zipped").bundle.size > 0


def test_it_shows_every_error_and_imports_nothing_from_a_bad_zip(admin_client):
    archive = _zip(
        {
            "good/task.yaml": GOOD_TASK,
            "bad/task.yaml": b"task_id: bad\ninitial_prompt: x\nsuccess_criteria:\n  - type: nope\n",
        }
    )

    response = admin_client.post(UPLOAD, {"file": SimpleUploadedFile("suite.zip", archive)})

    assert response.status_code == 200
    assert b"Nothing was imported" in response.content
    assert b"bad/task.yaml:4" in response.content
    assert b"evalsite-upload-" not in response.content  # no temporary paths leak
    assert Task.objects.count() == 0


def test_it_refuses_a_zip_that_climbs_out_of_its_folder(admin_client):
    archive = _zip({"../evil.yaml": GOOD_TASK})

    response = admin_client.post(UPLOAD, {"file": SimpleUploadedFile("evil.zip", archive)})

    assert b"leaves the archive" in response.content
    assert Task.objects.count() == 0


def test_it_adds_and_removes_tasks_from_a_set_in_bulk(admin_client, examples):
    picked = list(Task.objects.order_by("slug").values_list("pk", flat=True)[:3])

    admin_client.post(
        CHANGELIST,
        {"action": "add_to_set", "_selected_action": picked, "apply": "1", "new_set": "hard-ones"},
    )
    hard = TaskSet.objects.get(name="hard-ones")
    assert sorted(hard.tasks.values_list("pk", flat=True)) == sorted(picked)

    admin_client.post(
        CHANGELIST,
        {"action": "remove_from_set", "_selected_action": picked[:1], "apply": "1", "task_set": hard.pk},
    )
    assert hard.tasks.count() == 2


def test_it_exports_selected_tasks_as_a_zip_that_reimports(admin_client, examples, tmp_path):
    picked = list(Task.objects.values_list("pk", flat=True)[:2])
    digests = dict(Task.objects.filter(pk__in=picked).values_list("slug", "bundle_id"))

    response = admin_client.post(CHANGELIST, {"action": "export_as_yaml", "_selected_action": picked})

    assert response["Content-Type"] == "application/zip"
    zipfile.ZipFile(io.BytesIO(response.content)).extractall(tmp_path)
    Task.objects.all().delete()
    import_tasks([tmp_path])
    assert dict(Task.objects.values_list("slug", "bundle_id")) == digests


def test_it_does_not_let_members_reach_the_upload_form(member_client):
    response = member_client.get(UPLOAD)

    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def _forged(files: dict[str, bytes], declared: int) -> bytes:
    """A zip whose headers declare each member `declared` bytes long, whatever it holds."""
    data = bytearray(_zip(files))
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        start = 0
        while (at := data.find(signature, start)) != -1:
            data[at + offset : at + offset + 4] = declared.to_bytes(4, "little")
            start = at + 4
    return bytes(data)


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("forged.zip", _forged({"t/task.yaml": GOOD_TASK}, 10), b"not a valid zip archive"),
        ("garbage.zip", b"PK\x03\x04 this is not a zip", b"not a valid zip archive"),
        ("bomb.zip", None, b"unpacks to more than"),
    ],
)
def test_it_refuses_forged_damaged_and_bomb_zips_cleanly(admin_client, settings, name, content, fragment):
    if content is None:
        settings.TASK_BUNDLE_MAX_BYTES = 100_000  # the upload may unpack to 10x this
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("t/task.yaml", GOOD_TASK)
            archive.writestr("t/zeros.bin", b"\0" * 5_000_000)  # 5 MB inflating from ~5 KB
        content = buffer.getvalue()
        assert len(content) < 20_000

    response = admin_client.post(UPLOAD, {"file": SimpleUploadedFile(name, content)})

    assert response.status_code == 200
    assert fragment in response.content
    assert Task.objects.count() == 0


def test_it_imports_an_uploaded_zip_of_a_harbor_task_folder(admin_client):
    folder = settings.BASE_DIR / "examples" / "harbor" / "shout-and-count"
    files = {
        f"shout-and-count/{p.relative_to(folder).as_posix()}": p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file()
    }

    response = admin_client.post(
        UPLOAD, {"file": SimpleUploadedFile("harbor.zip", _zip(files)), "task_set": "tb"}
    )

    assert response.status_code == 302
    task = TaskSet.objects.get(name="tb").tasks.get()
    assert task.slug == "shout-and-count" and task.current_version().yaml_path == "task.toml"
    assert task.spec["success_criteria"] == [
        {
            "type": "verifier",
            "description": "tests/test.sh (Harbor's verifier)",
            "tests_dir": "tests",
            "script": "test.sh",
            "timeout": 60,
        }
    ]
