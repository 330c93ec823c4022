"""A team's daily loop in a real browser: a launch pre-flight refuses, the fix, the launch, the
history, a scheduled run that beat launches, its alert delivered to a local SMTP server and a
webhook, and the triage of one unit across variants. Debian's chromium through Playwright,
against the live test server and a real Celery worker running beat."""

import re

import pytest
from django.urls import reverse
from playwright.sync_api import expect

from conftest import WorkerProcess, purge_broker, wait_for
from experiments_app.definitions import import_experiment
from runs_app.models import Alert, Run, Schedule
from runs_app.tests.sinks import SmtpSink, WebhookSink
from tests.test_browser import ARTIFACTS, CHROMIUM, page  # noqa: F401 (the signed-in page fixture)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (make browser installs it)"),
]

NIGHTLY = """
experiment_id: nightly
description: The oracle against doing nothing, and Claude Code
tags: [smoke]
baseline: reference
max_parallel: 2
defaults:
  run_limits: {task_timeout: 60}
variants:
  - variant_id: reference
    agent: {type: oracle}
  - variant_id: no-op
    agent: {type: none}
  - variant_id: claude
    agent: {type: claude-code, model: claude-sonnet-4-6}
gates:
  - {type: min_pass_rate, variant: no-op, value: 0.5, name: no-op solves half}
"""


def test_a_team_fixes_a_launch_pre_flight_refused_schedules_it_gets_the_alert_and_triages(
    page,  # noqa: F811
    live_server,
    tmp_path,
    member,
):
    member.is_staff = True  # staff choose where webhooks are posted
    member.save(update_fields=["is_staff"])
    smtp, hook = SmtpSink(), WebhookSink()
    (tmp_path / "nightly.yaml").write_text(NIGHTLY)
    import_experiment(tmp_path / "nightly.yaml")
    purge_broker()
    env = {  # a worker with no model key, beat every second, mail to the local SMTP server
        "ANTHROPIC_API_KEY": "", "ANTHROPIC_AUTH_TOKEN": "", "SCHEDULE_TICK_SECONDS": "1",
        "EMAIL_HOST": "127.0.0.1", "EMAIL_PORT": str(smtp.port), "SITE_URL": live_server.url,
    }  # fmt: skip
    worker = WorkerProcess(tmp_path, beat=True, extra_env=env).start()
    wait_for(lambda: worker_reported(), timeout=60, message=lambda: f"the worker's report:\n{worker.log()}")
    try:
        # Pre-flight: the claude arm needs a key no live worker holds; no plain "Launch".
        page.goto(live_server.url + reverse("experiment_detail", args=["nightly"]))
        preflight = page.locator('[data-testid="preflight"]')
        expect(preflight).to_contain_text("a key for anthropic (ANTHROPIC_API_KEY)")
        expect(preflight).to_contain_text("set ANTHROPIC_API_KEY")
        expect(page.locator("#launch")).to_have_count(0)
        expect(page.locator("#launch-without")).to_have_text("Launch without claude")
        page.screenshot(path=ARTIFACTS / "preflight.png", full_page=True)

        # The fix: the experiment drops its claude arm; pre-flight is then clear.
        page.goto(live_server.url + reverse("experiment_edit", args=["nightly"]))
        page.check("#id_variants-2-DELETE")
        page.click("#experiment-form button[type=submit]")
        expect(page.locator(".message.success")).to_contain_text("Saved experiment nightly")
        expect(page.locator('[data-testid="preflight"]')).to_contain_text("ready")
        page.click("#launch")
        page.wait_for_url("**/runs/*/")
        expect(page.locator('[data-testid="percent"]')).to_have_text("100%", timeout=60_000)
        first = Run.objects.get(experiment__slug="nightly")

        # History: each variant's figures; then a nightly schedule alerting by mail and webhook.
        page.goto(live_server.url + reverse("experiment_history", args=["nightly"]))
        expect(page.locator('[data-testid="history-reference"]')).to_contain_text(f"#{first.pk}")
        expect(page.locator('[data-testid="history-no-op"]')).to_contain_text("0.0%")
        expect(page.locator("#chart-history.js-plotly-plot")).to_be_visible()
        page.locator("summary", has_text="Schedule runs").click()
        page.fill("#id_cron", "@nightly")
        page.fill("#id_emails", "team@example.com")
        page.fill("#id_webhook_url", hook.url)
        page.click('[data-testid="schedule-form"] button[type=submit]')
        expect(page.locator(".message.success")).to_contain_text("Scheduled: the next run starts at")
        expect(page.locator('[data-testid="schedules"]')).to_contain_text("@nightly")

        # "Run now": beat launches it at its next tick; its failed gate alerts.
        page.click('[data-testid="run-now"]')
        schedule = Schedule.objects.get()
        scheduled = wait_for(
            lambda: Run.objects.filter(schedule=schedule).first(), timeout=60,
            message=lambda: f"beat to launch the scheduled run; log:\n{worker.log()[-3000:]}",
        )  # fmt: skip
        [message] = smtp.wait(timeout=120)
        subject = f"[evalsite] nightly: scheduled run #{scheduled.pk} 1 gate failed: no-op solves half"
        assert message["Subject"].replace("\r\n", "") == subject  # a long subject is folded
        [body] = hook.wait(timeout=60)
        assert body["run"] == scheduled.pk and body["gates_passed"] is False
        wait_for(lambda: Alert.objects.filter(delivered=True).count() == 2, timeout=30)
        page.reload()
        expect(page.locator('[data-testid="alerts"]')).to_contain_text("1 gate failed: no-op solves half")
        expect(page.locator('[data-testid="history-reference"]')).to_contain_text("scheduled")
        page.screenshot(path=ARTIFACTS / "history.png", full_page=True)

        # The alert's link opens the comparison.
        page.goto(body["comparison_url"])
        expect(page.locator("h1")).to_contain_text(f"run #{scheduled.pk}")

        # Triage: the failures, grouped; one unit across variants; a label on its failed trial.
        page.goto(live_server.url + reverse("run_failures", args=[scheduled.pk]))
        group = page.locator('[data-testid="group-criterion"]').first
        expect(group).to_contain_text("no-op 3")
        group.locator("td a[title]").first.click()
        page.wait_for_url(re.compile(r".*/units/.*"))
        expect(page.locator('[data-testid="unit-reference"]')).to_contain_text("passed")
        no_op = page.locator('[data-testid="unit-no-op"]')
        expect(no_op).to_contain_text("failed")
        no_op.locator('input[name="label"]').fill("task bug")
        no_op.locator('textarea[name="text"]').fill("doing nothing cannot pass this")
        no_op.locator("button", has_text="Add to trial").click()
        expect(page.locator('[data-testid="unit-no-op"]')).to_contain_text("doing nothing cannot pass this")
        expect(page.locator('[data-testid="unit-no-op"]')).to_contain_text("bob")
        page.screenshot(path=ARTIFACTS / "unit.png", full_page=True)
    finally:
        worker.kill()
        smtp.stop()
        hook.stop()


def worker_reported() -> bool:
    from runs_app.models import Worker

    return Worker.objects.exclude(hostname="").exists()


def test_a_file_attached_in_the_form_is_offered_as_the_script_and_its_command(
    page,  # noqa: F811
    live_server,
    tmp_path,
    member,
):
    member.is_staff = True  # staff may define command agents
    member.save()
    script = tmp_path / "agent.py"
    script.write_text("open('out.txt', 'w').write('done')\n")
    page.goto(live_server.url + reverse("experiment_create"))
    page.fill("#id_experiment_id", "attached")
    page.fill("#id_include_tags", "smoke")
    page.fill("#id_variants-0-variant_id", "reference")
    page.select_option("#id_variants-0-agent_type", "oracle")
    page.fill("#id_variants-1-variant_id", "scripted")
    page.select_option("#id_variants-1-agent_type", "command")

    page.set_input_files("#id_attachment", str(script))

    expect(page.locator('#experiment-files option[value="agent.py"]')).to_have_count(1)
    expect(page.locator('#command-suggestions option[value="python3 {script}"]')).to_have_count(1)
    # The trap: a command naming the file as if it were in the workspace is refused, with the fix.
    page.fill("#id_variants-1-command", "python3 agent.py")
    page.click("#experiment-form button[type=submit]")
    problems = page.locator('[data-testid="form-problems"]')
    expect(problems).to_contain_text("agent.py is a file of the experiment, not of the task's workspace")
    expect(problems).to_contain_text("e.g. python3 {script}")
    # The fix the form offers: the script, and {script} in the command.
    page.set_input_files("#id_attachment", str(script))
    page.fill("#id_variants-1-script", "agent.py")
    page.fill("#id_variants-1-command", "python3 {script}")
    page.click("#experiment-form button[type=submit]")
    expect(page.locator(".message.success")).to_contain_text("Saved experiment attached")
    expect(page.locator('[data-testid="preflight"]')).to_be_visible()
