"""The HTTP API: token auth, starting and following runs, trials, cancel, retry, errors."""

import csv
import io
import json

import pytest
from django.conf import settings

from experiments_app.definitions import import_experiment, import_tasks
from runs_app.analysis import rollup
from runs_app.models import Run, Trial
from runs_app.tokens import create_token, revoke_token

EXAMPLES = settings.BASE_DIR / "examples"

pytestmark = pytest.mark.django_db


@pytest.fixture
def smoke():
    """The `smoke` experiment: 3 example tasks × (reference, no-op)."""
    import_tasks([EXAMPLES / "tasks"])
    return import_experiment(EXAMPLES / "experiments" / "smoke.yaml", root=EXAMPLES).experiment


@pytest.fixture
def member_token(member):
    return create_token(member, "bobs-pipeline")[1]


@pytest.fixture
def outsider_token(outsider):
    return create_token(outsider, "carols-private-token")[1]


def call(client, method: str, url: str, token: str | None = None, body=None, raw: str | None = None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    return getattr(client, method)(url, data=data, content_type="application/json", **headers)


def start(client, token: str, body=None, slug: str = "smoke"):
    return call(client, "post", f"/api/experiments/{slug}/runs", token, body if body is not None else {})


def assert_json_error(response, status: int, field: str | None = None) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    data = response.json()
    assert isinstance(data["detail"], str) and data["detail"]
    assert data["field"] == field
    return data


def test_it_requires_a_token(client, smoke):
    for method, url in [("get", "/api/experiments"), ("get", "/api/runs/1"), ("post", "/api/runs/1/cancel")]:
        response = call(client, method, url)
        assert_json_error(response, 401)
        assert response["WWW-Authenticate"] == "Bearer"


def test_it_ignores_a_logged_in_session_without_a_token(member_client, smoke):
    # Cookies never authorise an API call, so a forged cross-site request cannot launch a run.
    assert_json_error(start(member_client, token=None), 401)
    assert not Run.objects.exists()


def test_it_rejects_a_wrong_token(client, member_token, smoke):
    assert_json_error(call(client, "get", "/api/experiments", member_token + "x"), 401)
    assert_json_error(call(client, "get", "/api/experiments", "not-a-token"), 401)


def test_it_rejects_a_revoked_token(client, member):
    token, raw = create_token(member, "old")
    assert call(client, "get", "/api/experiments", raw).status_code == 200
    revoke_token(token)
    assert_json_error(call(client, "get", "/api/experiments", raw), 401)


def test_it_lists_experiments(client, member_token, smoke):
    response = call(client, "get", "/api/experiments", member_token)
    assert response.status_code == 200
    [experiment] = response.json()
    assert experiment["slug"] == "smoke" and experiment["baseline"] == "no-op"
    assert [v["slug"] for v in experiment["variants"]] == ["reference", "no-op"]


def test_it_starts_a_run_with_overrides(client, member, member_token, smoke):
    body = {"overrides": ["run_limits.max_turns=3"], "repeats": 2, "max_parallel": 1, "seed": 7}
    response = start(client, member_token, body)
    assert response.status_code == 201, response.content
    data = response.json()
    run = Run.objects.get(pk=data["id"])
    assert run.started_by == member and run.max_parallel == 1 and run.sample_seed == 7
    assert data["counts"]["trials"] == 3 * 2 * 2 == run.trials.count()
    assert data["counts"]["queued"] == 12 and data["started_by"] == "bob"
    assert data["overrides"] == ["run_limits.max_turns=3"]
    assert {t.config["run_limits"]["max_turns"] for t in run.trials.all()} == {3}
    assert data["url"] == run.get_absolute_url()


def test_it_starts_a_sampled_run_for_one_agent_type(client, member_token, smoke):
    response = start(client, member_token, {"sample": 1, "seed": 3, "agent_type": "none"})
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["id"])
    assert run.trials.count() == 2
    assert {t.config["agent"]["type"] for t in run.trials.all()} == {"none"}


def test_it_answers_a_launch_problem_with_400(client, member_token, smoke):
    data = assert_json_error(
        start(client, member_token, {"overrides": ["no_such_field=1"]}), 400, "overrides"
    )
    assert "no_such_field" in data["detail"]
    assert_json_error(start(client, member_token, {"overrides": ["a=1", "a=2"]}), 400, "overrides")
    assert_json_error(start(client, member_token, {"tags": ["no-task-has-this"]}), 400, "overrides")
    assert_json_error(start(client, member_token, {"overrides": ["repeats=100000"]}), 400, "overrides")
    deep = "agent.options=" + "[" * 490 + "]" * 490
    assert_json_error(start(client, member_token, {"overrides": [deep]}), 400, "overrides")
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"repeats": 0}, "repeats"),
        ({"repeats": "many"}, "repeats"),
        ({"sample": -1}, "sample"),
        ({"seed": 2**64}, "seed"),
        ({"overrides": "a=1"}, "overrides"),
        ({"overrides": ["a=\u0000"]}, "overrides.0"),
        ({"tags": ["Not A Tag"]}, "tags.0"),
        ({"agent_type": "robot"}, "agent_type"),
        ({"surprise": True}, "surprise"),
        ([1, 2], None),
    ],
)
def test_it_answers_a_bad_payload_with_422_json(client, member_token, smoke, body, field):
    data = assert_json_error(start(client, member_token, body), 422, field)
    if field:
        assert field in data["detail"]
    assert not Run.objects.exists()


def test_it_answers_malformed_json_with_400(client, member_token, smoke):
    assert_json_error(call(client, "post", "/api/experiments/smoke/runs", member_token, raw="{oops"), 400)


def test_it_answers_unknown_things_with_404_json(client, member_token, smoke):
    assert_json_error(start(client, member_token, slug="nope"), 404, "slug")
    assert_json_error(call(client, "get", "/api/runs/999", member_token), 404, "run_id")
    assert_json_error(call(client, "get", f"/api/runs/{2**70}", member_token), 422, "run_id")


def test_it_shows_a_runs_status_counts_gates_and_summary(client, member_token, outsider_token, smoke):
    run_id = start(client, member_token).json()["id"]
    trials = Trial.objects.filter(run_id=run_id).order_by("pk")
    reference = [t for t in trials if t.variant.slug == "reference"]
    Trial.objects.filter(pk__in=[t.pk for t in reference[:2]]).update(status="passed", score=1.0)
    Trial.objects.filter(pk=reference[2].pk).update(status="error")
    rollup.recount(Run.objects.get(pk=run_id))
    Run.objects.filter(pk=run_id).update(gate_results=[{"gate": "min_pass_rate", "passed": False}])
    # Runs are visible to every member of the team.
    response = call(client, "get", f"/api/runs/{run_id}", outsider_token)
    assert response.status_code == 200
    data = response.json()
    assert data["counts"] == {"trials": 6, "done": 3, "queued": 3, "running": 0, "passed": 2, "failed": 0,
                              "errors": 1, "cancelled": 0}  # fmt: skip
    assert data["gates"]["results"] == [{"gate": "min_pass_rate", "passed": False}]
    assert data["gates"]["passed"] is None
    summary = data["summary"]
    assert summary["baseline"] == "no-op"
    by_variant = {arm["variant"]: arm for arm in summary["arms"]}
    # Errors are shown apart, never counted as fails: 2 passed of 2 graded.
    assert by_variant["reference"]["pass_rate"] == 1.0 and by_variant["reference"]["errors"] == 1
    assert 0 < by_variant["reference"]["pass_rate_low"] < 1.0 == by_variant["reference"]["pass_rate_high"]
    assert by_variant["no-op"]["pass_rate"] is None


def test_it_pages_through_a_runs_trials(client, member_token, smoke):
    run_id = start(client, member_token, {"repeats": 2}).json()["id"]
    url = f"/api/runs/{run_id}/trials"
    first = call(client, "get", url + "?page_size=5", member_token).json()
    assert first["count"] == 12 and len(first["items"]) == 5 and first["next_page"] == 2
    last = call(client, "get", url + "?page_size=5&page=3", member_token).json()
    assert len(last["items"]) == 2 and last["next_page"] is None
    ids = [t["id"] for page in (1, 2, 3) for t in call(client, "get", f"{url}?page_size=5&page={page}",
                                                            member_token).json()["items"]]  # fmt: skip
    assert sorted(ids) == sorted(Trial.objects.filter(run_id=run_id).values_list("pk", flat=True))
    only = call(client, "get", url + "?variant=no-op", member_token).json()
    assert only["count"] == 6 and {t["variant"] for t in only["items"]} == {"no-op"}
    assert_json_error(call(client, "get", url + "?page=0", member_token), 422, "page")
    assert_json_error(call(client, "get", url + "?status=bogus", member_token), 422, "status")


def test_it_exports_a_runs_trials_as_csv(client, member_token, smoke):
    run_id = start(client, member_token).json()["id"]
    Trial.objects.filter(run_id=run_id).update(error_message='=HYPERLINK("http://x")')
    response = call(client, "get", f"/api/runs/{run_id}/trials?format=csv", member_token)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert len(rows) == 6 and {row["task"] for row in rows} == set(Run.objects.get(pk=run_id).config["tasks"])
    # A spreadsheet must not run agent-written text as a formula.
    assert all(row["error_message"].startswith("'=") for row in rows)


def test_it_lets_the_starter_cancel_a_run(client, member_token, smoke):
    run_id = start(client, member_token).json()["id"]
    response = call(client, "post", f"/api/runs/{run_id}/cancel", member_token)
    assert response.status_code == 200
    data = response.json()
    assert data["status"] == "cancelled" and data["counts"]["cancelled"] == 6
    assert_json_error(call(client, "post", f"/api/runs/{run_id}/cancel", member_token), 409)


def test_it_forbids_another_member_to_cancel_or_retry(client, member_token, outsider_token, smoke):
    run_id = start(client, member_token).json()["id"]
    assert_json_error(call(client, "post", f"/api/runs/{run_id}/cancel", outsider_token), 403)
    assert_json_error(call(client, "post", f"/api/runs/{run_id}/retry-errors", outsider_token), 403)
    assert Run.objects.get(pk=run_id).cancel_requested is False


def test_it_lets_staff_cancel_any_run(client, member_token, admin_user, smoke):
    run_id = start(client, member_token).json()["id"]
    staff_token = create_token(admin_user, "admin")[1]
    assert call(client, "post", f"/api/runs/{run_id}/cancel", staff_token).status_code == 200


def test_it_retries_errored_trials(client, member_token, smoke):
    run_id = start(client, member_token).json()["id"]
    errored = Trial.objects.filter(run_id=run_id).first()
    Trial.objects.filter(pk=errored.pk).update(status="error", error_category="agent_error")
    response = call(client, "post", f"/api/runs/{run_id}/retry-errors", member_token)
    assert response.status_code == 200
    assert response.json()["retried"] == 1
    new = Trial.objects.get(previous_attempt=errored)
    assert new.is_latest and new.attempt == 2 and new.status == "queued"


def test_it_keeps_historical_runs_read_only(client, member, member_token, smoke):
    run = Run.objects.create(experiment=smoke, historical=True, status="finished", started_by=member)
    assert_json_error(call(client, "post", f"/api/runs/{run.pk}/cancel", member_token), 409)
    assert_json_error(call(client, "post", f"/api/runs/{run.pk}/retry-errors", member_token), 409)


def test_it_never_shows_another_users_tokens_or_email(client, member_token, outsider, outsider_token, smoke):
    run_id = start(client, outsider_token).json()["id"]
    outsider_prefix = outsider.api_tokens.get().prefix
    urls = ["/api/experiments", f"/api/runs/{run_id}", f"/api/runs/{run_id}/trials"]
    for url in urls:
        body = call(client, "get", url, member_token).content.decode()
        for secret in (outsider_token, outsider_prefix, "carols-private-token", "carol@example.com"):
            assert secret not in body, (url, secret)
    schema = client.get("/api/openapi.json").content.decode()
    assert "carol" not in schema


def test_it_serves_a_valid_openapi_schema_and_docs(client):
    import schemathesis

    response = client.get("/api/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    assert {"/api/experiments/{slug}/runs", "/api/runs/{run_id}/trials"} <= set(schema["paths"])
    assert "bearer" in json.dumps(schema["components"]["securitySchemes"]).lower()
    schemathesis.openapi.from_dict(schema).validate()  # raises on a schema that breaks the OpenAPI spec


def test_it_shows_the_api_docs_only_to_signed_in_people(client, member):
    anonymous = client.get("/api/docs")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")

    client.force_login(member)
    assert client.get("/api/docs").status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        {"agent_type": "command"},
        {"overrides": ["agent.command=id"]},
        {"overrides": ["agent.secrets=[GITHUB_TOKEN]"]},
    ],
)
def test_only_staff_and_agent_authors_run_command_agents_or_name_secrets(client, member_token, smoke, body):
    response = start(client, member_token, body)

    assert response.status_code == 400
    assert "may run a command agent or hand agents secrets" in response.json()["detail"]
    assert not Run.objects.exists()


@pytest.fixture
def demo_without_keys():
    from django.utils import timezone

    from evalsite.versioning import code_version
    from runs_app.models import Worker

    import_tasks([EXAMPLES / "tasks"])
    Worker.objects.create(
        name="w1@host-a",
        hostname="host-a",
        code_version=code_version(),
        last_seen_at=timezone.now(),
        agent_versions={"claude-code": "2.0.1"},
    )
    return import_experiment(EXAMPLES / "experiments" / "demo.yaml", root=EXAMPLES).experiment


def test_it_checks_a_launch_before_it_starts(client, member_token, demo_without_keys):
    response = call(client, "get", "/api/experiments/demo/preflight", member_token)

    assert response.status_code == 200
    data = response.json()
    assert data["ok"] is False and data["workers"] == ["w1@host-a"]
    [key] = [check for check in data["checks"] if check["check"] == "API key"]
    assert (key["variant"], key["level"]) == ("claude", "fail")
    assert "ANTHROPIC_API_KEY" in key["fix"]
    assert "sk-" not in response.content.decode()


def test_it_refuses_a_launch_with_pre_flight_problems_unless_told(client, member_token, demo_without_keys):
    refused = start(client, member_token, slug="demo")

    data = assert_json_error(refused, 409, "preflight")
    assert "claude: a key for anthropic (ANTHROPIC_API_KEY): no live worker has it" in data["detail"]
    assert not Run.objects.exists()

    without = start(client, member_token, {"variants": ["reference", "no-op"]}, slug="demo")
    assert without.status_code == 201, without.content
    anyway = start(client, member_token, {"launch_anyway": True}, slug="demo")
    assert anyway.status_code == 201, anyway.content
    two, four = Run.objects.order_by("pk")
    assert four.n_trials == 2 * two.n_trials  # four variants, not two
    assert set(two.trials.values_list("variant__slug", flat=True)) == {"reference", "no-op"}


def test_it_refuses_a_variant_the_experiment_lacks(client, member_token, smoke):
    data = assert_json_error(start(client, member_token, {"variants": ["nope"]}), 400, "overrides")

    assert "has no variant 'nope'" in data["detail"]


def test_it_downloads_and_uploads_an_experiments_zip(client, member):
    from django.contrib.auth.models import Group
    from django.core.files.uploadedfile import SimpleUploadedFile

    from experiments_app.models import Experiment

    import_tasks([EXAMPLES / "tasks"], task_set="examples")
    demo = import_experiment(EXAMPLES / "experiments" / "demo.yaml", root=EXAMPLES).experiment
    member.groups.add(Group.objects.create(name="agent-authors"))
    auth = {"HTTP_AUTHORIZATION": f"Bearer {create_token(member, 'ci')[1]}"}
    download = client.get("/api/experiments/demo/bundle", **auth)
    assert download.status_code == 200 and download["Content-Type"] == "application/zip"
    stored = demo.bundle_id
    demo.delete()

    def upload(**fields):
        body = {"file": SimpleUploadedFile("demo.zip", download.content), **fields}
        return client.post("/api/experiments", body, **auth)

    created = upload()
    assert created.status_code == 201, created.content
    assert created.json()["created"] is True and created.json()["experiment"]["slug"] == "demo"
    assert Experiment.objects.get(slug="demo").bundle_id == stored
    again = upload()
    assert again.status_code == 400 and "exists already" in again.json()["detail"]
    replaced = upload(replace="true")
    assert replaced.status_code == 201 and replaced.json()["created"] is False


def test_it_answers_an_upload_without_its_file_with_422_json(client, member_token):
    response = client.post(
        "/api/experiments", {"replace": "true"}, HTTP_AUTHORIZATION=f"Bearer {member_token}"
    )

    assert_json_error(response, 422, "file")
