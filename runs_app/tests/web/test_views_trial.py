import pytest
from django.urls import reverse
from django.utils import timezone

from runs_app import control
from runs_app.models import CriterionResult, Trial, TrialEvent
from runs_app.templatetags.formatting import diff_lines
from runs_app.tests.web.builders import finish_run, finish_trial, launched_run

pytestmark = pytest.mark.django_db

XSS = "<script>alert(1)</script>"
DIFF = """diff --git a/app.py b/app.py
--- a/app.py
+++ b/app.py
@@ -1,2 +1,2 @@
 def mean(xs):
--- return sum(xs)
+    return sum(xs) / len(xs)
"""


def _trial() -> Trial:
    run = launched_run()
    trial = finish_trial(
        run.trials.order_by("pk").first(), "failed", score=0.5, input_tokens=1000, output_tokens=200,
        cost_usd=0.0123, diff=DIFF,
        lineage={"run_limits.task_timeout": "experiment", "agent.type": "variant"},
    )  # fmt: skip
    CriterionResult.objects.create(
        trial=trial, index=0, type="run_command", description="tests pass", score=0.0, passed=False,
        details={"stdout": "1 failed", "expected": XSS},
    )  # fmt: skip
    events = [
        ("phase", {"phase": "agent", "kind": "command"}),
        ("message", {"text": f"I will fix it {XSS}"}),
        ("tool_call", {"id": "c1", "name": "Bash", "input": {"command": f"echo '{XSS}'"}}),
        ("tool_result", {"id": "c1", "name": "Bash", "is_error": False, "output": "needle in the output"}),
        ("output", {"text": '<img src=x onerror="alert(1)">'}),
        (
            "output",
            {
                "step": "pre_run[0]",
                "command": "pip install -e .",
                "exit_code": 1,
                "stdout": "",
                "stderr": "boom",
            },
        ),
    ]
    TrialEvent.objects.bulk_create(
        TrialEvent(trial=trial, seq=i + 1, at=timezone.now(), kind=kind, data=data)
        for i, (kind, data) in enumerate(events)
    )
    return trial


def test_it_sends_anonymous_visitors_to_login(client):
    trial = _trial()

    response = client.get(trial.get_absolute_url())

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_it_shows_outcome_criteria_transcript_diff_and_config(member_client):
    trial = _trial()

    response = member_client.get(trial.get_absolute_url())

    assert response.status_code == 200
    body = response.content.decode()
    assert "tests pass" in body and "✗ fail" in body
    assert "needle in the output" in body
    assert "pip install -e ." in body and "boom" in body
    assert "$0.0123" in body and "1200" in body
    assert '<span class="add">+    return sum(xs) / len(xs)</span>' in body
    assert "<code>run_limits.task_timeout</code>" in body and ">experiment<" in body
    assert f"task_id: {trial.config['task_id']}" in body  # the resolved config, as YAML
    assert "agent:\n  type: " in body
    assert 'id="transcript-filter"' in body


def test_it_escapes_agent_output_everywhere(member_client):
    trial = _trial()
    Trial.objects.filter(pk=trial.pk).update(agent_stdout=XSS, error_message=XSS, prompt=XSS)

    body = member_client.get(trial.get_absolute_url()).content.decode()

    assert XSS not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "<img src=x" not in body
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in body


def test_it_classes_each_diff_line():
    rows = diff_lines(DIFF)

    assert [css for css, _ in rows] == ["file", "file", "file", "hunk", "", "del", "add"]
    assert diff_lines("<b>+x</b>\n+<i>") == [("", "<b>+x</b>"), ("add", "+<i>")]  # text, not markup
    assert diff_lines(None) == []


def test_it_links_previous_attempts_of_the_same_trial(member_client):
    run = finish_run(launched_run(), ["error"])
    control.retry_errors(run, control.COMMAND_LINE)
    retried = Trial.objects.filter(run=run, is_latest=True).order_by("pk").first()

    response = member_client.get(retried.get_absolute_url())

    attempts = list(response.context["attempts"])
    assert [a.pk for a in attempts] == [retried.previous_attempt_id]
    assert response.context["trial"].attempt == 2
    old = member_client.get(attempts[0].get_absolute_url()).content.decode()
    assert "a later attempt replaced this one" in old


def test_it_hides_a_trial_behind_another_runs_url(member_client):
    trial = _trial()
    other = launched_run()

    response = member_client.get(reverse("trial_detail", args=[other.pk, trial.pk]))

    assert response.status_code == 404


def test_it_keeps_the_trial_page_query_count_flat(member_client, django_assert_max_num_queries):
    trial = _trial()
    member_client.get(trial.get_absolute_url())

    with django_assert_max_num_queries(7):  # + its labels and notes
        response = member_client.get(trial.get_absolute_url())

    assert response.status_code == 200


def test_the_transcript_sums_usage_up_once_and_shows_a_repeated_error_once(member_client):
    trial = finish_trial(launched_run().trials.order_by("pk").first(), "error")
    now = timezone.now()
    usage = {"input_tokens": 10, "output_tokens": 5, "turns": 1}
    gateway = {"source": "gateway", "api": "anthropic", "status": 200, "input_tokens": 7}
    for seq, (kind, data) in enumerate(
        [
            ("usage", usage),
            ("usage", gateway),
            ("error", {"message": "the API rejected the key", "category": "auth"}),
            ("usage", {**gateway, "input_tokens": 3}),
            ("error", {"message": "the API rejected the key", "category": "auth"}),
            ("usage", {**usage, "output_tokens": 6}),  # the final totals
        ],
        start=1,
    ):
        TrialEvent.objects.create(trial=trial, seq=seq, at=now, kind=kind, data=data)

    page = member_client.get(reverse("trial_detail", args=[trial.run_id, trial.pk]))

    rows = page.context["events"]
    assert [(r.seq, r.kind) for r in rows] == [(3, "error"), (6, "usage")]
    summary = rows[-1]
    assert "output tokens 6" in summary.text
    assert summary.body.count("call ") == 2 and "input tokens 3" in summary.body


def test_the_resolved_config_shows_only_the_options_the_agent_kind_reads(member_client):
    trial = finish_trial(launched_run().trials.order_by("pk").first(), "passed")
    config = {"agent": {"type": "oracle", "model": "m", "permission_mode": "acceptEdits",
                        "allowed_tools": ["Bash"]}, "repeats": 1}  # fmt: skip
    lineage = {"agent.type": "variant", "agent.model": "experiment", "agent.permission_mode": "experiment"}
    Trial.objects.filter(pk=trial.pk).update(config=config, lineage=lineage)

    page = member_client.get(reverse("trial_detail", args=[trial.run_id, trial.pk]))

    shown = page.context["config_yaml"]
    assert "permission_mode" not in shown and "allowed_tools" not in shown and "type: oracle" in shown
    assert page.context["config_hidden"] == ["allowed_tools", "permission_mode"]


def test_a_command_agent_is_not_shown_the_builtin_claude_model(member_client):
    trial = finish_trial(launched_run().trials.order_by("pk").first(), "passed")
    config = {"agent": {"type": "command", "command": "./go", "model": "claude-sonnet-4-6"}, "repeats": 1}
    lineage = {"agent.type": "variant", "agent.command": "variant", "agent.model": "builtin"}
    Trial.objects.filter(pk=trial.pk).update(config=config, lineage=lineage)

    page = member_client.get(reverse("trial_detail", args=[trial.run_id, trial.pk]))

    assert "claude" not in page.context["config_yaml"] and page.context["config_hidden"] == ["model"]
    # A model the variant set is the variant's: shown.
    Trial.objects.filter(pk=trial.pk).update(lineage={**lineage, "agent.model": "variant"})
    page = member_client.get(reverse("trial_detail", args=[trial.run_id, trial.pk]))
    assert "model: claude-sonnet-4-6" in page.context["config_yaml"]


def test_a_tool_call_and_its_output_read_as_one_item_and_criteria_details_as_fields(member_client):
    trial = finish_trial(launched_run().trials.order_by("pk").first(), "failed")
    now = timezone.now()
    call = {"id": "c1", "name": "Bash", "input": {"command": "pytest -q"}}
    result = {"id": "c1", "name": "Bash", "is_error": True, "output": "2 failed"}
    TrialEvent.objects.create(trial=trial, seq=1, at=now, kind="tool_call", data=call)
    TrialEvent.objects.create(trial=trial, seq=2, at=now, kind="tool_result", data=result)
    CriterionResult.objects.create(trial=trial, index=0, type="run_command", description="tests", score=0.0,
                                   passed=False, details={"exit_code": 1, "stdout": "2 failed"})  # fmt: skip

    page = member_client.get(reverse("trial_detail", args=[trial.run_id, trial.pk]))

    [item] = page.context["events"]
    assert item.title == "Bash → error" and "pytest -q" in item.body and "2 failed" in item.body
    html = page.content.decode()
    assert "<dt>exit code</dt><dd>1</dd>" in html and "<dt>stdout</dt><dd>2 failed</dd>" in html


def test_it_shows_what_ran_the_trial_and_its_command_efficiency(member_client):
    from runs_app.engine import identity

    trial = _trial()
    trial.components = {
        "agent": identity.component("claude-code 2.1.197 (Claude Code)"),
        "environment": identity.component({"sandbox": "bubblewrap 0.8.0", "image": XSS}),
    }
    trial.trajectory = {"tool_calls": [], "commands": {"actual": 6, "expected": 3, "efficiency": 0.5}}
    trial.save(update_fields=["components", "trajectory"])

    page = member_client.get(trial.get_absolute_url()).content.decode()

    assert "claude-code 2.1.197 (Claude Code)" in page and trial.components["agent"]["fingerprint"] in page
    assert "sandbox bubblewrap 0.8.0" in page and XSS not in page
    assert "6 of 3 expected (efficiency 0.500)" in page
