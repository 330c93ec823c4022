"""An experiment and its files as one zip: downloaded, uploaded back to the same digest; every
entry checked; all or nothing."""

import io
import json
import zipfile

import pytest
from django.contrib.auth.models import Group
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.urls import reverse

from experiments_app.definitions import (
    MANIFEST,
    ImportFailed,
    experiment_zip,
    import_experiment,
    import_experiment_upload,
)
from experiments_app.models import Bundle, Experiment
from experiments_app.specs.bundles import read_bundle
from experiments_app.tests.factories import EXAMPLES
from experiments_app.tests.test_views_experiments import _form_data, _variant

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo():
    from experiments_app.definitions import import_tasks

    import_tasks([EXAMPLES / "tasks"], task_set="examples")
    return import_experiment(EXAMPLES / "experiments" / "demo.yaml", root=EXAMPLES).experiment


def upload(content: bytes, name: str = "exp.zip") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, content)


def zipped(entries: dict[str, bytes | str], symlinks: tuple[str, ...] = ()) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in entries.items():
            info = zipfile.ZipInfo(name)
            if name in symlinks:
                info.external_attr = 0o120777 << 16
            archive.writestr(info, content)
    return buffer.getvalue()


def variants_of(experiment: Experiment) -> list[tuple]:
    return [(v.slug, v.agent, v.run_limits, v.position) for v in experiment.variants.order_by("position")]


def test_an_imported_experiment_zips_with_its_files_and_comes_back_the_same(demo):
    content = experiment_zip(demo)

    with zipfile.ZipFile(io.BytesIO(content)) as archive:
        names = archive.namelist()
        manifest = json.loads(archive.read(MANIFEST))
        yaml_text = archive.read("experiments/demo.yaml").decode()
    assert names == ["agents/scripted_agent.py", "experiments/demo.yaml", MANIFEST]
    assert manifest["experiment"] == "experiments/demo.yaml" and manifest["digest"] == demo.bundle_id
    assert yaml_text == demo.source_yaml  # the file as it was written, comments and all
    assert experiment_zip(demo) == content  # the same experiment gives the same bytes

    before = (demo.bundle_id, variants_of(demo), demo.defaults, demo.gates)
    demo.delete()
    report = import_experiment_upload(upload(content))

    again = report.experiment
    assert report.created and report.warnings == []
    assert (again.bundle_id, variants_of(again), again.defaults, again.gates) == before


def test_a_form_made_experiment_with_an_attachment_round_trips_to_the_same_digest(admin_client, demo):
    attached = SimpleUploadedFile("agent.py", b"print('from the form')\n")
    variant = _variant(1, "mine", "command", command="python3 {script}", script="agent.py")
    data = _form_data(_variant(0, "reference", "oracle"), variant, experiment_id="formed", name="Made here")
    created = admin_client.post(reverse("experiment_create"), {**data, "attachment": attached})
    assert created.status_code == 302
    formed = Experiment.objects.get(slug="formed")
    # Its bundle is what importing its YAML with its files gives: the YAML as it stands, the script.
    assert set(read_bundle(bytes(formed.bundle.data))) == {"experiment.yaml", "agent.py"}

    response = admin_client.get(reverse("experiment_bundle", args=["formed"]))
    assert response.status_code == 200 and response["Content-Type"] == "application/zip"
    stored = formed.bundle_id
    formed.delete()

    uploaded = admin_client.post(
        reverse("experiment_import"), {"file": upload(response.content, "formed.zip")}, follow=True
    )

    again = Experiment.objects.get(slug="formed")
    assert "Imported experiment formed." in uploaded.content.decode()
    assert again.bundle_id == stored and again.name == "Made here"
    assert again.variants.get(slug="mine").agent["script"] == "agent.py"


def test_the_yaml_download_says_where_the_files_it_names_are(member_client, demo):
    text = member_client.get(reverse("experiment_yaml", args=["demo"])).content.decode()

    assert text.startswith("# Names files this YAML does not hold (agents/scripted_agent.py): ")
    assert reverse("experiment_bundle", args=["demo"]) in text.splitlines()[0]


def test_an_upload_does_not_replace_an_experiment_unless_asked(demo):
    content = experiment_zip(demo)

    with pytest.raises(ImportFailed, match="an experiment 'demo' exists already"):
        import_experiment_upload(upload(content))

    report = import_experiment_upload(upload(content), replace=True)
    assert not report.created and report.experiment.pk == demo.pk


def test_a_member_may_not_upload_a_command_agent(member, demo):
    content = experiment_zip(demo)
    demo.delete()

    with pytest.raises(ImportFailed, match="may define a command agent"):
        import_experiment_upload(upload(content), user=member)
    assert not Experiment.objects.filter(slug="demo").exists()

    member.groups.add(Group.objects.create(name="agent-authors"))
    assert import_experiment_upload(upload(content), user=member).experiment.created_by == member


GOOD_YAML = "experiment_id: zipped\nvariants:\n  - variant_id: a\n    agent: {type: oracle}\n"


@pytest.mark.parametrize(
    "entries, symlinks, problem",
    [
        ({"../evil.yaml": GOOD_YAML}, (), "path leaves the archive's folder"),
        ({"/etc/evil.yaml": GOOD_YAML}, (), "path leaves the archive's folder"),
        ({"exp.yaml": GOOD_YAML, "link": "/etc/passwd"}, ("link",), "symbolic links are not accepted"),
        ({"a.yaml": GOOD_YAML, "b.yaml": GOOD_YAML.replace("zipped", "other")}, (), "2 experiment YAMLs"),
        ({"notes.txt": "hi"}, (), "no experiment YAML"),
        ({"exp.yaml": GOOD_YAML, MANIFEST: '{"experiment": "../exp.yaml"}'}, (), "name the experiment's"),
        ({"exp.yaml": GOOD_YAML, MANIFEST: "{not json"}, (), "not valid JSON"),
        ({"exp.yaml": GOOD_YAML.replace("{type: oracle}", "{type: nope}")}, (), "unknown agent type"),
        ({"exp.yaml": GOOD_YAML.replace("oracle}", "command, script: gone.py}")}, (), "not found"),
    ],
)
def test_a_bad_zip_imports_nothing_and_says_why(entries, symlinks, problem):
    bundles = Bundle.objects.count()

    with pytest.raises(ImportFailed) as failed:
        import_experiment_upload(upload(zipped(entries, symlinks)))

    assert any(problem in issue for issue in failed.value.issues), failed.value.issues
    assert not Experiment.objects.exists() and Bundle.objects.count() == bundles


def test_a_zip_over_the_size_cap_or_not_a_zip_is_refused(settings):
    settings.TASK_BUNDLE_MAX_BYTES = 4096
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("exp.yaml", GOOD_YAML)
        archive.writestr("big.bin", b"\0" * 1_000_000)  # a few KB packed, 1 MB unpacked

    with pytest.raises(ImportFailed, match="unpacks to more than 4096 bytes"):
        import_experiment_upload(upload(bomb.getvalue()))
    with pytest.raises(ImportFailed, match="not a valid zip archive"):
        import_experiment_upload(upload(b"PK\x03\x04 garbage"))
    with pytest.raises(ImportFailed, match="larger than 4096 bytes"):
        import_experiment_upload(upload(b"x" * 5000))
    with pytest.raises(ImportFailed, match=r"expected an experiment's .zip"):
        import_experiment_upload(upload(b"x", "exp.tar"))
    assert not Experiment.objects.exists()


def test_a_lone_yaml_uploads_too(member_client):
    lone = upload(GOOD_YAML.encode(), "z.yaml")
    response = member_client.post(reverse("experiment_import"), {"file": lone})

    assert response["Location"] == reverse("experiment_detail", args=["zipped"])


def test_a_failed_upload_on_the_page_lists_its_problems(member_client):
    response = member_client.post(
        reverse("experiment_import"), {"file": upload(zipped({"../x.yaml": GOOD_YAML}))}, follow=True
    )

    page = response.content.decode()
    assert "path leaves the archive&#x27;s folder" in page and "Nothing was imported: 1 problem(s)." in page


def test_the_command_line_exports_and_imports_the_zip(tmp_path, demo):
    target = tmp_path / "demo.zip"
    call_command("export_experiment", "demo", str(target), stdout=io.StringIO())
    stored = demo.bundle_id
    demo.delete()

    out = io.StringIO()
    call_command("import_experiment", str(target), stdout=out)

    assert "Created experiment demo" in out.getvalue()
    assert Experiment.objects.get(slug="demo").bundle_id == stored
