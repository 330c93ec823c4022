import os
import shutil
import time
from pathlib import Path

import pytest

from experiments_app.specs.loading import SpecIssue, load_experiment, load_tasks

CORPUS = Path(__file__).parents[1] / "corpus"
GOOD = CORPUS / "good"
BROKEN = CORPUS / "broken"

TASK = """\
task_id: {task_id}
description: "a small task"
initial_prompt: "Fix calc.py."
sandbox:
  template_sources:
    - type: template_dir
      path: {template}
success_criteria:
  - type: run_command
    command: "python3 -c 'import calc'"
"""


def write_task(folder: Path, task_id: str, template: str = "template", make_template: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.yaml").write_text(TASK.format(task_id=task_id, template=template))
    template_dir = folder / template
    if make_template:
        template_dir.mkdir(parents=True)
        (template_dir / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    return folder / "task.yaml"


def only_error(result) -> SpecIssue:
    assert len(result.errors) == 1, [str(e) for e in result.errors]
    return result.errors[0]


# (case under broken/, file the error names, line, field, message fragment)
BROKEN_TASKS = [
    ("bad_yaml_syntax.yaml", "bad_yaml_syntax.yaml", 4, "", "began on line 3"),
    ("bad_indentation.yaml", "bad_indentation.yaml", 4, "", "invalid YAML"),
    ("duplicate_key.yaml", "duplicate_key.yaml", 7, "", "duplicate key 'initial_prompt'"),
    ("empty_file.yaml", "empty_file.yaml", 1, "", "the file is empty"),
    ("top_level_list.yaml", "top_level_list.yaml", 1, "", "expected a mapping of task fields"),
    ("missing_task_id.yaml", "missing_task_id.yaml", 1, "task_id", "required field is missing"),
    ("bad_task_id.yaml", "bad_task_id.yaml", 1, "task_id", "must be a slug"),
    ("wrong_type_tags.yaml", "wrong_type_tags.yaml", 4, "tags", "expected a valid list, got 7"),
    ("bad_tag.yaml", "bad_tag.yaml", 4, "tags", "'Smoke Test' must be lowercase kebab-case"),
    ("wrong_type_timeout.yaml", "wrong_type_timeout.yaml", 9, "success_criteria[1].timeout", "got 'ten'"),
    (
        "unknown_criterion_type.yaml",
        "unknown_criterion_type.yaml",
        7,
        "success_criteria[1]",
        "unknown criterion type 'file_exist'",
    ),
    (
        "missing_criterion_type.yaml",
        "missing_criterion_type.yaml",
        5,
        "success_criteria[0]",
        "missing 'type'",
    ),
    (
        "missing_criterion_param.yaml",
        "missing_criterion_param.yaml",
        5,
        "success_criteria[0].includes",
        "required field is missing",
    ),
    (
        "typo_criterion_param.yaml",
        "typo_criterion_param.yaml",
        5,
        "success_criteria[0].pattern",
        "'patten' a typo of 'pattern'",
    ),
    (
        "negative_weight.yaml",
        "negative_weight.yaml",
        7,
        "success_criteria[0].weight",
        "greater than or equal to 0, got -1",
    ),
    (
        "threshold_above_one.yaml",
        "threshold_above_one.yaml",
        7,
        "success_criteria[0].pass_threshold",
        "less than or equal to 1, got 1.5",
    ),
    ("bad_regex.yaml", "bad_regex.yaml", 7, "success_criteria[0].pattern", "invalid regular expression"),
    (
        "json_check_no_expected.yaml",
        "json_check_no_expected.yaml",
        10,
        "success_criteria[0].assertions[1].expected",
        "required when operator is 'equals'",
    ),
    (
        "json_check_bad_expression.yaml",
        "json_check_bad_expression.yaml",
        8,
        "success_criteria[0].assertions[0].expression",
        "invalid JMESPath expression",
    ),
    (
        "missing_prompt.yaml",
        "missing_prompt.yaml",
        1,
        "initial_prompt",
        "set initial_prompt or initial_prompt_file",
    ),
    ("both_prompts.yaml", "both_prompts.yaml", 4, "initial_prompt_file", "not both"),
    (
        "agentless_needs_agent.yaml",
        "agentless_needs_agent.yaml",
        8,
        "success_criteria[1].type",
        "command_executed needs an agent",
    ),
    ("unknown_agent_type.yaml", "unknown_agent_type.yaml", 5, "agent.type", "unknown agent type 'clippy'"),
    (
        "bad_driver.yaml",
        "bad_driver.yaml",
        5,
        "sandbox.driver",
        "expected 'tempdir' or 'docker', got 'podman'",
    ),
    (
        "short_task_timeout.yaml",
        "short_task_timeout.yaml",
        6,
        "run_limits.task_timeout",
        "greater than or equal to 30, got 5",
    ),
    ("long_pre_run.yaml", "long_pre_run.yaml", 6, "pre_run[0].timeout", "less than or equal to 300"),
    (
        "repo_not_first.yaml",
        "repo_not_first.yaml",
        9,
        "sandbox.template_sources[1].type",
        "repo template source must be the first",
    ),
    (
        "starter_file_escapes.yaml",
        "starter_file_escapes.yaml",
        8,
        "sandbox.template_sources[0].files[0].path",
        "must not contain '..'",
    ),
    (
        "unknown_template_source.yaml",
        "unknown_template_source.yaml",
        6,
        "sandbox.template_sources[0]",
        "unknown template source type 'zip'",
    ),
    (
        "absolute_path.yaml",
        "absolute_path.yaml",
        7,
        "sandbox.template_sources[0].path",
        "absolute path '/etc'",
    ),
    (
        "climbing_path.yaml",
        "climbing_path.yaml",
        7,
        "sandbox.template_sources[0].path",
        "leaves the folder being imported",
    ),
    (
        "missing_template_dir.yaml",
        "missing_template_dir.yaml",
        7,
        "sandbox.template_sources[0].path",
        "folder 'no_such_template' not found",
    ),
    (
        "template_is_a_file.yaml",
        "template_is_a_file.yaml",
        7,
        "sandbox.template_sources[0].path",
        "expected a folder",
    ),
    (
        "missing_prompt_file.yaml",
        "missing_prompt_file.yaml",
        3,
        "initial_prompt_file",
        "'prompts/nope.md' not found",
    ),
    (
        "missing_reference.yaml",
        "missing_reference.yaml",
        4,
        "reference.directory",
        "folder 'solution' not found",
    ),
    (
        "suite_thresholds_without_dataset.yaml",
        "suite_thresholds_without_dataset.yaml",
        9,
        "success_criteria[0].suite_thresholds",
        "requires a dataset",
    ),
    ("dataset_row_missing_id.yaml", "dataset_row_missing_id.yaml", 7, "dataset.rows[1]", "row has no 'id'"),
    ("dataset_rows_and_paths.yaml", "dataset_rows_and_paths.yaml", 7, "dataset.paths", "not both"),
    (
        "dataset_unknown_row_field.yaml",
        "dataset_unknown_row_field.yaml",
        6,
        "dataset.rows[0]",
        "no field 'body', used as ${row.body}",
    ),
    ("dataset_bad_jsonl", "dataset_bad_jsonl/rows.jsonl", 2, "dataset.paths[0]", "invalid JSON"),
    (
        "dataset_duplicate_ids",
        "dataset_duplicate_ids/rows.jsonl",
        4,
        "dataset.paths[0]",
        "duplicate row id 'a' (first at",
    ),
    ("duplicate_ids", "duplicate_ids/second.yaml", 3, "task_id", "also defined in"),
    ("unbuilt_criterion.yaml", "unbuilt_criterion.yaml", 6, "success_criteria[1]", "'system_one_judge' crit"),
    # Hostile input: refused at import, fast, at its line.
    ("alias_bomb.yaml", "alias_bomb.yaml", 6, "", "refused as an alias bomb"),
    ("deep_nesting.yaml", "deep_nesting.yaml", 3, "", "nested more than 40 levels deep"),
    (
        "huge_task_timeout.yaml",
        "huge_task_timeout.yaml",
        4,
        "run_limits.task_timeout",
        "less than or equal to 604800",
    ),
    ("huge_max_usd.yaml", "huge_max_usd.yaml", 4, "run_limits.max_usd", "finite number"),
    (
        "criterion_outside_workspace.yaml",
        "criterion_outside_workspace.yaml",
        5,
        "success_criteria[0].path",
        "relative to the workspace",
    ),
    (
        "criterion_climbs_out.yaml",
        "criterion_climbs_out.yaml",
        5,
        "success_criteria[0].path",
        "inside the workspace",
    ),
    (
        "backtracking_regex.yaml",
        "backtracking_regex.yaml",
        6,
        "success_criteria[0].pattern",
        "exponential time",
    ),
]

BROKEN_EXPERIMENTS = [
    ("baseline_missing.yaml", 3, "baseline", "no variant 'gpt'; expected one of: sonnet, opus"),
    ("duplicate_variants.yaml", 7, "variants[2].variant_id", "duplicate variant_id 'sonnet'"),
    (
        "unknown_mutation.yaml",
        8,
        "variants[1].prompt_mutations[1]",
        "unknown prompt mutation type 'rephrase'",
    ),
    ("bad_experiment_id.yaml", 1, "experiment_id", "must be kebab-case"),
    ("no_variants.yaml", 3, "variants", "at least 1 item"),
    ("zero_parallel.yaml", 2, "max_parallel", "greater than or equal to 1, got 0"),
    ("zero_repeats.yaml", 4, "defaults.repeats", "greater than or equal to 1, got 0"),
    ("two_prompt_changes.yaml", 6, "variants[0].initial_prompt", "set only one of"),
    ("missing_overlay.yaml", 7, "variants[1].template_sources[0].path", "'../overlays/fixed' not found"),
    ("gate_typo.yaml", 5, "gates[0].varaint", "unknown key 'varaint'; did you mean 'variant'?"),
]


def test_it_has_a_corpus_of_at_least_25_broken_files():
    assert len(BROKEN_TASKS) + len(BROKEN_EXPERIMENTS) >= 25


def test_every_broken_file_is_refused_within_a_second():
    for case, *_ in BROKEN_TASKS:
        started = time.perf_counter()
        assert not load_tasks([BROKEN / case], root=BROKEN).ok
        assert time.perf_counter() - started < 1.0, case


@pytest.mark.parametrize(("case", "file", "line", "field", "fragment"), BROKEN_TASKS)
def test_it_reports_each_broken_task_with_file_line_and_field(case, file, line, field, fragment):
    result = load_tasks([BROKEN / case], root=BROKEN)

    assert not result.ok
    error = only_error(result)
    assert (Path(error.file), error.line, error.field) == (BROKEN / file, line, field), str(error)
    assert fragment in error.message
    assert error.severity == "error"


@pytest.mark.parametrize(("case", "line", "field", "fragment"), BROKEN_EXPERIMENTS)
def test_it_reports_each_broken_experiment_with_file_line_and_field(case, line, field, fragment):
    result = load_experiment(BROKEN / "experiments" / case, root=BROKEN)

    assert not result.ok and result.experiment is None
    error = only_error(result)
    assert (Path(error.file), error.line, error.field) == (BROKEN / "experiments" / case, line, field), str(
        error
    )
    assert fragment in error.message


def test_it_collects_the_errors_of_every_broken_file_in_a_folder():
    result = load_tasks([BROKEN])

    named = {Path(e.file).relative_to(BROKEN).as_posix() for e in result.errors}
    assert named == {file for _, file, *_ in BROKEN_TASKS}
    # Experiment files met while walking a task folder are skipped, not reported.
    assert len(result.skipped) == len(BROKEN_EXPERIMENTS)


def test_it_formats_an_issue_as_file_line_field_message():
    issue = SpecIssue("tasks/a.yaml", 12, "success_criteria[1].pattern", "invalid regular expression")

    assert str(issue) == "tasks/a.yaml:12: success_criteria[1].pattern: invalid regular expression"
    assert str(SpecIssue("a.yaml", None, "", "cannot read")) == "a.yaml: cannot read"


def test_it_loads_every_real_coder_eval_task():
    result = load_tasks([GOOD / "tasks"])

    assert result.ok, [str(e) for e in result.errors]
    assert result.warnings == []
    by_id = {task.task_id: task for task in result.tasks}
    assert sorted(by_id) == ["fix-calc", "fix-calc-agentless", "noop-canary"]
    fix = by_id["fix-calc"]
    assert fix.prompt.startswith("calc.py has a bug in add()")
    assert fix.yaml_path_in_bundle == "fix_calc.yaml"
    assert sorted(fix.files) == ["fix_calc.yaml", "template/calc.py"]
    assert fix.files["fix_calc.yaml"] == (GOOD / "tasks/fix_me/fix_calc.yaml").read_bytes()
    assert fix.source_yaml == (GOOD / "tasks/fix_me/fix_calc.yaml").read_text()
    assert by_id["fix-calc-agentless"].prompt == ""
    assert sorted(by_id["noop-canary"].files) == ["noop_canary.yaml"]


@pytest.mark.parametrize("name", ["model-ab.yaml", "overlay-ab.yaml"])
def test_it_loads_every_real_coder_eval_experiment(name):
    result = load_experiment(GOOD / "experiments" / name, root=GOOD)

    assert result.ok, [str(e) for e in result.errors]
    assert result.experiment.experiment_id == name.removesuffix(".yaml")


def test_it_bundles_an_experiments_overlay_folder():
    experiment = load_experiment(GOOD / "experiments/overlay-ab.yaml", root=GOOD).experiment

    assert sorted(experiment.files) == ["experiments/overlay-ab.yaml", "overlays/fixed/calc.py"]
    assert experiment.yaml_path_in_bundle == "experiments/overlay-ab.yaml"
    assert experiment.spec.baseline == "baseline"


def test_it_refuses_an_overlay_outside_the_experiments_own_folder_by_default():
    result = load_experiment(GOOD / "experiments/overlay-ab.yaml")

    assert "leaves the folder being imported" in only_error(result).message


def test_it_reads_a_variants_prompt_file(tmp_path):
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts/terse.md").write_text("Fix it. Be brief.\n")
    (tmp_path / "exp.yaml").write_text(
        "experiment_id: prompts\nvariants:\n  - variant_id: base\n"
        "  - variant_id: terse\n    initial_prompt_file: prompts/terse.md\n"
    )

    experiment = load_experiment(tmp_path / "exp.yaml").experiment

    assert experiment.variant_prompts == {"terse": "Fix it. Be brief."}
    assert "prompts/terse.md" in experiment.files


def test_it_says_when_an_experiment_path_holds_a_task():
    result = load_experiment(GOOD / "tasks/noop_canary.yaml")

    error = only_error(result)
    assert (error.line, error.field) == (3, "task_id")
    assert "this is a task file" in error.message


def test_it_refuses_unknown_keys_or_with_lenient_keeps_them_and_warns(tmp_path):
    path = write_task(tmp_path, "warned")
    path.write_text(path.read_text() + "    patern_hint: x\n" + "max_iterations: 3\n")

    strict = load_tasks([tmp_path])
    assert not strict.ok and [(e.line, e.field) for e in strict.errors] == [
        (12, "max_iterations"),
        (11, "success_criteria[0].patern_hint"),
    ]
    assert "--lenient" not in strict.errors[0].message  # the web has no such flag: evalrun names it

    result = load_tasks([tmp_path], lenient=True)

    assert result.ok
    task = result.tasks[0]
    assert task.spec.model_extra == {"max_iterations": 3}
    assert task.spec.success_criteria[0].model_extra == {"patern_hint": "x"}
    assert [(w.line, w.field, w.severity) for w in result.warnings] == [
        (12, "max_iterations", "warning"),
        (11, "success_criteria[0].patern_hint", "warning"),
    ]
    assert task.warnings == result.warnings


def test_it_suggests_the_field_an_unknown_key_resembles(tmp_path):
    path = write_task(tmp_path, "typo")
    path.write_text(path.read_text().replace("initial_prompt:", "initial_prompt_file: p.md\ninitial_promt:"))
    (tmp_path / "p.md").write_text("hello")

    result = load_tasks([tmp_path])

    assert "did you mean 'initial_prompt'?" in result.errors[0].message


def test_it_does_not_warn_about_agent_options():
    result = load_experiment(GOOD / "experiments/model-ab.yaml")

    assert result.warnings == []
    assert result.experiment.spec.variants[2].agent.model_extra == {"sdk_options": {"effort": "high"}}


def test_it_flags_one_bad_file_among_good_ones_so_nothing_is_imported(tmp_path):
    for n in range(4):
        write_task(tmp_path / f"t{n}", f"task-{n}")
    (tmp_path / "t2/task.yaml").write_text("task_id: [broken\n")

    result = load_tasks([tmp_path])

    assert not result.ok
    assert [Path(e.file) for e in result.errors] == [tmp_path / "t2/task.yaml"]
    assert sorted(t.task_id for t in result.tasks) == ["task-0", "task-1", "task-3"]


def test_it_treats_yaml_inside_template_and_reference_folders_as_content(tmp_path):
    write_task(tmp_path / "t", "with-config")
    (tmp_path / "t/template/config.yaml").write_text("not: [a task\n")
    (tmp_path / "t/task.yaml").write_text((tmp_path / "t/task.yaml").read_text() + "reference: solution\n")
    (tmp_path / "t/solution").mkdir()
    (tmp_path / "t/solution/settings.yml").write_text("debug: true\n")

    result = load_tasks([tmp_path])

    assert result.ok, [str(e) for e in result.errors]
    assert sorted(result.tasks[0].files) == [
        "solution/settings.yml",
        "task.yaml",
        "template/calc.py",
        "template/config.yaml",
    ]


def test_it_lets_a_path_climb_while_it_stays_inside_the_root(tmp_path):
    (tmp_path / "templates/calc").mkdir(parents=True)
    (tmp_path / "templates/calc/calc.py").write_text("x = 1\n")
    write_task(tmp_path / "tasks", "climber", template="../templates/calc", make_template=False)

    result = load_tasks([tmp_path])

    assert result.ok, [str(e) for e in result.errors]
    task = result.tasks[0]
    assert task.yaml_path_in_bundle == "tasks/task.yaml"
    assert sorted(task.files) == ["tasks/task.yaml", "templates/calc/calc.py"]


def test_it_refuses_the_same_climb_when_importing_only_the_tasks_folder(tmp_path):
    (tmp_path / "templates/calc").mkdir(parents=True)
    (tmp_path / "templates/calc/calc.py").write_text("x = 1\n")
    write_task(tmp_path / "tasks", "climber", template="../templates/calc", make_template=False)

    result = load_tasks([tmp_path / "tasks"])

    assert "leaves the folder being imported" in only_error(result).message


def test_it_refuses_a_template_folder_symlinked_outside_the_root(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("KEY = 1\n")
    root = tmp_path / "root"
    write_task(root, "linked", template="linked_template", make_template=False)
    os.symlink(outside, root / "linked_template")

    error = only_error(load_tasks([root]))

    assert (error.line, error.field) == (7, "sandbox.template_sources[0].path")
    assert "symlink whose target leaves the folder being imported" in error.message


def test_it_refuses_a_symlinked_file_inside_a_template_that_leaves_the_root(tmp_path):
    (tmp_path / "outside.txt").write_text("secret")
    root = tmp_path / "root"
    write_task(root, "linked")
    os.symlink(tmp_path / "outside.txt", root / "template/leak.txt")

    error = only_error(load_tasks([root]))

    assert error.field == "sandbox.template_sources[0].path"
    assert "template/leak.txt is a symlink leaving the imported folder" in error.message


def test_it_follows_symlinks_that_stay_inside_the_root_and_stores_their_content(tmp_path):
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared/util.py").write_text("HELP = 1\n")
    write_task(tmp_path / "t", "inside-link")
    os.symlink(tmp_path / "shared/util.py", tmp_path / "t/template/util.py")

    result = load_tasks([tmp_path])

    assert result.ok, [str(e) for e in result.errors]
    assert result.tasks[0].files["template/util.py"] == b"HELP = 1\n"


def test_it_reports_an_empty_template_folder(tmp_path):
    write_task(tmp_path, "empty")
    shutil.rmtree(tmp_path / "template")
    (tmp_path / "template/__pycache__").mkdir(parents=True)
    (tmp_path / "template/__pycache__/calc.cpython-311.pyc").write_bytes(b"\0")

    error = only_error(load_tasks([tmp_path]))

    assert "is empty" in error.message


def test_it_leaves_caches_out_of_bundles(tmp_path):
    write_task(tmp_path, "cached")
    (tmp_path / "template/__pycache__").mkdir()
    (tmp_path / "template/__pycache__/calc.cpython-311.pyc").write_bytes(b"\0")

    task = load_tasks([tmp_path]).tasks[0]

    assert sorted(task.files) == ["task.yaml", "template/calc.py"]


def test_it_loads_dataset_rows_from_jsonl_files_in_order(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data/a.jsonl").write_text('{"id": "1", "text": "x"}\n\n{"id": "2", "text": "y"}\n')
    (tmp_path / "data/b.jsonl").write_text('{"id": "3", "text": "z"}\n')
    (tmp_path / "task.yaml").write_text(
        "task_id: rows\ninitial_prompt: 'Say ${row.text}'\n"
        "dataset: {paths: [data/a.jsonl, data/b.jsonl], sample_per_stratum: 2}\n"
        "success_criteria:\n  - {type: file_contains, path: out.txt, includes: ['${row.text}']}\n"
    )

    task = load_tasks([tmp_path]).tasks[0]

    assert [row["id"] for row in task.dataset_rows] == ["1", "2", "3"]
    assert sorted(task.files) == ["data/a.jsonl", "data/b.jsonl", "task.yaml"]


def test_it_reads_the_prompt_from_initial_prompt_file(tmp_path):
    write_task(tmp_path, "from-file")
    text = (
        (tmp_path / "task.yaml")
        .read_text()
        .replace('initial_prompt: "Fix calc.py."', "initial_prompt_file: p.md")
    )
    (tmp_path / "task.yaml").write_text(text)
    (tmp_path / "p.md").write_text("\nFix calc.py, please.\n\n")

    task = load_tasks([tmp_path]).tasks[0]

    assert task.prompt == "Fix calc.py, please."
    assert "p.md" in task.files


def test_it_reports_a_bundle_over_the_size_cap(tmp_path):
    write_task(tmp_path, "big")
    (tmp_path / "template/data.bin").write_bytes(b"x" * 5000)

    error = only_error(load_tasks([tmp_path], max_bundle_bytes=4000))

    assert "over the" in error.message and "template/data.bin" in error.message


def test_it_gives_the_same_digest_wherever_the_task_folder_lives(tmp_path):
    first = write_task(tmp_path / "a/deep/t", "moved").parent
    second = tmp_path / "b/t"
    shutil.copytree(first, second)
    os.utime(second / "template/calc.py", (1, 1))

    digests = [load_tasks([folder]).tasks[0].bundle.digest for folder in (first, second)]

    assert digests[0] == digests[1]


def test_it_changes_the_digest_when_a_template_file_changes(tmp_path):
    write_task(tmp_path, "edited")
    before = load_tasks([tmp_path]).tasks[0].bundle.digest
    (tmp_path / "template/calc.py").write_text("def add(a, b):\n    return a + b\n")

    assert load_tasks([tmp_path]).tasks[0].bundle.digest != before


def test_it_refuses_a_task_file_symlinked_from_outside_the_root(tmp_path):
    outside = write_task(tmp_path / "outside", "outsider")
    (tmp_path / "root").mkdir()
    os.symlink(outside, tmp_path / "root/task.yaml")

    error = only_error(load_tasks([tmp_path / "root"]))

    assert Path(error.file) == tmp_path / "root/task.yaml"
    assert "symlink whose target leaves" in error.message


@pytest.mark.parametrize("path", ["~/templates", "C:\\templates", "\\\\server\\share"])
def test_it_refuses_home_and_windows_absolute_paths(tmp_path, path):
    write_task(tmp_path, "abs", template=path.replace("\\", "\\\\"), make_template=False)

    assert "absolute path" in only_error(load_tasks([tmp_path])).message
