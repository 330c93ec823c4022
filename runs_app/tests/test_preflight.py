"""Launch pre-flight: each variant's needs against what the live workers report."""

from datetime import timedelta

import pytest
from django.utils import timezone

from evalsite.versioning import code_version
from experiments_app.definitions import import_experiment
from runs_app import preflight
from runs_app.launching import LaunchOptions
from runs_app.models import Worker
from runs_app.tests.factories import EXAMPLES, import_examples, make_experiment

pytestmark = pytest.mark.django_db


def demo():
    import_examples()
    return import_experiment(EXAMPLES / "experiments" / "demo.yaml", root=EXAMPLES).experiment


def worker(name: str, host: str, clis: dict | None = None, keys=(), version: str | None = None, seen=0):
    return Worker.objects.create(
        name=name, hostname=host, code_version=version or code_version(), agent_versions=clis or {},
        providers=list(keys), last_seen_at=timezone.now() - timedelta(seconds=seen),
    )  # fmt: skip


def rows_of(report, variant: str) -> dict[str, preflight.Row]:
    return {row.check: row for row in report.rows if row.variant == variant}


def test_the_demos_claude_arm_fails_without_a_key_with_the_fix():
    worker("w1@a", "host-a", {"claude-code": "2.0.1 (Claude Code)"})

    report = preflight.check(demo())

    claude = rows_of(report, "claude")
    assert claude["agent CLI"].level == preflight.OK
    assert claude["agent CLI"].detail == "2.0.1 (Claude Code) on 1 live worker"
    key = claude["API key"]
    assert key.level == preflight.FAIL
    assert key.need == "a key for anthropic (ANTHROPIC_API_KEY)"
    assert "no live worker has it (host-a)" in key.detail
    assert "set ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN) in the environment of the workers" in key.fix
    assert [row.variant for row in report.problems] == ["claude"]
    assert report.variants_with_problems() == ["claude"]
    # The oracle, no-op and scripted arms need nothing of a worker.
    assert {row.variant for row in report.rows} == {"claude"}


def test_it_passes_once_every_worker_has_the_cli_and_the_key():
    worker("w1@a", "host-a", {"claude-code": "2.0.1"}, keys=["anthropic"])
    worker("w2@b", "host-b", {"claude-code": "2.0.1", "codex": "0.9"}, keys=["anthropic", "openai"])

    report = preflight.check(demo())

    assert report.problems == []
    assert rows_of(report, "claude")["API key"].detail == "on 2 live workers"
    assert report.to_dict()["ok"] is True
    assert report.workers == ["w1@a", "w2@b"]


def test_a_worker_without_the_key_among_others_is_a_warning_naming_its_host():
    worker("w1@a", "host-a", {"claude-code": "2.0.1"}, keys=["anthropic"])
    worker("w2@b", "host-b", {"claude-code": "2.0.1"})

    key = rows_of(preflight.check(demo()), "claude")["API key"]

    assert key.level == preflight.WARN
    assert "only 1 of 2 live workers have it: trials sent to host-b would end in error" in key.detail


def test_workers_running_different_cli_versions_are_a_warning():
    worker("w1@a", "host-a", {"claude-code": "2.0.1"}, keys=["anthropic"])
    worker("w2@b", "host-b", {"claude-code": "2.0.5"}, keys=["anthropic"])

    cli = rows_of(preflight.check(demo()), "claude")["agent CLI"]

    assert cli.level == preflight.WARN
    assert "2.0.1 on host-a; 2.0.5 on host-b" in cli.detail
    assert "install one version of the claude CLI on every worker host" in cli.fix


def test_a_missing_cli_says_how_to_install_it():
    worker("w1@a", "host-a", keys=["anthropic"])

    cli = rows_of(preflight.check(demo()), "claude")["agent CLI"]

    assert cli.level == preflight.FAIL
    assert "make agents" in cli.fix and "EVALSITE_CLAUDE_BIN" in cli.fix


def test_silent_workers_and_other_code_versions_are_not_checked_against():
    worker("gone@a", "host-a", {"claude-code": "2.0.1"}, keys=["anthropic"], seen=3600)

    report = preflight.check(demo())

    assert report.problems == [] and report.workers == []
    assert rows_of(report, "claude")["API key"].level == preflight.UNCHECKED
    assert "no worker is running" in report.notes[0]

    worker("old@b", "host-b", {"claude-code": "2.0.1"}, version="0ld")
    report = preflight.check(demo())
    assert "no live worker runs this code" in report.notes[0] and "they run 0ld" in report.notes[0]
    # A launch that accepts any code version is checked against it.
    anyone = preflight.check(demo(), LaunchOptions(any_code_version=True))
    assert anyone.workers == ["old@b"] and rows_of(anyone, "claude")["API key"].level == preflight.FAIL


def test_a_launch_without_the_variant_has_no_problem():
    worker("w1@a", "host-a", {"claude-code": "2.0.1"})
    experiment = demo()

    report = preflight.check(experiment, LaunchOptions(variants=["reference", "no-op", "scripted"]))

    assert report.problems == [] and report.rows == []


def test_the_api_a_kind_calls_decides_the_key_it_needs():
    worker("w1@a", "host-a", {"claude-code": "2.0.1", "codex": "0.9"}, keys=["anthropic"])
    import_examples()
    experiment = import_experiment(EXAMPLES / "experiments" / "smoke.yaml", root=EXAMPLES).experiment

    report = preflight.check(
        experiment, LaunchOptions(overrides=["agent.type=codex", "agent.model=gpt-5"], variants=["reference"])
    )
    assert rows_of(report, "reference")["API key"].need == "a key for openai (OPENAI_API_KEY)"
    assert rows_of(report, "reference")["API key"].level == preflight.FAIL

    bedrock = preflight.check(
        experiment,
        LaunchOptions(overrides=["agent.type=claude-code", "agent.provider=bedrock"], variants=["reference"]),
    )
    assert rows_of(bedrock, "reference")["API key"].need == "a key for bedrock (AWS_BEARER_TOKEN_BEDROCK)"


def test_a_variants_own_binary_is_not_checked_against_the_reported_clis():
    worker("w1@a", "host-a", keys=["anthropic"])
    import_examples()
    experiment = import_experiment(EXAMPLES / "experiments" / "smoke.yaml", root=EXAMPLES).experiment

    report = preflight.check(
        experiment,
        LaunchOptions(
            overrides=["agent.type=claude-code", "agent.binary=/opt/claude/bin/claude"],
            variants=["reference"],
        ),
    )

    assert set(rows_of(report, "reference")) == {"API key"}


def test_a_command_that_would_miss_its_script_fails_pre_flight(tmp_path):
    import_examples()
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "agent.py").write_text("print('hi')\n")
    experiment = make_experiment(
        tmp_path,
        """
        experiment_id: trap
        variants:
          - variant_id: scripted
            agent: {type: command, command: "python3 agent.py", script: agent.py}
        """,
    )

    [row] = preflight.check(experiment).problems

    assert (row.variant, row.check, row.level) == ("scripted", "files", preflight.FAIL)
    assert "never says {script}" in row.detail


def test_a_refused_launch_says_why_and_checks_nothing():
    import_examples()
    experiment = import_experiment(EXAMPLES / "experiments" / "demo.yaml", root=EXAMPLES).experiment

    report = preflight.check(experiment, LaunchOptions(variants=["nope"]))

    assert report.rows == [] and "has no variant 'nope'" in report.refused[0]
    assert report.to_dict()["ok"] is False


def test_capabilities_a_worker_reports_are_offered():
    found = Worker(name="w", agent_versions={"codex": "1"}, providers=["openai"], last_seen_at=timezone.now())
    found.capabilities = {"containers": True, "engine": "docker 20.10", "gpu": False}

    assert preflight.offers(found) == {"cli": {"codex"}, "provider": {"openai"}, "capability": {"containers"}}
    containers = preflight.Need("capability", "containers")
    assert preflight.needs({"type": "none"}, {"driver": "docker"}) == [containers]
