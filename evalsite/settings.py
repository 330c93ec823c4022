"""evalsite settings: one file, every knob read from the environment.

The embedded default (no environment at all) is SQLite in var/ and the kombu
filesystem broker in var/broker, so `make run` needs no external server.
Production sets DATABASE_URL and CELERY_BROKER_URL.
"""

import os
import secrets
import socket
from datetime import timedelta
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

from evalsite import filesystem_broker
from evalsite.versioning import SHARED_QUEUE, code_version, worker_queues

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean: use true/false, 1/0, yes/no or on/off")


def env_int(name: str, default: int, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be at least {minimum}")
    return value


def env_float(name: str, default: float, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be at least {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def database_from_url(name: str, url: str) -> dict:
    """Parse a postgres:// URL into a Django DATABASES entry (psycopg 3)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        raise ImproperlyConfigured(
            f"{name}={url.split('@')[-1]!r}: only postgres:// URLs are supported "
            "(leave it unset for the embedded SQLite database)"
        )
    db_name = unquote(parts.path.lstrip("/"))
    if not db_name:
        raise ImproperlyConfigured(f"{name} has no database name (postgres://user@host:5432/NAME)")
    try:
        port = parts.port
    except ValueError:
        raise ImproperlyConfigured(f"{name} has a bad port number") from None
    options = dict(parse_qsl(parts.query))
    return {
        "ENGINE": "evalsite.postgresql",  # Django's, with a pool that sees an outage at once
        "NAME": db_name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": unquote(parts.hostname or ""),
        "PORT": str(port or ""),
        "CONN_MAX_AGE": env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0),
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": options,
        "TEST": {"NAME": env_str("DATABASE_TEST_NAME", f"test_{db_name}")},
    }


# Whatever the web process and the workers write (database, broker folders, media, secret key,
# sandboxes) is theirs alone: a trial's sandbox, or another user of the host, must not read it.
# (The umask the process was started with stays known: files a person asks a command for, a
# report or an export, are written with it: evalsite/files.py.)
USER_UMASK = os.umask(0o077)
VAR_DIR = Path(env_str("EVALSITE_VAR_DIR", str(BASE_DIR / "var"))).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)
VAR_DIR.chmod(0o700)


def _secret_key() -> str:
    given = env_str("SECRET_KEY")
    if given:
        return given
    # Generated once per checkout and kept out of git (var/ is ignored).
    key_file = VAR_DIR / "secret_key"
    if not key_file.exists():
        key_file.write_text(secrets.token_urlsafe(50))
        key_file.chmod(0o600)
    return key_file.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
# The address printed in links by the command line and reports (`evalrun`, `evalreport`): set it
# to where people reach the site. `make run` serves at its HOST and PORT and writes that address
# to var/site-url, so a command run from another shell of the same checkout links there.
_SERVED_AT = VAR_DIR / "site-url"
SITE_URL = (
    env_str("SITE_URL")
    or (_SERVED_AT.read_text().strip() if _SERVED_AT.is_file() else "")
    or "http://127.0.0.1:8000"
).rstrip("/")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "ninja",
    "csp",
    "axes",
    "experiments_app",
    "runs_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # A view that cannot get a database connection answers 503 + Retry-After (evalsite/overload.py).
    "evalsite.overload.UnavailableMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # A personal API token opens downloads (GET) as its user, as it opens the API.
    "runs_app.tokens.TokenDownloads",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "csp.middleware.CSPMiddleware",
    # Last: it reads the authentication the middlewares above set up.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "evalsite.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "evalsite.wsgi.application"
ASGI_APPLICATION = "evalsite.asgi.application"

# Trials one worker process runs at once. 0 (the default): Celery's prefork pool, a process per
# trial (`--concurrency`). N > 0: one process supervises N trials in threads (Celery's thread pool
# of N): a trial waiting on its agent costs a thread and its agent's processes, not a ~75 MB
# Python process. Its threads share the process's database pool (DATABASE_POOL_MAX_SIZE on
# PostgreSQL) and give their connection back while they wait.
WORKER_SLOTS = env_int("WORKER_SLOTS", 0, minimum=0)
# The worker host's name, recorded on its trials and on the workers page (hosts in containers or
# network namespaces share a kernel hostname: name them here).
WORKER_HOST = env_str("EVALSITE_HOST") or socket.gethostname()

DATABASE_URL = env_str("DATABASE_URL")
# The ASGI web process's connections to PostgreSQL, and a WORKER_SLOTS worker's: a psycopg pool of
# at most this many (0: no pool, one persistent connection per thread as under WSGI and in prefork
# workers). Under ASGI each request runs in its own short-lived thread, so persistent connections
# would pile up; streams give theirs back between checks. Size it against the server's
# max_connections with the workers' (one per prefork process, a pool per WORKER_SLOTS process).
DATABASE_POOL_MAX_SIZE = env_int("DATABASE_POOL_MAX_SIZE", 10, minimum=0)
# A web process runs at most this many requests at once (live streams and static files aside); the
# others wait their turn, in order, up to WEB_QUEUE_SECONDS, then get 503 + Retry-After
# (evalsite/overload.py). Each runs in a thread holding a pooled connection: past the pool's
# size, more would only wait for one (docs/deploy.md, "Sizing connections").
WEB_MAX_IN_FLIGHT = env_int("WEB_MAX_IN_FLIGHT", 8, minimum=1)
WEB_QUEUE_SECONDS = env_float("WEB_QUEUE_SECONDS", 10.0, minimum=0.1)
if DATABASE_URL:
    DATABASES = {"default": database_from_url("DATABASE_URL", DATABASE_URL)}
    # A worker host that drops off the network inside a transaction keeps its row locks (a run's
    # row, which every trial's end takes) until PostgreSQL drops its session: by default, when
    # TCP gives up, hours later. These end such a session after DATABASE_IDLE_IN_TRANSACTION_SECONDS
    # idle inside a transaction, and notice a silent peer within about a minute. No transaction
    # of evalsite waits on anything but the database.
    idle = env_int("DATABASE_IDLE_IN_TRANSACTION_SECONDS", 30, minimum=1)
    DATABASES["default"]["OPTIONS"].setdefault(
        "options",
        f"-c idle_in_transaction_session_timeout={idle}s -c tcp_keepalives_idle=30 "
        "-c tcp_keepalives_interval=10 -c tcp_keepalives_count=3 -c tcp_user_timeout=60000",
    )
    # A database host that does not answer (a cut network) fails a connection attempt after this
    # long, instead of TCP's two minutes: the pool then says "database unreachable".
    DATABASES["default"]["OPTIONS"].setdefault(
        "connect_timeout", env_int("DATABASE_CONNECT_TIMEOUT", 5, minimum=1)
    )
    if (os.environ.get("EVALSITE_ASGI") == "1" or WORKER_SLOTS) and DATABASE_POOL_MAX_SIZE:
        DATABASES["default"]["CONN_MAX_AGE"] = 0  # Django requires it with a pool
        DATABASES["default"]["OPTIONS"]["pool"] = {
            "min_size": 1,
            "max_size": DATABASE_POOL_MAX_SIZE,
            # A request waits this long for a connection of a busy pool, then gets 503.
            "timeout": env_int("DATABASE_POOL_TIMEOUT", 5, minimum=1),
        }
else:
    DATABASES = {
        "default": {
            # Django's, with a process's write transactions taken in turn (evalsite/sqlite).
            "ENGINE": "evalsite.sqlite",
            "NAME": Path(env_str("SQLITE_PATH", str(VAR_DIR / "evalsite.sqlite3"))),
            # Kept open (a file, no server slot to give back): reopening it per task, with its
            # pragmas, cost a worker ~2 ms a trial.
            "CONN_MAX_AGE": None,
            # IMMEDIATE takes the write lock at BEGIN, so the web process and
            # worker threads queue on `timeout` instead of failing with
            # "database is locked" when a read transaction tries to upgrade.
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            # A file, not :memory:, so a real worker process sees the test data.
            "TEST": {"NAME": str(VAR_DIR / "test_evalsite.sqlite3")},
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    # plotly/plotly.min.js, straight from the installed plotly package (no CDN, no copy).
    "runs_app.web.plotly_static.PlotlyFinder",
]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)  # whitenoise warns at start-up when it is missing
MEDIA_ROOT = Path(env_str("MEDIA_ROOT", str(VAR_DIR / "media")))
MEDIA_URL = "media/"
# Artifacts (kept workspaces) go to S3-compatible object storage when a bucket is named, so that
# worker hosts share nothing with the web host but the services (docs/deploy.md); to MEDIA_ROOT
# otherwise. The credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)
# or the host's role, as boto3 finds them.
S3_BUCKET = env_str("EVALSITE_S3_BUCKET")


def s3_storage(bucket: str, endpoint_url: str | None = None, region: str | None = None, prefix: str = ""):
    """django-storages' S3 backend on this bucket (any S3-compatible server: endpoint_url)."""
    return {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": bucket, "endpoint_url": endpoint_url, "region_name": region, "location": prefix,
            # Private objects, never overwritten (an artifact's name is unique per attempt).
            "default_acl": None, "file_overwrite": False, "querystring_auth": True,
        },
    }  # fmt: skip


STORAGES = {
    "default": (
        s3_storage(
            S3_BUCKET,
            env_str("EVALSITE_S3_ENDPOINT_URL") or None,
            env_str("EVALSITE_S3_REGION") or None,
            env_str("EVALSITE_S3_PREFIX", ""),
        )
        if S3_BUCKET
        else {"BACKEND": "django.core.files.storage.FileSystemStorage"}
    ),
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from the page, not the cookie
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Content Security Policy (django-csp): scripts only from this site (no inline script, no eval:
# htmx's conditions live in evalsite.js); inline styles stay allowed, since htmx, Plotly and
# the progress bars' widths set them.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}
# Login throttling (django-axes): a username + address is locked out after this many failed
# logins for AXES_COOLOFF_MINUTES (the login page says so; an admin can `manage.py axes_reset`).
AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("AXES_COOLOFF_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False  # no banner at every start-up of a command
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Behind TLS (production): secure cookies, HSTS and the proxy's scheme header, from the
# environment (docs/deploy.md). Off by default: `make run` serves plain HTTP on loopback.
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("SECURE_COOKIES", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
if env_bool("BEHIND_TLS_PROXY", False):  # the proxy says https in X-Forwarded-Proto
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    USE_X_FORWARDED_HOST = True

# --- Celery -----------------------------------------------------------------

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL")
BROKER_DIR = Path(env_str("BROKER_DIR", str(VAR_DIR / "broker"))).resolve()
if CELERY_BROKER_URL:
    if not CELERY_BROKER_URL.startswith(("redis://", "rediss://", "amqp://", "amqps://", "pyamqp://")):
        raise ImproperlyConfigured(
            "CELERY_BROKER_URL must be a redis://, rediss:// or amqp:// URL "
            "(leave it unset for the embedded filesystem broker)"
        )
    CELERY_BROKER_TRANSPORT_OPTIONS = {}
    if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
        # acks_late + a crash: Redis redelivers after the visibility timeout.
        # The lease reaper recovers sooner; this is only the backstop.
        CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
else:
    CELERY_BROKER_URL = "filesystem://"
    # kombu's filesystem transport, with messages written whole and taken once (the module says why).
    CELERY_BROKER_TRANSPORT = "evalsite.filesystem_broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = filesystem_broker.transport_options(BROKER_DIR)

CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
if WORKER_SLOTS:
    CELERY_WORKER_POOL = "threads"
    CELERY_WORKER_CONCURRENCY = WORKER_SLOTS
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Every worker takes the shared queue (dispatch, heartbeats, trials of runs that accept any code
# version) and its own code version's queue: a run's trials go to the queue of the version it was
# launched on, so a rolling upgrade never mixes two versions' results in one run.
CELERY_TASK_DEFAULT_QUEUE = SHARED_QUEUE
# A run with suite hooks sends its trials to the host that set the suite up: each worker also
# takes its host's copies of both queues. A worker whose host runs containers adds the container
# copies of them all when it starts (runs_app.tasks).
CELERY_TASK_QUEUES = {name: {} for name in worker_queues(code_version(), WORKER_HOST)}
CELERY_TIMEZONE = TIME_ZONE

# --- evalsite ----------------------------------------------------------------

# A task bundle (YAML plus every referenced file), uncompressed.
TASK_BUNDLE_MAX_BYTES = env_int("TASK_BUNDLE_MAX_BYTES", 20 * 1024 * 1024, minimum=1024)
EXAMPLES_DIR = BASE_DIR / "examples"
# Per-trial sandbox folders (workspace, HOME, /tmp), outside the checkout: every parent must be
# searchable by other users (a root worker's sandbox uid), the folder itself lists to nobody.
SANDBOX_ROOT = Path(env_str("SANDBOX_ROOT", "/var/tmp/evalsite-sandboxes"))
# Where the per-trial and per-suite folders go, if not under SANDBOX_ROOT (which keeps the host's
# staged runtimes and env_packages environments). A tmpfs here makes a trial's folders cost no
# disk journal: on a VM disk with online discard, making and removing them took ~7 ms a trial.
# Files there are memory (docs/deploy.md).
TRIAL_ROOT = Path(env_str("TRIAL_ROOT", "") or SANDBOX_ROOT)
# Task bundles a worker host has fetched from the database, one file per digest.
BUNDLE_CACHE_DIR = Path(env_str("BUNDLE_CACHE_DIR", str(VAR_DIR / "bundles")))
# Memory of one sandboxed command's whole process tree (cgroup), unless sandbox.limits says.
SANDBOX_MEMORY_MB = env_int("SANDBOX_MEMORY_MB", 2048, minimum=64)
# Disk use of a trial's workspace, HOME and /tmp together, unless sandbox.limits.max_disk_mb says.
SANDBOX_DISK_MB = env_int("SANDBOX_DISK_MB", 4096, minimum=16)
# Files and folders a trial may hold, unless sandbox.limits.max_inodes says.
SANDBOX_INODES = env_int("SANDBOX_INODES", 100_000, minimum=100)
# A running trial's lease; a worker renews it every third of this. An expired lease means
# the worker died: the reaper puts the trial back in the queue.
TRIAL_LEASE_SECONDS = env_int("TRIAL_LEASE_SECONDS", 30, minimum=2)
TRIAL_MAX_ATTEMPTS = env_int("TRIAL_MAX_ATTEMPTS", 3, minimum=1)
# `migrate` gives up on a table lock after this long instead of stalling every read behind it while
# a run is in flight (PostgreSQL: runs_app/management/commands/migrate.py; 0: wait as long as it
# takes).
MIGRATE_LOCK_TIMEOUT_SECONDS = env_float("MIGRATE_LOCK_TIMEOUT_SECONDS", 5.0, minimum=0.0)
# How long a worker keeps trying to report a trial's outcome while the database cannot be reached
# (its lease renewed meanwhile): a trial whose agent ran is reported, not run again. Past this,
# the trial is left to the reaper, which runs it again once the database is back.
TRIAL_REPORT_SECONDS = env_int("TRIAL_REPORT_SECONDS", 600, minimum=1)
REAPER_INTERVAL_SECONDS = env_float("REAPER_INTERVAL_SECONDS", 15.0, minimum=0.5)
# A queued trial whose dispatch message was not picked up in this time is dispatched again
# (the filesystem broker loses messages a killed worker had fetched).
REDISPATCH_AFTER_SECONDS = env_int("REDISPATCH_AFTER_SECONDS", 60, minimum=1)
TRIAL_EVENT_CAP = env_int("TRIAL_EVENT_CAP", 2000, minimum=10)
AGENT_OUTPUT_CAP_BYTES = env_int("AGENT_OUTPUT_CAP_BYTES", 256 * 1024, minimum=1024)
DIFF_CAP_BYTES = env_int("DIFF_CAP_BYTES", 256 * 1024, minimum=1024)
# Fail fast: a run stops (its queued trials cancelled) once this many trials ended in the same
# error before any trial was graded, e.g. every trial needing a key the workers lack. 0: never.
FAIL_FAST_AFTER = env_int("FAIL_FAST_AFTER", 5, minimum=0)
# A worker process reports every WORKER_HEARTBEAT_SECONDS; the run page says no worker is there
# after three missed reports.
WORKER_HEARTBEAT_SECONDS = env_int("WORKER_HEARTBEAT_SECONDS", 10, minimum=1)
# Whether this host's workers take container trials (sandbox.driver: docker): "docker", the engine
# `make containers` installs and starts (a worker takes them only if it answers when the worker
# starts), or "none".
CONTAINER_ENGINE = env_str("EVALSITE_CONTAINER_ENGINE", "docker")
if CONTAINER_ENGINE not in ("docker", "none"):
    raise ImproperlyConfigured(f"EVALSITE_CONTAINER_ENGINE={CONTAINER_ENGINE!r}: use docker or none")
# The engine's client: Debian's, never the first `docker` on PATH (a preinstalled one may lack the
# buildx plugin that BuildKit builds need).
DOCKER_CLI = env_str("EVALSITE_DOCKER", "/usr/bin/docker")
# A registry (host:port[/path]) container hosts share: a task's image is built once, pushed there,
# and pulled by the other hosts. Empty: each host builds the images it runs.
IMAGE_REGISTRY = env_str("EVALSITE_IMAGE_REGISTRY", "").rstrip("/")
# What the RUN steps of a task's Dockerfile reach: "none" by default (the engine's bridge reaches
# the host's own services); "default" lets builds download packages.
BUILD_NETWORK = env_str("EVALSITE_BUILD_NETWORK", "none")
if BUILD_NETWORK not in ("none", "default"):
    raise ImproperlyConfigured(f"EVALSITE_BUILD_NETWORK={BUILD_NETWORK!r}: use none or default")
# Worker variables a task's build secrets (`sandbox.docker.build.secrets: [id=X,env=NAME]`) may read.
BUILD_SECRET_NAMES = env_list("EVALSITE_BUILD_SECRETS", [])
# Worker environment variables an agent may receive (by naming them in its config). Nothing
# else leaves the worker's environment: not SECRET_KEY, not DATABASE_URL.
AGENT_SECRET_NAMES = env_list(
    "AGENT_SECRET_NAMES",
    [
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "OPENAI_API_KEY",
        "GEMINI_API_KEY",
        "VERTEX_ACCESS_TOKEN",
        "AWS_BEARER_TOKEN_BEDROCK",
    ],  # fmt: skip
)
# Besides staff, the members of this group may define command agents and name agent secrets.
AGENT_AUTHORS_GROUP = env_str("AGENT_AUTHORS_GROUP", "agent-authors")
# A launch never creates more trials than this (a typo in `repeats` must not fill the database).
MAX_TRIALS_PER_RUN = env_int("MAX_TRIALS_PER_RUN", 200_000, minimum=1)

# How often beat looks for scheduled runs whose time has come (a schedule's run starts at most
# this long after its time).
SCHEDULE_TICK_SECONDS = env_float("SCHEDULE_TICK_SECONDS", 30.0, minimum=0.5)

CELERY_BEAT_SCHEDULE = {
    "reap-expired-leases": {
        "task": "runs_app.tasks.reap_expired_leases",
        "schedule": REAPER_INTERVAL_SECONDS,
    },
    "launch-scheduled-runs": {
        "task": "runs_app.tasks.launch_scheduled_runs",
        "schedule": SCHEDULE_TICK_SECONDS,
    },
}

# Alerts of scheduled runs. E-mail goes through EMAIL_HOST's SMTP server; without one it is
# written to the worker's log (Django's console backend), so nothing is lost silently.
EMAIL_HOST = env_str("EMAIL_HOST")
EMAIL_BACKEND = env_str(
    "EMAIL_BACKEND",
    "django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "django.core.mail.backends.console.EmailBackend",
)
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 20, minimum=1)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "evalsite@localhost")
# A webhook that does not answer within this many seconds counts as not delivered.
ALERT_WEBHOOK_TIMEOUT = env_float("ALERT_WEBHOOK_TIMEOUT", 10.0, minimum=0.5)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "INFO"}},
}

# Serve static files straight from the app/static folders (no collectstatic step for `make run`).
WHITENOISE_USE_FINDERS = env_bool("WHITENOISE_USE_FINDERS", True)
