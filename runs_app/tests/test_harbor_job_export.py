"""`manage.py export_harbor_job`: a run as Harbor's job directory, with rewards only where a trial
was measured and each trial's ATIF trajectory."""

import io
import json
import zipfile
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from runs_app.models import Run, Trial

RUNS = Path(__file__).parent / "fixtures" / "coder-eval-runs"

pytestmark = pytest.mark.django_db


def exported(tmp_path: Path) -> tuple[Run, Path]:
    call_command(
        "import_coder_eval_run", str(RUNS / "report-schema"), stdout=io.StringIO(), stderr=io.StringIO()
    )
    run = Run.objects.get()
    target = tmp_path / "job"
    out = io.StringIO()
    call_command("export_harbor_job", str(run.pk), str(target), stdout=out)
    assert f"wrote {run.n_trials} trial(s)" in out.getvalue()
    return run, target


def test_it_writes_a_folder_per_trial_with_its_result_reward_and_trajectory(tmp_path):
    run, target = exported(tmp_path)
    folders = sorted(p for p in target.iterdir() if p.is_dir())
    assert len(folders) == run.n_trials == 10
    for folder in folders:
        result = json.loads((folder / "result.json").read_text())
        trial = Trial.objects.get(pk=int(result["trial_uri"].rsplit("/", 1)[1]))
        assert result["trial_name"] == folder.name and folder.name.startswith(result["task_name"] + "__")
        assert json.loads((folder / "config.json").read_text()) == result["config"]
        trajectory = json.loads((folder / "agent" / "trajectory.json").read_text())
        assert trajectory["schema_version"] == "ATIF-v1.7" and trajectory["steps"][0]["source"] == "user"
        reward = folder / "verifier" / "reward.txt"
        if trial.status == Trial.Status.ERROR:
            # unmeasured: no reward file (never a measured 0), the error in exception.txt
            assert not reward.exists() and result["verifier_result"] is None
            assert (folder / "exception.txt").read_text().strip() == result["exception_info"][
                "exception_message"
            ]
        else:
            assert float(reward.read_text()) == trial.score == result["verifier_result"]["rewards"]["reward"]
            assert not (folder / "exception.txt").exists()
        assert result["agent_result"]["n_output_tokens"] == trial.output_tokens


def test_the_job_result_counts_trials_errors_and_the_mean_reward_per_variant(tmp_path):
    run, target = exported(tmp_path)
    job = json.loads((target / "result.json").read_text())
    assert job["n_total_trials"] == job["stats"]["n_trials"] == 10
    assert job["stats"]["n_errors"] == run.trials.filter(status=Trial.Status.ERROR).count() == 3
    assert sum(e["n_trials"] for e in job["stats"]["evals"].values()) == 10
    for key, entry in job["stats"]["evals"].items():
        variant = key.split("__")[0]
        trials = run.trials.filter(variant__slug=variant)
        scores = [t.score if t.status != Trial.Status.ERROR else 0.0 for t in trials]
        assert entry["metrics"] == [{"mean": pytest.approx(sum(scores) / len(scores))}]
        named = [n for names in entry["reward_stats"]["reward"].values() for n in names]
        named += [n for names in entry["exception_stats"].values() for n in names]
        assert sorted(named) == sorted(p.name for p in target.glob(f"*__{variant}-*"))
    assert json.loads((target / "config.json").read_text())["job_name"] == f"evalsite-run-{run.pk}"


def test_it_refuses_a_folder_that_is_not_empty(tmp_path):
    call_command("import_coder_eval_run", str(RUNS / "ab"), stdout=io.StringIO(), stderr=io.StringIO())
    (tmp_path / "x").write_text("x")
    with pytest.raises(CommandError, match="not empty"):
        call_command("export_harbor_job", str(Run.objects.get().pk), str(tmp_path))


def test_the_run_page_offers_both_exports_as_zips(tmp_path, member_client):
    call_command("import_coder_eval_run", str(RUNS / "ab"), stdout=io.StringIO(), stderr=io.StringIO())
    run = Run.objects.get()
    page = member_client.get(run.get_absolute_url()).content.decode()
    assert 'data-testid="export-harbor"' in page and 'data-testid="export-coder-eval"' in page

    response = member_client.get(reverse("run_export", args=[run.pk, "harbor-job"]))
    assert response.status_code == 200 and response["Content-Type"] == "application/zip"
    names = zipfile.ZipFile(io.BytesIO(b"".join(response.streaming_content))).namelist()
    prefix = f"run-{run.pk}-harbor-job/"
    assert prefix + "result.json" in names
    assert sum(n.endswith("/agent/trajectory.json") for n in names) == run.n_trials == 12

    response = member_client.get(reverse("run_export", args=[run.pk, "coder-eval-run"]))
    names = zipfile.ZipFile(io.BytesIO(b"".join(response.streaming_content))).namelist()
    assert f"run-{run.pk}-coder-eval-run/run.json" in names
    assert member_client.get(reverse("run_export", args=[run.pk, "other"])).status_code == 404
