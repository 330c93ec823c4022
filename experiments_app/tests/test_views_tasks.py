import pytest
from django.urls import reverse

from experiments_app.models import Task, TaskSet
from experiments_app.tests.factories import smoke_experiment

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("name", ["taskset_list", "task_list"])
def test_it_sends_anonymous_visitors_to_login(client, name):
    response = client.get(reverse(name))

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_it_shows_task_sets_and_their_tasks_to_any_member(client, outsider):
    smoke_experiment()
    client.force_login(outsider)

    listing = client.get(reverse("taskset_list"))
    detail = client.get(reverse("taskset_detail", args=["examples"]))

    assert listing.status_code == 200
    assert [(s.name, s.task_count) for s in listing.context["task_sets"]] == [("examples", 14)]
    assert b"/edit/" not in listing.content  # no edit links for non-staff
    assert detail.status_code == 200
    assert len(detail.context["tasks"]) == 14
    assert b"fix-mean" in detail.content


@pytest.mark.parametrize("method", ["get", "post"])
def test_it_lets_only_staff_edit_a_task_set(client, outsider, method):
    smoke_experiment()
    client.force_login(outsider)

    response = getattr(client, method)(reverse("taskset_edit", args=["examples"]), {"name": "hijacked"})

    assert response.status_code == 403
    assert TaskSet.objects.filter(name="examples").exists()


def test_it_lets_staff_rename_a_task_set_and_choose_its_tasks(admin_client):
    smoke_experiment()
    kept = list(Task.objects.filter(tags__icontains="smoke").values_list("pk", flat=True))

    response = admin_client.post(
        reverse("taskset_edit", args=["examples"]),
        {"name": "smoke-only", "description": "three quick tasks", "tasks": [str(pk) for pk in kept]},
    )

    assert response.status_code == 302
    assert response["Location"] == reverse("taskset_detail", args=["smoke-only"])
    task_set = TaskSet.objects.get()
    assert task_set.name == "smoke-only"
    assert sorted(task_set.tasks.values_list("pk", flat=True)) == sorted(kept)


def test_it_filters_tasks_by_tag_and_text(member_client, django_assert_max_num_queries):
    smoke_experiment()
    member_client.get(reverse("task_list"))

    with django_assert_max_num_queries(6):  # session, user, tag match, count, page, task sets
        smoke = member_client.get(reverse("task_list"), {"tag": "smoke"})
    by_text = member_client.get(reverse("task_list"), {"q": "slugify"})

    assert len(smoke.context["page"]) == 3
    assert [t.slug for t in by_text.context["page"]] == ["slugify"]


def test_it_shows_a_task_with_its_prompt_criteria_and_yaml(member_client):
    smoke_experiment()
    task = Task.objects.get(slug="fix-mean")

    response = member_client.get(reverse("task_detail", args=["fix-mean"]))

    assert response.status_code == 200
    body = response.content.decode()
    assert "Our nightly report shows wrong averages" in body
    assert len(response.context["criteria"]) == len(task.spec["success_criteria"])
    assert "task_id: fix-mean" in body


def test_it_imports_and_shows_a_task_whose_id_holds_dots(member_client, tmp_path):
    from experiments_app.definitions import import_tasks

    (tmp_path / "task.yaml").write_text(
        "task_id: my.task\ninitial_prompt: Create out.txt\n"
        "success_criteria:\n  - type: file_exists\n    path: out.txt\n"
    )
    import_tasks([tmp_path])

    response = member_client.get(reverse("task_detail", args=["my.task"]))

    assert response.status_code == 200 and b"my.task" in response.content
    assert Task.objects.get(slug="my.task").full_clean() is None
