from pathlib import Path

import pytest

from experiments_app.definitions import import_experiment, import_tasks
from experiments_app.models import Task
from runs_app.launching import LaunchError, LaunchOptions, launch_run, rerun_options
from runs_app.models import Run, Trial
from runs_app.tests.factories import (
    EXAMPLES,
    import_examples,
    import_folder_tasks,
    make_experiment,
    make_task,
)

pytestmark = pytest.mark.django_db

DATASET_TASK = """
task_id: convert
initial_prompt: "Convert ${row.value} to ${row.unit}"
tags: [data]
dataset:
  rows:
    - {id: a, value: "1", unit: km, kind: length}
    - {id: b, value: "2", unit: mi, kind: length}
    - {id: c, value: "3", unit: kg, kind: mass}
    - {id: d, value: "4", unit: lb, kind: mass}
    - {id: e, value: "5", unit: g, kind: mass}
  id_field: id
  stratify_field: kind
success_criteria:
  - type: run_command
    command: "test ${row.value} = ${row.value}"
"""

ONE_CRITERION = "success_criteria:\n  - {type: file_exists, path: x}\n"

EXPERIMENT = """
experiment_id: ab
defaults:
  repeats: 2
variants:
  - variant_id: base
    agent: {type: none}
  - variant_id: ref
    agent: {type: oracle}
    repeats: 3
"""


@pytest.fixture
def smoke():
    import_examples()
    return import_experiment(EXAMPLES / "experiments" / "smoke.yaml", root=EXAMPLES).experiment


def test_it_creates_every_trial_queued_and_dispatches_on_commit(smoke, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        run = launch_run(smoke)

    tasks = smoke.selected_tasks().count()
    assert run.n_trials == tasks * 2 == Trial.objects.filter(run=run).count()
    assert run.n_queued == run.n_trials
    assert set(Trial.objects.filter(run=run).values_list("status", flat=True)) == {"queued"}
    assert len(callbacks) == 1  # dispatch_run, only once the trials are committed


def test_it_freezes_task_versions_and_config(smoke, tmp_path):
    run = launch_run(smoke)
    trial = Trial.objects.filter(run=run).select_related("task_version").first()
    config_before = trial.config

    task = Task.objects.get(pk=trial.task_version.task_id)
    task.version += 1
    task.save()

    trial.refresh_from_db()
    assert trial.task_version.number == 1
    assert trial.config == config_before
    assert run.config["tasks"][task.slug]["version"] == 1
    assert trial.config["agent"]["type"] in ("oracle", "none")
    assert trial.lineage["agent.type"] == "variant"


def test_it_uses_variant_repeats_and_records_fingerprints(tmp_path):
    make_task(
        tmp_path,
        "t1",
        "task_id: t1\ninitial_prompt: hi\nsuccess_criteria:\n  - type: file_exists\n    path: x\n",
    )
    import_folder_tasks(tmp_path)
    experiment = make_experiment(tmp_path, EXPERIMENT)

    run = launch_run(experiment)

    counts = {v: Trial.objects.filter(run=run, variant__slug=v).count() for v in ("base", "ref")}
    assert counts == {"base": 2, "ref": 3}
    fingerprints = set(Trial.objects.filter(run=run).values_list("config_fingerprint", flat=True))
    assert len(fingerprints) == 2 and all(len(f) == 64 for f in fingerprints)
    assert len(run.fingerprint) == 64


def test_it_expands_datasets_and_substitutes_rows(tmp_path):
    make_task(tmp_path, "convert", DATASET_TASK)
    import_folder_tasks(tmp_path)
    experiment = make_experiment(
        tmp_path, EXPERIMENT.replace("repeats: 2", "repeats: 1").replace("repeats: 3", "repeats: 1")
    )

    run = launch_run(experiment)

    trials = Trial.objects.filter(run=run, variant__slug="base").order_by("dataset_row_id")
    assert [t.dataset_row_id for t in trials] == ["a", "b", "c", "d", "e"]
    first = trials[0]
    assert first.prompt == "Convert 1 to km"
    assert first.config["success_criteria"][0]["command"] == "test 1 = 1"
    assert first.dataset_row["unit"] == "km"


def test_it_substitutes_rows_where_coder_eval_does_and_as_it_does(tmp_path):
    task = DATASET_TASK.replace(
        "success_criteria:", "pre_run:\n  - command: 'echo ${row.unit}'\nsuccess_criteria:"
    )
    task = task.replace(
        '{id: a, value: "1", unit: km, kind: length}', "{id: a, value: 1.0, unit: true, kind: length}"
    )
    make_task(tmp_path, "convert", task)
    import_folder_tasks(tmp_path)
    experiment = make_experiment(
        tmp_path, EXPERIMENT.replace("repeats: 2", "repeats: 1").replace("repeats: 3", "repeats: 1")
    )

    run = launch_run(experiment)

    first = Trial.objects.filter(run=run, variant__slug="base").order_by("dataset_row_id")[0]
    assert first.prompt == "Convert 1.0 to True"  # str() of the value, as coder-eval
    assert first.config["pre_run"][0]["command"] == "echo ${row.unit}"  # pre_run is not substituted


def test_it_refuses_a_structured_row_value_in_a_placeholder(tmp_path):
    task = DATASET_TASK.replace(
        '{id: a, value: "1", unit: km, kind: length}', "{id: a, value: [1], unit: km, kind: length}"
    )
    make_task(tmp_path, "convert", task)
    import_folder_tasks(tmp_path)
    experiment = make_experiment(tmp_path, EXPERIMENT)

    with pytest.raises(LaunchError, match=r"\$\{row.value\} must be a scalar .* got a list"):
        launch_run(experiment)


def test_it_samples_rows_per_stratum_with_a_recorded_seed(tmp_path):
    make_task(tmp_path, "convert", DATASET_TASK)
    import_folder_tasks(tmp_path)
    experiment = make_experiment(tmp_path, EXPERIMENT)

    first = launch_run(experiment, options=LaunchOptions(sample_per_stratum=1, seed=7, repeats=1))
    again = launch_run(experiment, options=LaunchOptions(sample_per_stratum=1, seed=7, repeats=1))

    rows = sorted(
        Trial.objects.filter(run=first, variant__slug="base").values_list("dataset_row_id", flat=True)
    )
    assert len(rows) == 2  # one length row, one mass row
    assert rows == sorted(
        Trial.objects.filter(run=again, variant__slug="base").values_list("dataset_row_id", flat=True)
    )
    assert first.sample_seed == 7


def test_it_honours_skip_and_tag_filters(tmp_path):
    for slug, extra in (("keep", "tags: [a]"), ("other", "tags: [b]"), ("skipped", "tags: [a]\nskip: true")):
        make_task(tmp_path, slug, f"task_id: {slug}\ninitial_prompt: hi\n{extra}\n{ONE_CRITERION}")
    import_folder_tasks(tmp_path)
    experiment = make_experiment(tmp_path, EXPERIMENT)

    tagged = launch_run(experiment, options=LaunchOptions(tags=["a"], repeats=1))
    with_skipped = launch_run(experiment, options=LaunchOptions(tags=["a"], include_skipped=True, repeats=1))

    def slugs(run):
        return set(Trial.objects.filter(run=run).values_list("task_version__task__slug", flat=True))

    assert slugs(tagged) == {"keep"}
    assert slugs(with_skipped) == {"keep", "skipped"}


def test_it_refuses_bad_overrides_and_creates_nothing(smoke):
    with pytest.raises(LaunchError, match="run_limits.max_turnz"):
        launch_run(smoke, options=LaunchOptions(overrides=["run_limits.max_turnz=3"]))
    with pytest.raises(LaunchError, match="set twice|more than once|twice"):
        launch_run(
            smoke, options=LaunchOptions(overrides=["run_limits.max_turns=3", "run_limits.max_turns=4"])
        )

    assert not Run.objects.exists()


def test_it_applies_valid_overrides_to_every_trial(smoke):
    run = launch_run(smoke, options=LaunchOptions(overrides=["run_limits.max_turns=7"]))

    lineages = Trial.objects.filter(run=run).values_list("config", "lineage")
    assert all(config["run_limits"]["max_turns"] == 7 for config, _ in lineages)
    assert all(lineage["run_limits.max_turns"] == "override" for _, lineage in lineages)


def test_it_refuses_an_experiment_that_selects_no_task(smoke):
    with pytest.raises(LaunchError, match="selects no tasks"):
        launch_run(smoke, options=LaunchOptions(tags=["no-such-tag"]))


# The rows coder-eval 0.12.16 picks from corpus/coder_eval_round2/spec_5_sample_per_stratum.yaml
# (its `task_loader.expand_dataset`, called on the file with its own Python; `coder-eval run
# --sample 3` and `--sample-per-stratum 1` ran the same rows): strata in first-seen order, keyed by
# str() of the value (1 and "1", true and "True", a missing field and "" share one).
ROUND2 = Path(__file__).parents[2] / "experiments_app" / "tests" / "corpus" / "coder_eval_round2"
CODER_EVAL_PICKS = [
    # (sample_rows, sample_per_stratum, rows picked)
    (None, None, ["r08", "r02", "r14", "r01", "r03", "r04", "r06", "r18", "r07", "r16", "r12", "r13"]),
    (None, 1, ["r08", "r05", "r04", "r06", "r07", "r12"]),
    (
        None,
        3,
        [
            "r08",
            "r02",
            "r10",
            "r19",
            "r01",
            "r17",
            "r03",
            "r04",
            "r06",
            "r18",
            "r07",
            "r11",
            "r16",
            "r12",
            "r13",
        ],
    ),  # fmt: skip
    (5, None, ["r12", "r13", "r01", "r08", "r15"]),
    (3, None, ["r12", "r13", "r01"]),
    (5, 1, ["r12", "r13", "r01", "r08", "r15"]),  # --sample wins over sample_per_stratum
    (30, 1, [f"r{i:02d}" for i in range(20)]),  # not below the row count: every row
]


@pytest.mark.parametrize(("sample_rows", "per_stratum", "picked"), CODER_EVAL_PICKS)
def test_it_picks_the_dataset_rows_coder_eval_picks(tmp_path, sample_rows, per_stratum, picked):
    import_tasks([ROUND2 / "spec_5_sample_per_stratum.yaml"])
    experiment = make_experiment(tmp_path, EXPERIMENT)
    options = LaunchOptions(sample_rows=sample_rows, sample_per_stratum=per_stratum, seed=99, repeats=1)

    run = launch_run(experiment, options=options)

    rows = Trial.objects.filter(run=run, variant__slug="base").values_list("dataset_row_id", flat=True)
    assert sorted(rows) == sorted(picked)
    assert rerun_options(run).sample_rows == sample_rows


def test_it_samples_rows_of_dataset_tasks_and_runs_other_tasks_whole(tmp_path):
    make_task(tmp_path, "convert", DATASET_TASK)
    make_task(tmp_path, "plain", f"task_id: plain\ninitial_prompt: hi\n{ONE_CRITERION}")
    import_folder_tasks(tmp_path)
    experiment = make_experiment(tmp_path, EXPERIMENT)

    run = launch_run(experiment, options=LaunchOptions(sample_rows=2, repeats=1))

    trials = Trial.objects.filter(run=run, variant__slug="base")
    assert trials.filter(task_version__task__slug="convert").count() == 2
    assert trials.filter(task_version__task__slug="plain").count() == 1
