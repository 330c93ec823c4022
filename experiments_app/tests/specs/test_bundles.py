import gzip
import hashlib
import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from experiments_app.specs.bundles import (
    BundleTooLarge,
    UnsafeBundle,
    extract_bundle,
    make_bundle,
    read_bundle,
    write_bundle_files,
)
from experiments_app.specs.loading import load_tasks

GOOD_TASKS = Path(__file__).parents[1] / "corpus/good/tasks"
FILES = {
    "task.yaml": b"task_id: t\n",
    "template/calc.py": b"x = 1\n",
    "template/run.sh": b"#!/bin/sh\necho hi\n",
}


def tar_blob(*members: tarfile.TarInfo, data: bytes = b"") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return gzip.compress(buf.getvalue())


def test_it_makes_the_same_bytes_whatever_the_order_of_the_files():
    first = make_bundle(FILES, max_bytes=10_000)
    second = make_bundle(dict(reversed(list(FILES.items()))), max_bytes=10_000)

    assert first.blob == second.blob and first.digest == second.digest
    assert first.size == sum(len(v) for v in FILES.values())


def test_it_digests_the_uncompressed_tar():
    bundle = make_bundle(FILES, max_bytes=10_000)

    assert bundle.digest == hashlib.sha256(gzip.decompress(bundle.blob)).hexdigest()
    assert make_bundle({**FILES, "task.yaml": b"task_id: u\n"}, max_bytes=10_000).digest != bundle.digest


def test_it_compresses():
    files = {"big.txt": b"the same line\n" * 10_000}

    assert len(make_bundle(files, max_bytes=10**6).blob) < 2_000


def test_it_refuses_a_bundle_over_the_cap_naming_the_largest_file():
    with pytest.raises(BundleTooLarge, match=r"over the 0\.0 MB cap; largest files: template/run.sh"):
        make_bundle(FILES, max_bytes=10)


def test_it_reads_back_what_it_wrote():
    assert read_bundle(make_bundle(FILES, max_bytes=10_000).blob) == FILES


def test_it_refuses_to_read_more_than_a_limit():
    with pytest.raises(BundleTooLarge):
        read_bundle(make_bundle(FILES, max_bytes=10_000).blob, max_bytes=5)


def test_it_extracts_files_and_keeps_scripts_executable(tmp_path):
    extract_bundle(make_bundle(FILES, max_bytes=10_000).blob, tmp_path)

    assert (tmp_path / "template/calc.py").read_bytes() == b"x = 1\n"
    assert os.access(tmp_path / "template/run.sh", os.X_OK)
    assert not os.access(tmp_path / "template/calc.py", os.X_OK)


@pytest.mark.parametrize("name", ["../evil.py", "/etc/evil", "a/../../evil", "a/./b"])
def test_it_refuses_entries_that_could_escape_the_destination(tmp_path, name):
    info = tarfile.TarInfo(name)
    info.size = 1

    with pytest.raises(UnsafeBundle):
        extract_bundle(tar_blob(info, data=b"x"), tmp_path / "dest")
    assert not (tmp_path / "evil.py").exists()


def test_it_refuses_link_entries(tmp_path):
    link = tarfile.TarInfo("link")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"

    with pytest.raises(UnsafeBundle, match="not a regular file"):
        extract_bundle(tar_blob(link), tmp_path)


def test_it_refuses_to_write_through_a_symlink_in_the_destination(tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "dest").mkdir()
    os.symlink(tmp_path / "outside", tmp_path / "dest/template")

    with pytest.raises(UnsafeBundle, match="outside"):
        write_bundle_files(FILES, tmp_path / "dest")
    assert list((tmp_path / "outside").iterdir()) == []


def test_it_refuses_to_make_a_bundle_with_an_unsafe_name():
    with pytest.raises(UnsafeBundle):
        make_bundle({"../x": b""}, max_bytes=10)


def test_it_exports_and_reimports_every_real_task_to_the_same_digest(tmp_path):
    loaded = load_tasks([GOOD_TASKS]).tasks
    for task in loaded:
        write_bundle_files(task.files, tmp_path / task.task_id)

    again = {task.task_id: task for task in load_tasks([tmp_path]).tasks}

    assert {t.task_id: t.bundle.digest for t in loaded} == {k: t.bundle.digest for k, t in again.items()}


def test_it_exports_a_task_whose_template_climbs_and_reimports_it_unchanged(tmp_path):
    src = tmp_path / "src"
    (src / "templates/calc").mkdir(parents=True)
    (src / "templates/calc/calc.py").write_text("x = 1\n")
    (src / "tasks").mkdir()
    (src / "tasks/t.yaml").write_text(
        "task_id: climbs\ninitial_prompt: go\nsandbox:\n  template_sources:\n"
        "    - {type: template_dir, path: ../templates/calc}\n"
        "success_criteria:\n  - {type: file_exists, path: calc.py}\n"
    )
    task = load_tasks([src]).tasks[0]
    write_bundle_files(task.files, tmp_path / "export" / task.task_id)
    shutil.rmtree(src)

    again = load_tasks([tmp_path / "export"]).tasks[0]

    assert again.yaml_path_in_bundle == "tasks/t.yaml"
    assert again.bundle.digest == task.bundle.digest
    assert again.bundle.blob == task.bundle.blob
