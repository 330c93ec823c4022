"""Project-wide test fixtures: named users and a real Celery worker process."""

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

BASE_DIR = Path(__file__).resolve().parent
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def pytest_configure(config):
    """Give this test process its own SQLite file and filesystem-broker folder, so that a
    `make run` worker, or another test run on the same checkout, never shares them.
    pytest-django has loaded settings by now, but has not created the test database yet,
    and Celery reads its configuration lazily, on first use."""
    from django.conf import settings

    scratch = BASE_DIR / "var" / f"test-{os.getpid()}"
    config._evalsite_scratch = scratch
    if "SANDBOX_ROOT" not in os.environ:
        # A checkout's own sandboxes: a worker sweeps the folders its database does not know,
        # so two checkouts' test runs on one machine must not share them. Kept between runs (it
        # caches runtimes and env_packages environments).
        digest = hashlib.sha256(str(BASE_DIR).encode()).hexdigest()[:10]
        os.environ["SANDBOX_ROOT"] = f"/var/tmp/evalsite-test-sandboxes-{digest}"
        settings.SANDBOX_ROOT = Path(os.environ["SANDBOX_ROOT"])
        settings.SANDBOX_ROOT.mkdir(exist_ok=True)
        os.chmod(settings.SANDBOX_ROOT, 0o711)  # sandbox uids cross it to their trials' folders
    if "TRIAL_ROOT" not in os.environ:
        # This session's trials apart, so that what its killed workers leave can be removed at
        # its end without touching another session's.
        os.environ["TRIAL_ROOT"] = str(settings.SANDBOX_ROOT / f"trials-{os.getpid()}")
        settings.TRIAL_ROOT = Path(os.environ["TRIAL_ROOT"])
        config._evalsite_trials = settings.TRIAL_ROOT
    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3"):
        scratch.mkdir(parents=True, exist_ok=True)
        database["TEST"] = {**database.get("TEST", {}), "NAME": str(scratch / "test.sqlite3")}
    if settings.CELERY_BROKER_URL == "filesystem://":
        from evalsite import filesystem_broker

        broker_dir = scratch / "broker"
        os.environ["BROKER_DIR"] = str(broker_dir)
        settings.BROKER_DIR = broker_dir
        settings.CELERY_BROKER_TRANSPORT_OPTIONS = filesystem_broker.transport_options(broker_dir)


def pytest_unconfigure(config):
    scratch = getattr(config, "_evalsite_scratch", None)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
    trials = getattr(config, "_evalsite_trials", None)
    if trials is not None and trials.is_dir():
        # Sandboxes the session's killed workers left (on a root worker, each a file system).
        from runs_app.engine.sandbox import discard

        for folder in trials.iterdir():
            discard(folder)
        shutil.rmtree(trials, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_live_listener_outlives_its_test():
    """A test that streamed started the web process's listener; on PostgreSQL it holds a
    connection, which would keep the test database from being dropped."""
    yield
    from runs_app import live
    from runs_app.analysis import load
    from runs_app.engine import runner
    from runs_app.web import fragments, presenters, workers

    if live._hub is not None:
        live._hub.stop()
    fragments.forget()  # run ids repeat across test databases
    presenters.LISTS.clear()
    workers.forget()  # the broker's answer, kept a few seconds
    load.forget_comparisons()  # and so do (run id, tally version) pairs
    runner.forget()  # and task version ids


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def admin_user(django_user_model):
    return django_user_model.objects.create_superuser("alice", "alice@example.com", "pw-alice")


@pytest.fixture
def member(django_user_model):
    return django_user_model.objects.create_user("bob", "bob@example.com", "pw-bob")


@pytest.fixture
def outsider(django_user_model):
    return django_user_model.objects.create_user("carol", "carol@example.com", "pw-carol")


@pytest.fixture
def member_client(client, member):
    client.force_login(member)
    return client


@pytest.fixture
def admin_client(client, admin_user):
    client.force_login(admin_user)
    return client


def worker_environment() -> dict[str, str]:
    """The environment of a worker process that shares the test database and broker."""
    from django.db import connection

    env = dict(os.environ)
    name = connection.settings_dict["NAME"]
    if connection.vendor == "sqlite":
        env["SQLITE_PATH"] = str(name)
    else:
        parts = urlsplit(os.environ["DATABASE_URL"])
        env["DATABASE_URL"] = urlunsplit(parts._replace(path=f"/{name}"))
    env["PYTHONUNBUFFERED"] = "1"
    return env


_STARTED_WORKERS: list["WorkerProcess"] = []


@pytest.fixture(autouse=True)
def _no_worker_outlives_its_test():
    """A worker left running would consume the next test's messages with this test's settings."""
    yield
    while _STARTED_WORKERS:
        _STARTED_WORKERS.pop().kill()


class WorkerProcess:
    """A `celery worker` subprocess; tests may kill it and start another."""

    def __init__(
        self,
        log_dir: Path,
        concurrency: int = 2,
        extra_env: dict[str, str] | None = None,
        beat: bool = False,
        prefix: list[str] | None = None,
    ):
        self.prefix = prefix or []  # e.g. a network namespace's `ip netns exec` (tests/hosts.py)
        self.log_dir = log_dir
        self.concurrency = concurrency
        self.extra_env = extra_env or {}
        self.beat = beat
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None

    def start(self) -> "WorkerProcess":
        _STARTED_WORKERS.append(self)
        self.log_path = self.log_dir / f"worker-{uuid.uuid4().hex[:8]}.log"
        name = f"test-{uuid.uuid4().hex[:8]}@%h"
        self.proc = subprocess.Popen(
            [
                *self.prefix,
                sys.executable,
                "-m",
                "celery",
                "-A",
                "evalsite",
                "worker",
                "--loglevel=INFO",
                f"--concurrency={self.concurrency}",
                "-n",
                name,
                "--without-gossip",
                "--without-mingle",
                *(["-B", "-s", str(self.log_dir / f"beat-{uuid.uuid4().hex[:6]}")] if self.beat else []),
            ],
            cwd=BASE_DIR,
            env={**worker_environment(), **self.extra_env},
            stdout=self.log_path.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Kill the worker's whole process group (main process and pool children)."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path and self.log_path.exists() else ""


def purge_broker() -> None:
    from evalsite.celery import app

    app.control.purge()


@pytest.fixture
def celery_worker_process(transactional_db, tmp_path):
    """A real Celery worker over the real broker, against the test database."""
    purge_broker()
    worker = WorkerProcess(tmp_path).start()
    yield worker
    # Nothing in a finished test needs a graceful shutdown, and a warm one takes seconds.
    worker.kill()


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.1, message=lambda: "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {message() if callable(message) else message}"
    )


class S3Server:
    """A local S3-compatible server (moto's, from PyPI) with one bucket, in its own process."""

    BUCKET = "evalsite-test"

    def __init__(self, log_dir: Path, host: str = "127.0.0.1"):
        import socket

        with socket.socket() as probe:
            probe.bind((host, 0))
            self.port = probe.getsockname()[1]
        self.host = host
        self.url = f"http://{host}:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", host, "-p", str(self.port)],
            stdout=(log_dir / "s3.log").open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.env = {
            "EVALSITE_S3_BUCKET": self.BUCKET,
            "EVALSITE_S3_ENDPOINT_URL": self.url,
            "EVALSITE_S3_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "evalsite-test",
            "AWS_SECRET_ACCESS_KEY": "evalsite-test-secret",
        }

    def wait_ready(self) -> "S3Server":
        deadline = time.monotonic() + 30
        while True:
            try:
                self.client().create_bucket(Bucket=self.BUCKET)
                return self
            except Exception:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.2)

    def client(self):
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.url, region_name="us-east-1",
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
        )  # fmt: skip

    def keys(self) -> list[str]:
        listed = self.client().list_objects_v2(Bucket=self.BUCKET)
        return sorted(item["Key"] for item in listed.get("Contents", []))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


@pytest.fixture
def s3_server(tmp_path, settings, monkeypatch):
    """A local S3 server, and this process's default storage on its bucket."""
    server = S3Server(tmp_path).wait_ready()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, server.env[name])
    from evalsite.settings import s3_storage

    settings.STORAGES = {**settings.STORAGES, "default": s3_storage(server.BUCKET, server.url, "us-east-1")}
    yield server
    server.stop()
