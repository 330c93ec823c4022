"""evalsite.sqlite: threads and processes take SQLite's write lock in turn, not by polling."""

import multiprocessing
import threading
import time

import pytest

from evalsite.sqlite.base import DatabaseWrapper


@pytest.fixture(autouse=True)
def _own_databases(django_db_blocker):
    """These tests open their own SQLite files, not the test database."""
    with django_db_blocker.unblock():
        yield


def _database(path, alias: str) -> DatabaseWrapper:
    settings = {
        "ENGINE": "evalsite.sqlite", "NAME": str(path), "USER": "", "PASSWORD": "", "HOST": "", "PORT": "",
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 0.05}, "TIME_ZONE": None,
        "CONN_MAX_AGE": 0, "CONN_HEALTH_CHECKS": False, "AUTOCOMMIT": True, "ATOMIC_REQUESTS": False,
        "TEST": {},
    }  # fmt: skip
    return DatabaseWrapper(settings, alias=alias)


def _write(database: DatabaseWrapper, hold_seconds: float) -> None:
    """One write transaction as `transaction.atomic` opens and commits it, held a while."""
    database.set_autocommit(False, force_begin_transaction_with_broken_autocommit=True)
    try:
        with database.cursor() as cursor:
            cursor.execute("UPDATE counter SET n = n + 1")
        time.sleep(hold_seconds)
        database.commit()
    except BaseException:
        database.rollback()
        raise
    finally:
        database.set_autocommit(True)


def test_many_threads_write_in_turn_past_sqlites_own_timeout(tmp_path):
    setup = _database(tmp_path / "db.sqlite3", "setup")
    with setup.cursor() as cursor:
        cursor.execute("CREATE TABLE counter (n INTEGER)")
        cursor.execute("INSERT INTO counter VALUES (0)")
    setup.close()
    errors: list[BaseException] = []

    def writer(index: int) -> None:
        database = _database(tmp_path / "db.sqlite3", f"writer-{index}")
        try:
            for _ in range(5):
                _write(database, hold_seconds=0.01)  # 16 threads wait far past the 50 ms timeout
        except BaseException as exc:
            errors.append(exc)
        finally:
            database.close()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert errors == []
    check = _database(tmp_path / "db.sqlite3", "check")
    with check.cursor() as cursor:
        cursor.execute("SELECT n FROM counter")
        assert cursor.fetchone()[0] == 80
    check.close()


def test_a_failed_begin_or_a_rollback_gives_the_turn_back(tmp_path):
    database = _database(tmp_path / "db.sqlite3", "one")
    with database.cursor() as cursor:
        cursor.execute("CREATE TABLE counter (n INTEGER)")
        cursor.execute("INSERT INTO counter VALUES (0)")
    with pytest.raises(ZeroDivisionError):
        database.set_autocommit(False, force_begin_transaction_with_broken_autocommit=True)
        try:
            raise ZeroDivisionError
        finally:
            database.rollback()
            database.set_autocommit(True)
    other = _database(tmp_path / "db.sqlite3", "two")
    _write(other, hold_seconds=0)  # would block forever on a turn never given back
    other.close()
    database.close()


def _process_writer(path: str, index: int, errors) -> None:
    database = _database(path, f"process-{index}")
    try:
        for _ in range(5):
            _write(database, hold_seconds=0.02)  # the others wait far past the 50 ms timeout
    except BaseException as exc:
        errors.put(repr(exc))
    finally:
        database.close()


def test_processes_write_in_turn_past_sqlites_own_timeout(tmp_path):
    path = str(tmp_path / "db.sqlite3")
    setup = _database(path, "setup")
    with setup.cursor() as cursor:
        cursor.execute("CREATE TABLE counter (n INTEGER)")
        cursor.execute("INSERT INTO counter VALUES (0)")
    setup.close()
    context = multiprocessing.get_context("fork")
    errors = context.Queue()
    processes = [context.Process(target=_process_writer, args=(path, i, errors)) for i in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)

    assert errors.empty() and all(process.exitcode == 0 for process in processes)
    check = _database(path, "check")
    with check.cursor() as cursor:
        cursor.execute("SELECT n FROM counter")
        assert cursor.fetchone()[0] == 20
    check.close()
