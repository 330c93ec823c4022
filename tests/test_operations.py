"""The operations procedures of docs/operations.md, run once: a backup and its restore (the
embedded default and PostgreSQL), and `migrate` meeting a table a run in flight holds."""

import os
import sqlite3
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.db import connection

DOCS = settings.BASE_DIR / "docs" / "operations.md"


def documented(marker: str) -> str:
    """The shell command docs/operations.md gives on the line after `<!-- marker -->`."""
    lines = DOCS.read_text().splitlines()
    return lines[lines.index(f"<!-- {marker} -->") + 2].strip()


def manage(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=settings.BASE_DIR, env=env,
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_the_embedded_database_is_backed_up_while_in_use_and_restored(tmp_path):
    live = tmp_path / "var" / "evalsite.sqlite3"
    env = {**os.environ, "SQLITE_PATH": str(live), "EVALSITE_VAR_DIR": str(tmp_path / "var"),
           "DATABASE_URL": "", "CELERY_BROKER_URL": ""}  # fmt: skip
    assert manage("migrate", "-v0", env=env).returncode == 0
    assert manage("import_tasks", "--set", "examples", "examples/tasks", env=env).returncode == 0
    tasks = count_tasks(env)
    writer = sqlite3.connect(live)
    writer.execute("BEGIN IMMEDIATE")  # a worker mid-write: the backup holds what was committed
    writer.execute("DELETE FROM experiments_app_task")

    def here(command: str) -> str:
        return command.replace("var/", f"{tmp_path}/var/").replace(
            "evalsite-backup", f"{tmp_path}/evalsite-backup"
        )

    backup = subprocess.run(here(documented("backup-sqlite")), shell=True, cwd=settings.BASE_DIR, timeout=60)
    writer.rollback()
    writer.close()
    live.unlink()
    restore = subprocess.run(
        here(documented("restore-sqlite")), shell=True, cwd=settings.BASE_DIR, timeout=60
    )

    assert backup.returncode == 0 and restore.returncode == 0
    assert tasks > 0 and count_tasks(env) == tasks


def count_tasks(env: dict[str, str]) -> int:
    done = manage(
        "shell", "-c", "from experiments_app.models import Task; print(Task.objects.count())", env=env
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])  # (after the shell's own notice of what it imported)


def _postgres_pass() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's tools and locks: the production pass (PostgreSQL + Redis) runs this")


@pytest.fixture
def scratch_database():
    """A database of its own on the test server, and an admin connection (dropped after): these
    tests migrate it and restore into another."""
    _postgres_pass()
    import psycopg

    name = f"{connection.settings_dict['NAME']}_ops"
    server = urlsplit(os.environ["DATABASE_URL"])
    admin = psycopg.connect(urlunsplit(server._replace(path="/postgres")), autocommit=True)
    for each in (name, f"{name}_restored"):
        admin.execute(f"DROP DATABASE IF EXISTS {each} WITH (FORCE)")
    admin.execute(f"CREATE DATABASE {name}")
    url = urlunsplit(server._replace(path=f"/{name}"))
    env = {**os.environ, "DATABASE_URL": url}
    assert manage("migrate", "-v0", env=env).returncode == 0
    yield url, env, admin
    for each in (name, f"{name}_restored"):
        admin.execute(f"DROP DATABASE IF EXISTS {each} WITH (FORCE)")
    admin.close()


@pytest.mark.django_db
def test_postgresql_is_backed_up_and_restored_with_its_tools(scratch_database, tmp_path):
    url, env, admin = scratch_database
    assert manage("import_tasks", "--set", "examples", "examples/tasks", env=env).returncode == 0
    dump = str(tmp_path / "evalsite.dump")
    restored = {**env, "DATABASE_URL": f"{url}_restored"}
    admin.execute(f"CREATE DATABASE {urlsplit(url).path[1:]}_restored")

    backup = subprocess.run(documented("backup-postgres").replace("evalsite.dump", dump), shell=True, env=env)
    restore = subprocess.run(
        documented("restore-postgres").replace("evalsite.dump", dump), shell=True, env=restored
    )

    assert backup.returncode == 0 and restore.returncode == 0
    assert count_tasks(restored) == count_tasks(env) > 0


@pytest.mark.django_db
def test_migrate_gives_up_on_a_table_a_run_in_flight_holds_and_reads_go_on(scratch_database):
    import psycopg

    url, env, _ = scratch_database
    holder = psycopg.connect(url)  # a worker inside its transaction, writing to the table
    holder.execute("LOCK TABLE runs_app_worker IN ROW EXCLUSIVE MODE")
    reads: list[float] = []

    def read_meanwhile() -> None:
        time.sleep(1.5)
        started = time.monotonic()
        with psycopg.connect(url) as reader:
            reader.execute("SELECT count(*) FROM runs_app_worker").fetchone()
        reads.append(time.monotonic() - started)

    reader = threading.Thread(target=read_meanwhile)
    reader.start()
    started = time.monotonic()
    # Back to 0008: drops a column of runs_app_worker, which needs the table to itself.
    stopped = manage("migrate", "runs_app", "0008", "-v0", env={**env, "MIGRATE_LOCK_TIMEOUT_SECONDS": "3"})
    took = time.monotonic() - started
    reader.join(timeout=30)
    holder.rollback()
    holder.close()
    again = manage("migrate", "runs_app", "0008", "-v0", env=env)
    forward = manage("migrate", "-v0", env=env)

    assert (
        stopped.returncode == 1
        and "migrate stopped: a table it must change stayed locked for 3 s" in stopped.stderr
    )
    assert "Stop the workers or let the runs end" in stopped.stderr and "Traceback" not in stopped.stderr
    assert took < 20, took  # (the command's own start-up included)
    assert reads and reads[0] < 5, reads  # queued behind the migration at most until it gave up
    assert again.returncode == 0 and forward.returncode == 0, again.stderr + forward.stderr
