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

    with django_assert_max_num_queries(4):
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
