"""Fuzz the HTTP API with schemathesis, in-process over WSGI, with a valid token: whatever
the payload, path or query, the answer is never a 5xx."""

import pytest
import schemathesis
from django.conf import settings
from django.core import signals
from django.db import close_old_connections
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import not_a_server_error

from evalsite.wsgi import application
from experiments_app.definitions import import_experiment, import_tasks
from runs_app.launching import launch_run
from runs_app.tokens import create_token

EXAMPLES = settings.BASE_DIR / "examples"

# Loaded at collection: serving the schema needs no database. (schemathesis' lazy
# `from_fixture` loader does not work with pytest 9.)
schema = schemathesis.openapi.from_wsgi("/api/openapi.json", application)


@pytest.fixture
def fuzz_target(db, member):
    """A real experiment and a run started by the token's user, so the fuzzer reaches past 404s."""
    import_tasks([EXAMPLES / "tasks"])
    experiment = import_experiment(EXAMPLES / "experiments" / "smoke.yaml", root=EXAMPLES).experiment
    run = launch_run(experiment, user=member)
    # The WSGI handler closes the database connection after each request; the test's
    # transaction must survive it, as Django's own test client arranges.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield {"token": create_token(member, "fuzz")[1], "slug": experiment.slug, "run_id": run.pk}
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@schema.parametrize()
@hypothesis_settings(
    max_examples=60,
    deadline=None,
    database=None,  # no .hypothesis folder in the checkout
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_it_never_answers_with_a_server_error(case, fuzz_target):
    params = case.path_parameters or {}
    if "slug" in params:
        params["slug"] = fuzz_target["slug"]  # a random slug only ever finds a 404
    run_id = params.get("run_id")
    if isinstance(run_id, int) and run_id > 0 and run_id % 2 == 0:
        params["run_id"] = fuzz_target["run_id"]  # half the time: a run that exists
    case.call_and_validate(
        headers={"Authorization": f"Bearer {fuzz_target['token']}"}, checks=[not_a_server_error]
    )
