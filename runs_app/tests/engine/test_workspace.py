import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest

from runs_app.engine import sandbox
from runs_app.engine.sandbox import bubblewrap, containment
from runs_app.engine.sandbox.workspace import (
    REPO_DIRNAME,
    WorkspaceError,
    cleanup,
    layout,
    make_artifact_tarball,
    materialize,
    snapshot,
    unified_diff,
)
from runs_app.tests.engine.nobody import nobody_worker

IS_ROOT = os.geteuid() == 0


@pytest.fixture
def base():
    folder = Path(tempfile.mkdtemp(prefix="evalsite-workspace-test-"))
    os.chmod(folder, 0o711)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def bundle(tmp_path):
    """A task bundle: tasks/demo/task.yaml with a template, and a shared overlay elsewhere."""
    root = tmp_path / "bundle"
    template = root / "tasks/demo/template"
    (template / "src").mkdir(parents=True)
    (template / "empty").mkdir()
    (template / "README.md").write_text("template readme\n")
    (template / "src/app.py").write_text("print('template')\n")
    (template / "__pycache__").mkdir()
    (template / "__pycache__/app.cpython-311.pyc").write_bytes(b"\0compiled")
    (template / ".git").mkdir()
    (template / ".git/HEAD").write_text("ref: refs/heads/main\n")
    (root / "shared/overlay").mkdir(parents=True)
    (root / "shared/overlay/README.md").write_text("overlay readme\n")
    (root / "tasks/demo/task.yaml").write_text("task_id: demo\n")
    return root


def files_under(folder: Path) -> dict[str, str]:
    return {
        path.relative_to(folder).as_posix(): path.read_text()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


def test_it_lays_out_fresh_folders_and_cleans_them_up(base):
    paths = layout(base / "trial")

    assert [p.is_dir() for p in (paths.workspace, paths.home, paths.tmp)] == [True, True, True]
    if IS_ROOT:
        assert paths.uid is not None and containment.is_leased(paths.uid)
        assert {p.stat().st_uid for p in (paths.workspace, paths.home, paths.tmp)} == {paths.uid}
    cleanup(paths.root)
    assert not paths.root.exists()
    if IS_ROOT:
        assert not containment.is_leased(paths.uid)


def test_it_gives_concurrent_trials_different_uids(base):
    first, second = layout(base / "one"), layout(base / "two")
    try:
        assert first.uid != second.uid or not IS_ROOT
    finally:
        cleanup(first.root)
        cleanup(second.root)


def test_it_refuses_a_trial_folder_that_is_not_empty(base):
    (base / "trial").mkdir()
    (base / "trial/leftover.txt").write_text("x")

    with pytest.raises(WorkspaceError, match="not empty"):
        layout(base / "trial")


@pytest.mark.skipif(not IS_ROOT, reason="only a root worker hands folders to a sandbox uid")
def test_it_refuses_a_trial_folder_the_sandbox_uid_cannot_reach(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)

    with pytest.raises(WorkspaceError, match=r"chmod o\+x"):
        layout(private / "trial")


def test_it_cleans_up_read_only_files_and_kills_what_still_runs(base):
    paths = layout(base / "trial")
    limits = sandbox.Limits(wall_seconds=10)
    env = {"PATH": "/usr/bin:/bin"}
    bubblewrap.run_process(
        "mkdir -p deep/er && echo x > deep/er/f && chmod 000 deep/er/f && chmod 500 deep/er deep",
        cwd=paths.workspace,
        env=env,
        limits=limits,
    )
    straggler = None
    if IS_ROOT:
        # A command run outside a pids cgroup leaves the uid to be swept when released (a
        # process in one cannot leave it, and is killed with it); and a process of the uid
        # started outside run_process stands for whatever such a command left behind.
        bubblewrap.run_process("true", cwd=paths.workspace, env=env, limits=limits, use_cgroup=False)
        straggler = subprocess.Popen(["sleep", "30"], user=paths.uid, group=paths.uid, cwd="/")

    cleanup(paths.root)

    assert not paths.root.exists()
    if straggler is not None:
        assert straggler.wait(timeout=5) < 0


@pytest.mark.skipif(not IS_ROOT, reason="only a root worker leases sandbox uids")
def test_a_fresh_host_marks_idle_uids_clean_at_once_and_sweeps_a_busy_one_on_its_lease(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a host whose lock folder is new
    monkeypatch.setenv("EVALSITE_SANDBOX_UIDS", "64990-64993")
    monkeypatch.setattr(containment, "_PRIMED", [])
    leftover = subprocess.Popen(["sleep", "30"], user=64991, group=64991, cwd="/")  # a dead trial's
    try:
        first = containment.lease_sandbox_uid()
        locks = tmp_path / "evalsite-uid-locks"
        leased = [first] + [containment.lease_sandbox_uid() for _ in range(3)]

        assert sorted(leased) == [64990, 64991, 64992, 64993]
        assert leftover.wait(timeout=5) < 0  # its lease swept the busy uid first
        assert (locks / ".primed-64990-64993").exists()
    finally:
        leftover.kill()
        for uid in containment._LEASES.copy():
            if uid in range(64990, 64994):
                containment.release_sandbox_uid(uid)
    assert {(locks / str(uid)).read_bytes() for uid in range(64990, 64994)} == {b"clean"}


def test_priming_marks_clean_only_new_lock_files_of_uids_nothing_runs_as(tmp_path):
    locks = tmp_path / "locks"
    locks.mkdir()
    (locks / "64995").write_bytes(b"")  # a worker died holding it: left for its next lease
    busy = subprocess.Popen(["sleep", "30"], **({"user": 64996, "group": 64996} if IS_ROOT else {}))
    try:
        uids = [64995, 64996 if IS_ROOT else os.getuid(), 64997]
        containment._prime_lock_files(locks, uids)
    finally:
        busy.kill()
    assert {uid: (locks / str(uid)).read_bytes() for uid in uids} == {
        64995: b"",
        uids[1]: b"",
        64997: b"clean",
    }


@pytest.mark.skipif(not IS_ROOT, reason="needs root to start a cleanup as an unprivileged user")
def test_it_cleans_up_read_only_folders_as_a_non_root_worker(base):
    """rmtree alone fails on a folder without write permission when the worker is not root."""
    owned = base / "owned"
    owned.mkdir()
    os.chown(owned, 65534, 65534)
    done = nobody_worker(
        owned,
        "import os; from runs_app.engine.sandbox.workspace import cleanup, layout; "
        f"p = layout(Path({str(owned)!r}) / 'trial'); "
        "(p.workspace / 'ro').mkdir(); (p.workspace / 'ro/f.txt').write_text('x'); "
        "os.chmod(p.workspace / 'ro', 0o500); os.chmod(p.workspace, 0o500); "
        "cleanup(p.root); print(p.root.exists())",
    )

    assert (done.returncode, done.stdout) == (0, "False\n"), done.stderr


def test_it_materializes_sources_in_order(bundle, tmp_path):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    sources = [
        {"type": "template_dir", "path": "template"},
        {"type": "template_dir", "path": "../../shared/overlay"},
        {"type": "starter_files", "files": [{"path": "src/app.py", "content": "print('starter')\n"}]},
        {"type": "starter_files", "files": [{"path": "docs/new.md", "content": "new\n"}]},
    ]

    materialize(workspace, sources, bundle, "tasks/demo")

    assert files_under(workspace) == {
        "README.md": "overlay readme\n",
        "docs/new.md": "new\n",
        "src/app.py": "print('starter')\n",
    }
    assert (workspace / "empty").is_dir()
    assert not (workspace / "__pycache__").exists() and not (workspace / ".git").exists()


def test_it_puts_a_template_at_its_mount_point_and_re_includes_ignored_paths(bundle, tmp_path):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    source = {
        "type": "template_dir",
        "path": "template",
        "mount_point": "vendor/app",
        "include_patterns": [".git/*"],
    }

    materialize(workspace, [source], bundle, "tasks/demo")

    assert files_under(workspace) == {
        "vendor/app/.git/HEAD": "ref: refs/heads/main\n",  # re-included
        "vendor/app/README.md": "template readme\n",
        "vendor/app/src/app.py": "print('template')\n",
    }
    assert not (workspace / "vendor/app/__pycache__").exists()  # still ignored
    assert not (workspace / "README.md").exists()


@pytest.mark.skipif(not IS_ROOT, reason="only a root worker hands files to a sandbox uid")
def test_it_hands_materialized_files_to_the_trial_uid(bundle, base):
    paths = layout(base / "trial")
    try:
        materialize(paths.workspace, [{"type": "template_dir", "path": "template"}], bundle, "tasks/demo")

        owners = {p.lstat().st_uid for p in paths.workspace.rglob("*")}
        assert owners == {paths.uid}
    finally:
        cleanup(paths.root)


def test_it_copies_symlinks_as_links_not_host_files(bundle, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("host secret\n")
    (bundle / "tasks/demo/template/link.txt").symlink_to(outside)
    workspace = tmp_path / "workspace"
    workspace.mkdir()

    materialize(workspace, [{"type": "template_dir", "path": "template"}], bundle, "tasks/demo")

    assert (workspace / "link.txt").is_symlink()
    assert os.readlink(workspace / "link.txt") == str(outside)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            {"type": "starter_files", "files": [{"path": "../escape.txt", "content": "x"}]},
            "inside the workspace",
        ),
        (
            {"type": "starter_files", "files": [{"path": "/etc/escape.txt", "content": "x"}]},
            "inside the workspace",
        ),
        (
            {"type": "starter_files", "files": [{"path": "out/escape.txt", "content": "x"}]},
            "through a symlink",
        ),
        ({"type": "starter_files", "files": "not a list"}, r"files must be a list"),
        ({"type": "template_dir", "path": "../../../../elsewhere"}, "outside the task bundle"),
        ({"type": "template_dir", "path": "missing"}, "not a folder"),
        ({"type": "template_dir"}, r"template_sources\[1\]\.path is required"),
        ({"type": "zip", "path": "x"}, "not one of template_dir, starter_files, repo"),
    ],
)
def test_it_refuses_bad_or_escaping_sources(bundle, tmp_path, source, message):
    outside = tmp_path / "outside"
    outside.mkdir()
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "out").symlink_to(outside)  # as if an earlier source had planted it
    first = {"type": "starter_files", "files": [{"path": "ok.txt", "content": "ok"}]}

    with pytest.raises(WorkspaceError, match=message):
        materialize(workspace, [first, source], bundle, "tasks/demo")
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "escape.txt").exists()


def git(*args: str, cwd: Path) -> str:
    identity = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
    done = subprocess.run(["git", *identity, *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A local repository with two commits; returns (path, first commit, second commit)."""
    origin = tmp_path / "origin"
    origin.mkdir()
    git("init", "--quiet", "-b", "main", cwd=origin)
    (origin / "lib.py").write_text("VERSION = 1\n")
    git("add", ".", cwd=origin)
    git("commit", "--quiet", "-m", "one", cwd=origin)
    first = git("rev-parse", "HEAD", cwd=origin)
    (origin / "lib.py").write_text("VERSION = 2\n")
    git("commit", "--quiet", "-am", "two", cwd=origin)
    return origin, first, git("rev-parse", "HEAD", cwd=origin)


URL = "https://git.example.test/origin.git"


def local_git(origin: Path):
    """The runner's git, with the https remote served from a local folder (no network here)."""

    def run(argv: list[str], timeout: float, host: str) -> tuple[int, str, bool]:
        assert host == "git.example.test"  # the only host the clone may reach
        argv = [str(origin) if arg == URL else arg for arg in argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return done.returncode, done.stderr, False

    return run


def test_it_clones_a_repo_at_a_commit_into_repo_folder(repo, bundle, tmp_path):
    origin, first, second = repo
    pinned, latest = tmp_path / "pinned", tmp_path / "latest"
    pinned.mkdir()
    latest.mkdir()

    runner = local_git(origin)
    materialize(pinned, [{"type": "repo", "url": URL, "commit": first}], bundle, "tasks/demo", git=runner)
    materialize(latest, [{"type": "repo", "url": URL}], bundle, "tasks/demo", git=runner)

    assert (pinned / REPO_DIRNAME / "lib.py").read_text() == "VERSION = 1\n"
    assert git("rev-parse", "HEAD", cwd=pinned / REPO_DIRNAME) == first
    assert (latest / REPO_DIRNAME / "lib.py").read_text() == "VERSION = 2\n"
    assert git("rev-parse", "HEAD", cwd=latest / REPO_DIRNAME) == second


def test_it_reports_a_repo_that_cannot_be_checked_out(repo, bundle, tmp_path):
    origin, _, _ = repo
    workspace = tmp_path / "workspace"
    workspace.mkdir()

    runner = local_git(origin)
    with pytest.raises(WorkspaceError, match=r"template_sources\[0\]: `git checkout`"):
        materialize(workspace, [{"type": "repo", "url": URL, "commit": "0" * 40}], bundle, "t", git=runner)
    with pytest.raises(WorkspaceError, match=r"template_sources\[0\]\.url is required"):
        materialize(workspace, [{"type": "repo"}], bundle, "t", git=runner)


@pytest.mark.parametrize(
    "url", ["/work/main", "file:///work/main", "http://example.test/r.git", "ext::sh -c id"]
)
def test_it_refuses_a_repo_url_that_is_not_https(repo, bundle, tmp_path, url):
    origin, _, _ = repo
    with pytest.raises(WorkspaceError, match=r"template_sources\[0\]\.url: repo url .* is not allowed"):
        materialize(tmp_path, [{"type": "repo", "url": url}], bundle, "t", git=local_git(origin))
    assert not (tmp_path / REPO_DIRNAME).exists()


def test_it_snapshots_text_files_only(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src/a.py").write_text("a = 1\n")
    (tmp_path / "image.png").write_bytes(b"\x89PNG\0\0data")
    (tmp_path / "huge.txt").write_text("x" * 2000)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__/a.pyc").write_bytes(b"compiled")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git/config").write_text("[core]\n")
    (tmp_path / "notes.log").write_text("ignored by a glob\n")
    (tmp_path / "link").symlink_to("src/a.py")
    os.mkfifo(tmp_path / "pipe")  # reading it would block forever

    files = snapshot(tmp_path, ignore_patterns=["*.log"], max_file_bytes=1000)

    assert files == {"src/a.py": b"a = 1\n", "image.png": None, "huge.txt": None, "link": b"src/a.py"}


def test_it_diffs_added_removed_and_modified_files_in_path_order():
    before = {"b.txt": b"one\ntwo\n", "gone.txt": b"bye\n", "same.txt": b"same\n", "pic.bin": None}
    after = {"b.txt": b"one\n2\n", "a.txt": b"new", "same.txt": b"same\n"}

    text, truncated = unified_diff(before, after, cap_bytes=10_000)

    assert not truncated
    assert text == (
        "diff --git a/a.txt b/a.txt\nnew file\n--- /dev/null\n+++ b/a.txt\n@@ -0,0 +1 @@\n"
        "+new\n\\ No newline at end of file\n"
        "diff --git a/b.txt b/b.txt\n--- a/b.txt\n+++ b/b.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n"
        "diff --git a/gone.txt b/gone.txt\ndeleted file\n--- a/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n"
        "diff --git a/pic.bin b/pic.bin\ndeleted file\nBinary files a/pic.bin and /dev/null differ\n"
    )


def test_it_caps_a_long_diff_on_a_line_boundary():
    after = {f"f{i:03}.txt": f"line {i}\n".encode() * 50 for i in range(100)}

    text, truncated = unified_diff({}, after, cap_bytes=2000)

    assert truncated
    assert len(text.encode()) <= 2000
    assert text.endswith("cap 2000)\n")
    assert text.startswith("diff --git a/f000.txt b/f000.txt\n")


def test_it_packs_the_workspace_into_a_tarball(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src/a.py").write_text("a = 1\n")
    (tmp_path / "link").symlink_to("src/a.py")

    data = make_artifact_tarball(tmp_path)

    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        assert tar.getnames() == ["workspace", "workspace/link", "workspace/src", "workspace/src/a.py"]
        assert tar.extractfile("workspace/src/a.py").read() == b"a = 1\n"
        assert tar.getmember("workspace/link").issym()


def _tree(root: Path) -> dict[str, tuple]:
    """Every entry under root: its kind, mode, owner and link target or content."""
    entries = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = path.lstat()
            if path.is_symlink():
                what = ("link", os.readlink(path))
            elif path.is_dir():
                what = ("dir", oct(info.st_mode & 0o7777))
            else:
                what = ("file", oct(info.st_mode & 0o7777), path.read_bytes())
            entries[str(path.relative_to(root))] = (*what, info.st_uid)
    return entries


def test_a_trials_venv_is_the_hosts_template_made_afresh_naming_its_own_path(base):
    from runs_app.engine.sandbox import environments

    template = environments.venv_template(base)
    owner = 65000 if IS_ROOT else os.geteuid()
    target = base / "trial" / "workspace" / ".venv"
    target.parent.mkdir(parents=True)

    environments.new_venv(base, target, owner=owner)

    made, expected = _tree(target), _tree(template)
    assert made.keys() == expected.keys() and "bin/python" in made
    for relative, entry in made.items():
        assert entry[-1] == owner, relative
        if entry[0] == "file":  # the activate scripts name the trial's venv, not the template
            assert entry[2] == expected[relative][2].replace(bytes(template), bytes(target)), relative
        else:
            assert entry[:2] == expected[relative][:2], relative
    assert bytes(target) in (target / "bin" / "activate").read_bytes()
    assert bytes(template) not in (target / "bin" / "activate").read_bytes()
    # The venv works: its python runs with the venv as its prefix.
    prefix = subprocess.run(
        [target / "bin" / "python", "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True
    )
    assert prefix.stdout.strip() == str(target)
