"""The experiment pages that show runs: the list with each last run, an experiment's page, launching."""

import pytest
from django.urls import reverse

from experiments_app.models import Experiment, Variant
from experiments_app.tests.test_views_experiments import _post_data_of
from runs_app.models import Run
from runs_app.tests.web.builders import launched_run, smoke_experiment

pytestmark = pytest.mark.django_db


def test_it_sends_anonymous_visitors_to_login(client):
    response = client.get(reverse("experiment_list"))

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_it_does_not_let_anonymous_visitors_launch(client):
    smoke_experiment()

    response = client.post(reverse("experiment_launch", args=["smoke"]))

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))
    assert not Run.objects.exists()


def test_it_lists_experiments_with_their_last_run(member_client, django_assert_max_num_queries):
    experiment = smoke_experiment()
    run = launched_run(experiment=experiment)
    for slug in ("alpha", "beta", "gamma"):
        Experiment.objects.create(slug=slug)
    member_client.get(reverse("experiment_list"))

    # The experiments with their last runs, those runs, and their variants' rates (one each).
    with django_assert_max_num_queries(6):
        response = member_client.get(reverse("experiment_list"))

    rows = {e.slug: e for e in response.context["experiments"]}
    assert rows["smoke"].last_run_pk == run.pk
    assert b"reference" in response.content and b"never run" in response.content


def test_it_shows_an_experiment_with_its_tasks_variants_and_runs(member_client):
    run = launched_run()

    response = member_client.get(reverse("experiment_detail", args=["smoke"]))

    assert response.status_code == 200
    assert response.context["task_count"] == 3
    assert response.context["trials_per_run"] == 3 * 2  # tasks × variants × one repeat
    assert b"baseline" in response.content
    assert run.get_absolute_url().encode() in response.content


def test_it_refuses_to_remove_a_variant_that_has_runs(member_client):
    launched_run()
    page = member_client.get(reverse("experiment_edit", args=["smoke"]))
    data = _post_data_of(page)
    data["variants-1-DELETE"] = "on"

    response = member_client.post(reverse("experiment_edit", args=["smoke"]), data)

    assert response.status_code == 200
    assert "has runs, so it cannot be deleted" in str(response.context["formset"][1].non_field_errors())
    assert Variant.objects.filter(experiment__slug="smoke").count() == 2


def test_it_launches_a_run_and_lands_on_its_page(member_client, member):
    smoke_experiment()

    response = member_client.post(reverse("experiment_launch", args=["smoke"]))

    run = Run.objects.get()
    assert response["Location"] == run.get_absolute_url()
    assert run.n_trials == 6 and run.started_by == member


def test_it_launches_with_one_off_changes(member_client):
    smoke_experiment()

    member_client.post(
        reverse("experiment_launch", args=["smoke"]),
        {"repeats": "2", "sample": "1", "overrides": "run_limits.task_timeout=120\n"},
    )

    run = Run.objects.get()
    assert run.n_trials == 1 * 2 * 2  # one task × two variants × two repeats
    assert run.overrides == ["run_limits.task_timeout=120"]


def test_it_shows_why_a_launch_failed(member_client):
    experiment = smoke_experiment()
    experiment.include_tags = ["no-such-tag"]
    experiment.save(update_fields=["include_tags"])

    response = member_client.post(reverse("experiment_launch", args=["smoke"]), follow=True)

    assert not Run.objects.exists()
    assert b"Cannot launch: experiment smoke selects no tasks" in response.content


@pytest.mark.django_db
def test_the_experiment_page_counts_exactly_the_trials_a_launch_makes(member_client):
    from experiments_app.models import Variant
    from runs_app.launching import launch_run
    from runs_app.tests.web.builders import smoke_experiment

    experiment = smoke_experiment()
    Variant.objects.filter(experiment=experiment, position=0).update(repeats=3)  # arms repeat differently
    page = member_client.get(reverse("experiment_detail", args=[experiment.slug]))

    launched = launch_run(experiment)

    assert page.context["trials_per_run"] == launched.n_trials
    assert sum(count for _, count, _ in page.context["preview"]) == launched.trials.count()
    assert "resolved config of its first" in page.content.decode()
    # The none and oracle arms do not show Claude Code's builtin model.
    assert not any("claude-sonnet" in config for _, _, config in page.context["preview"])


@pytest.mark.django_db(transaction=True)
def test_a_script_attached_in_the_form_runs_as_its_command_agent(
    admin_client, tmp_path, celery_worker_process
):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from experiments_app.models import Experiment
    from runs_app.launching import LaunchOptions, launch_run
    from runs_app.tests.factories import import_folder_tasks, make_task
    from runs_app.tests.workers import wait_for_run

    make_task(tmp_path, "needs-out", "task_id: needs-out\ninitial_prompt: go\nsuccess_criteria:\n"
              "  - {type: file_contains, path: out.txt, includes: [from-the-script]}\n")  # fmt: skip
    import_folder_tasks(tmp_path)
    prefix = "variants-0-"
    blank = ("description", "model", "base_url", "prompt_via", "permission_mode", "prompt_prefix",
             "prompt_suffix", "run_limits", "repeats", "other")  # fmt: skip
    fields = {"variant_id": "scripted", "agent_type": "command", "command": "python3 {script}",
              "options": "script: agent.py", **dict.fromkeys(blank, "")}  # fmt: skip
    data = {
        "experiment_id": "attached", "repeats": "1", "max_parallel": "1",
        **dict.fromkeys(("name", "description", "include_tags", "exclude_tags", "baseline", "run_limits",
                         "other_defaults", "gates"), ""),
        "variants-TOTAL_FORMS": "1", "variants-INITIAL_FORMS": "0", "variants-MIN_NUM_FORMS": "0",
        "variants-MAX_NUM_FORMS": "1000", **{prefix + k: v for k, v in fields.items()},
        "attachment": SimpleUploadedFile("agent.py", b"open('out.txt', 'w').write('from-the-script')\n"),
    }  # fmt: skip
    assert admin_client.post(reverse("experiment_create"), data).status_code == 302

    run = launch_run(Experiment.objects.get(slug="attached"), options=LaunchOptions(task_slugs=["needs-out"]))
    run = wait_for_run(run, timeout=60, worker=celery_worker_process)

    trial = run.trials.get()
    assert trial.status == "passed", (trial.error_message, trial.agent_stderr[-500:])


def _demo_with_a_worker_without_keys():
    from django.utils import timezone

    from evalsite.versioning import code_version
    from experiments_app.definitions import import_experiment
    from runs_app.models import Worker
    from runs_app.tests.factories import EXAMPLES, import_examples

    import_examples()
    Worker.objects.create(
        name="w1@host-a", hostname="host-a", code_version=code_version(), last_seen_at=timezone.now(),
        agent_versions={"claude-code": "2.0.1 (Claude Code)"}, providers=["openai"],
    )  # fmt: skip
    return import_experiment(EXAMPLES / "experiments" / "demo.yaml", root=EXAMPLES).experiment


def test_the_experiment_page_warns_of_a_variant_no_worker_can_run(member_client):
    _demo_with_a_worker_without_keys()

    page = member_client.get(reverse("experiment_detail", args=["demo"])).content.decode()

    assert 'data-testid="preflight"' in page and "1 problem" in page
    assert "a key for anthropic (ANTHROPIC_API_KEY)" in page
    assert "set ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN) in the environment of the workers" in page
    assert 'id="launch-anyway"' in page and 'id="launch"' not in page
    assert "Launch without claude" in page and 'value="reference,no-op,scripted"' in page


def test_a_launch_with_pre_flight_problems_waits_for_launch_anyway(member_client):
    _demo_with_a_worker_without_keys()
    url = reverse("experiment_launch", args=["demo"])

    refused = member_client.post(url, follow=True)

    assert not Run.objects.exists()
    text = refused.content.decode()
    assert "Not launched: pre-flight found 1 problem" in text
    assert "Pre-flight: claude: a key for anthropic (ANTHROPIC_API_KEY): no live worker has it" in text

    member_client.post(url, {"confirm": "1"})
    assert Run.objects.get().config["variants"][3]["slug"] == "claude"


def test_launching_without_the_refused_variant_runs_the_others(member_client):
    _demo_with_a_worker_without_keys()

    response = member_client.post(
        reverse("experiment_launch", args=["demo"]), {"variants": "reference,no-op,scripted"}
    )

    run = Run.objects.get()
    assert response["Location"] == run.get_absolute_url()
    assert [v["slug"] for v in run.config["variants"]] == ["reference", "no-op", "scripted"]
    assert run.config["baseline"] == "no-op"
    assert set(run.trials.values_list("variant__slug", flat=True)) == {"reference", "no-op", "scripted"}


def test_the_workers_page_shows_clis_keys_and_capabilities(member_client):
    _demo_with_a_worker_without_keys()

    page = member_client.get(reverse("worker_list")).content.decode()

    assert "claude-code: 2.0.1 (Claude Code)" in page
    assert '<span class="tag">openai</span>' in page
    assert "Keys for" in page and "Containers" in page


def test_its_page_refuses_a_design_too_small_to_show_anything(member_client):
    smoke_experiment()  # three tasks, two variants

    response = member_client.get(reverse("experiment_detail", args=["smoke"]))

    assert response.context["plan"].refused
    body = response.content.decode()
    assert 'data-testid="plan-refused"' in body
    assert "3 units × 1 repeat per variant: cannot show any difference, whatever the agents do" in body
    assert "At least 6 units are needed" in body
