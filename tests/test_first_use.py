"""`make run` on a fresh machine: the site first, the agent CLIs in the background (their progress on
the Workers page, and in the error of a trial that needs one meanwhile), the admin password last.
(`make run`'s time to its first page is measured on a fresh clone; see the issue's note.)"""

import json
import os
import stat
import subprocess
import sys
import time

import pytest
from django.conf import settings
from django.urls import reverse

from evalsite.agents_install import install_status, installing_note
from runs_app.engine.agents.base import find_cli


def _status(folder, **fields) -> None:
    now = int(time.time())
    status = {"state": "installing", "step": "Aider (PyPI)", "done": 1, "total": 4, "failed": "",
              "started": now - 42, "updated": now, "log": "var/log/agents.log", **fields}  # fmt: skip
    (folder / "agents-install.json").write_text(json.dumps(status))


def test_a_missing_cli_says_it_is_on_its_way_while_make_run_installs_it(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALSITE_VAR_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing found on PATH
    assert installing_note() == ""
    _status(tmp_path)

    _, problem = find_cli("claude-code", "no-such-cli", {}, "EVALSITE_NO_SUCH_BIN")

    assert "is not installed" in problem
    assert "make run is installing the agent CLIs in the background: 1 of 4 steps after 4" in problem
    assert "now Aider (PyPI)" in problem and "the Workers page shows its progress" in problem
    _status(tmp_path, state="done", done=4)
    assert installing_note() == "" and install_status(tmp_path)["seconds"] == 42


@pytest.mark.django_db
def test_the_workers_page_shows_the_background_install_and_why_it_failed(member_client, tmp_path, settings):
    settings.VAR_DIR = tmp_path
    (tmp_path / "log").mkdir()
    _status(tmp_path)

    installing = member_client.get(reverse("worker_list")).content.decode()

    assert 'data-testid="agents-install"' in installing and "step 2 of 4, Aider (PyPI)" in installing
    assert '<meta http-equiv="refresh" content="5">' in installing  # the page follows it, no JS needed

    (tmp_path / "log" / "agents.log").write_text("--- opencode (npm)\nnpm ERR! <network> unreachable\n")
    _status(tmp_path, state="failed", done=4, failed="opencode (npm)")
    failed = member_client.get(reverse("worker_list")).content.decode()

    assert "Installing the agent CLIs failed</strong> for opencode (npm)" in failed
    assert "npm ERR! &lt;network&gt; unreachable" in failed and "make agents" in failed
    assert 'http-equiv="refresh"' not in failed


def test_the_admin_password_goes_to_a_file_that_make_run_prints_last(tmp_path):
    env = {**os.environ, "SQLITE_PATH": str(tmp_path / "db.sqlite3"), "EVALSITE_VAR_DIR": str(tmp_path),
           "DATABASE_URL": "", "CELERY_BROKER_URL": ""}  # fmt: skip
    run = [sys.executable, "manage.py"]
    subprocess.run([*run, "migrate", "-v0"], cwd=settings.BASE_DIR, env=env, check=True)
    password_file = tmp_path / "admin-password"

    made = subprocess.run(
        [*run, "ensure_admin", "--password-file", str(password_file)],
        cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip

    user, password = password_file.read_text().split()
    assert user == "admin" and password not in made.stdout and "shown as the site starts" in made.stdout
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
    script = (settings.BASE_DIR / "scripts" / "run_dev.sh").read_text()
    # The last lines it prints: the address, then the password (then the file is gone).
    assert script.index('echo "evalsite is at') < script.index("with password $ADMIN_PASSWORD")
    assert "rm -f var/admin-password" in script
    makefile = (settings.BASE_DIR / "Makefile").read_text()
    assert "\nrun: demo sandbox\n" in makefile  # the agent CLIs are not waited for
