"""Start-up configuration: every knob from the environment, bad values fail loudly by name."""

import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from evalsite.settings import database_from_url, env_bool, env_int


def start_django(then: str = "", **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "evalsite.settings", **env}
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {then}"],
        cwd=settings.BASE_DIR,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TRIAL_LEASE_SECONDS", "soon"),
        ("DEBUG", "maybe"),
        ("DATABASE_URL", "mysql://db/evalsite"),
        ("CELERY_BROKER_URL", "kafka://broker"),
        ("TASK_BUNDLE_MAX_BYTES", "12"),
    ],
)
def test_it_refuses_to_start_with_a_bad_value_and_names_the_variable(name, value):
    result = start_django(**{name: value})

    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert name in result.stderr


def test_it_starts_on_the_embedded_default_without_any_environment():
    result = start_django(DATABASE_URL="", CELERY_BROKER_URL="")

    assert result.returncode == 0, result.stderr


def test_a_worker_on_the_embedded_default_leaves_psycopg_unloaded():
    # psycopg and its pool cost every process ~9 MB; only a PostgreSQL database needs them.
    loaded = "import sys, runs_app.tasks; print(sorted(m for m in sys.modules if m.startswith('psycopg')))"
    result = start_django(loaded, DATABASE_URL="")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_it_parses_a_postgres_url_for_psycopg():
    database = database_from_url("DATABASE_URL", "postgres://eval:s%40cret@db.internal:6543/evalsite")

    assert database["ENGINE"] == "evalsite.postgresql"
    assert (database["NAME"], database["USER"], database["PASSWORD"]) == ("evalsite", "eval", "s@cret")
    assert (database["HOST"], database["PORT"]) == ("db.internal", "6543")


def test_the_helpers_accept_good_values(monkeypatch):
    monkeypatch.setenv("SOME_FLAG", "yes")
    monkeypatch.setenv("SOME_NUMBER", "42")

    assert env_bool("SOME_FLAG") is True
    assert env_int("SOME_NUMBER", 1, minimum=1) == 42
    with pytest.raises(ImproperlyConfigured, match="SOME_NUMBER"):
        env_int("SOME_NUMBER", 1, minimum=100)


def test_it_configures_the_database_and_broker_this_process_was_given():
    if os.environ.get("DATABASE_URL"):
        assert settings.DATABASES["default"]["ENGINE"] == "evalsite.postgresql"
    else:
        options = settings.DATABASES["default"]["OPTIONS"]
        assert options["transaction_mode"] == "IMMEDIATE" and options["timeout"] == 20
    if os.environ.get("CELERY_BROKER_URL"):
        assert os.environ["CELERY_BROKER_URL"] == settings.CELERY_BROKER_URL
    else:
        assert settings.CELERY_BROKER_URL == "filesystem://"
        transport = settings.CELERY_BROKER_TRANSPORT_OPTIONS
        assert transport["polling_interval"] == 0.1
        assert settings.CELERY_BROKER_TRANSPORT == "evalsite.filesystem_broker:Transport"
        folders = ("data_folder_in", "data_folder_out", "processed_folder", "staging_folder")
        assert all(os.path.isabs(transport[k]) for k in folders)
    assert settings.CELERY_TASK_ACKS_LATE and settings.CELERY_WORKER_PREFETCH_MULTIPLIER == 1
    assert settings.CELERY_ACCEPT_CONTENT == ["json"]


def test_links_point_where_make_run_serves_when_no_site_url_is_given(tmp_path):
    (tmp_path / "site-url").write_text("http://127.0.0.1:8101\n")  # scripts/run_dev.sh writes it
    environment = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "evalsite.settings",
        "EVALSITE_VAR_DIR": str(tmp_path),
    }
    environment.pop("SITE_URL", None)
    code = "import django; django.setup(); from django.conf import settings; print(settings.SITE_URL)"

    def site_url(**env: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=settings.BASE_DIR, env={**environment, **env},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert site_url() == "http://127.0.0.1:8101"
    assert site_url(SITE_URL="https://evals.example.com/") == "https://evals.example.com"
    (tmp_path / "site-url").unlink()
    assert site_url() == "http://127.0.0.1:8000"
