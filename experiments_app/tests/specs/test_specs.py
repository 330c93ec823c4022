import pytest
from pydantic import ValidationError

from experiments_app.specs import (
    LAYER_FIELDS,
    TASK_FIELDS,
    ExperimentSpec,
    SpecError,
    TaskOverlay,
    TaskSpec,
    VariantSpec,
)

CRITERION = {"type": "file_exists", "path": "out.txt"}


def task(**fields):
    return TaskSpec.model_validate(
        {"task_id": "t", "initial_prompt": "Do it.", "success_criteria": [CRITERION], **fields}
    )


def errors(exc: ValidationError) -> list[tuple[tuple, str]]:
    """(location, message) pairs, with SpecError issues expanded to their own fields."""
    found = []
    for err in exc.errors():
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, SpecError):
            found += [((*err["loc"], *loc), msg) for loc, msg in cause.issues]
        else:
            found.append((err["loc"], err["msg"]))
    return found


def test_it_applies_coder_evals_defaults():
    spec = task()

    assert spec.sandbox.driver == "tempdir"
    assert spec.sandbox.python is not None
    assert spec.success_criteria[0].weight == 1.0
    assert spec.success_criteria[0].pass_threshold == 0.9
    assert spec.pre_run == [] and spec.run_limits is None


def test_it_gives_llm_judges_a_lower_default_threshold():
    spec = task(success_criteria=[{"type": "llm_judge", "prompt": "Is the README clear?"}])

    assert spec.success_criteria[0].pass_threshold == 0.7


def test_it_lets_python_null_skip_the_sandbox_venv():
    assert task(sandbox={"python": None}).sandbox.python is None


def test_it_derives_gating_from_weight_unless_given():
    spec = task(
        success_criteria=[
            {**CRITERION, "weight": 0},
            {**CRITERION, "weight": 2},
            {**CRITERION, "weight": 0, "gating": True},
            {**CRITERION, "weight": 1, "gating": False},
        ]
    )

    assert [c.is_gating for c in spec.success_criteria] == [False, True, True, False]


def test_it_accepts_a_reference_folder_as_a_plain_string_or_a_mapping():
    assert task(reference="solution").reference.directory == "solution"
    assert task(reference={"directory": "solution"}).reference.directory == "solution"


def test_it_explains_that_inline_reference_code_was_removed():
    with pytest.raises(ValidationError, match="reference is a folder"):
        task(reference={"code": "print(1)"})


def test_it_needs_no_prompt_for_an_agentless_task():
    spec = TaskSpec.model_validate(
        {"task_id": "t", "agent": {"type": "none"}, "success_criteria": [CRITERION]}
    )

    assert spec.is_agentless and spec.initial_prompt is None


def test_it_rejects_a_prompt_on_an_agentless_task():
    with pytest.raises(ValidationError) as caught:
        task(agent={"type": "none"})

    assert errors(caught.value) == [
        (("initial_prompt",), "an agent of type none reads no prompt: remove it or pick another agent type")
    ]


def test_it_reads_coder_eval_simulation_keys_and_picks_the_answerer():
    persona = task(
        simulation={
            "enabled": True, "persona": "A busy developer", "goal": "done.txt written",
            "constraints": ["be brief"], "max_turns": 4, "stop_token": "<<<DONE>>>",
            "stop_on_criteria_pass": True, "check_criteria": "both", "max_total_tokens": 5000,
            "n_trials": 1, "model": "claude-haiku-4-5",
        }
    ).simulation  # fmt: skip
    assert (persona.answerer_name, persona.max_turns, persona.stop_token) == ("persona", 4, "<<<DONE>>>")
    scripted = task(simulation={"enabled": True, "answers": ["Use out.txt"]}).simulation
    assert scripted.answerer_name == "scripted" and scripted.answers == ["Use out.txt"]
    off = task(simulation={"enabled": False}).simulation
    assert off.enabled is False


@pytest.mark.parametrize(
    ("simulation", "agent", "where", "message"),
    [
        ({"enabled": True, "goal": "g"}, None, ("simulation", "persona"), "required by the persona answerer"),
        ({"enabled": True, "answerer": "scripted"}, None, ("simulation", "answers"), "at least one answer"),
        (
            {"enabled": True, "answers": ["a"], "answerer": "persona", "persona": "p", "goal": "g"},
            None, ("simulation", "answers"), "only the scripted answerer reads answers",
        ),
        ({"enabled": True, "answers": ["a"]}, {"type": "gemini-cli"}, ("agent", "type"), "cannot resume"),
        ({"enabled": True, "answers": ["a"]}, {"type": "oracle"}, ("agent", "type"), "cannot resume"),
        (
            {"enabled": True, "answers": ["a"], "stop_on_criteria_pass": True},
            None, ("simulation", "stop_on_criteria_pass"), "every_turn or both",
        ),
    ],
)  # fmt: skip
def test_it_refuses_a_simulation_that_cannot_run(simulation, agent, where, message):
    fields = {"simulation": simulation, **({"agent": agent} if agent else {})}
    with pytest.raises(ValidationError) as caught:
        task(**fields)

    assert [(loc, text) for loc, text in errors(caught.value) if message in text][0][0] == where


def test_it_refuses_repeated_conversations_and_unknown_answerers():
    with pytest.raises(ValidationError, match="set the experiment's .or the variant's. repeats instead"):
        task(simulation={"enabled": True, "answers": ["a"], "n_trials": 3})
    with pytest.raises(
        ValidationError, match="unknown answerer 'oracle'; expected one of: persona, scripted"
    ):
        task(simulation={"enabled": True, "answers": ["a"], "answerer": "oracle"})


def test_it_keeps_suite_hooks_to_the_experiment_and_budgets_to_other_roles():
    with pytest.raises(ValidationError, match="set it in the experiment's defaults, not in a task"):
        task(hooks={"suite": {"setup": [{"command": "true"}]}})
    with pytest.raises(ValidationError, match="the agent's budget is run_limits"):
        task(budgets={"agent": {"max_usd": 1}})
    spec = task(budgets={"answerer": {"max_usd": 0.5, "max_calls": 4}, "judge": {"max_total_tokens": 9000}})
    assert spec.budgets.answerer.max_calls == 4 and spec.budgets.judge.max_total_tokens == 9000


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("sandbox", {"limits": {"max_cpus": 2}}),
    ],
)
def test_it_refuses_each_coder_eval_feature_it_does_not_run(field, value):
    data = {"task_id": "t", "initial_prompt": "x", "success_criteria": [CRITERION], field: value}
    with pytest.raises(
        ValidationError, match="is not built in evalsite|is not built for the namespace sandbox"
    ):
        TaskSpec.model_validate(data)


ARMED = {"type": "command_executed", "command_pattern": "rm", "min_count": 0, "max_count": 0}


@pytest.mark.parametrize(
    ("changes", "where", "says"),
    [
        ({"run_limits": {"stop_early": True}}, ("run_limits", "stop_early"), "arming is per criterion"),
        (
            {"run_limits": {"stop_early_gate_threshold": 0.0}},
            ("run_limits", "stop_early_gate_threshold"),
            "must be > 0",
        ),
        ({"agent": {"type": "oracle"}}, ("agent", "type"), "watches the agent's tool calls"),
        (
            {"success_criteria": [{**ARMED, "weight": 0, "stop_early": {}}]},
            ("success_criteria", 0),
            "weight 0",
        ),
        (
            {"success_criteria": [{**CRITERION, "stop_early": {}}]},
            ("success_criteria", 0),
            "only command_executed and skill_triggered can",
        ),
        (
            {"success_criteria": [{**ARMED, "stop_early": {"on_pass": "halt"}}]},
            ("success_criteria", 0),
            "'stop' or 'continue'",
        ),
    ],
)
def test_it_refuses_early_stop_set_up_as_coder_eval_refuses_it(changes, where, says):
    data = {"task_id": "t", "initial_prompt": "x", "success_criteria": [{**ARMED, "stop_early": {}}]}
    with pytest.raises(ValidationError) as caught:
        TaskSpec.model_validate({**data, **changes})
    found = errors(caught.value)
    assert any(loc[: len(where)] == where and says in message for loc, message in found), found


def test_an_armed_task_takes_every_early_stop_knob_and_the_kill_switch():
    armed = {**ARMED, "stop_early": {"on_pass": "continue", "decide_within": 3}}
    task = TaskSpec.model_validate(
        {
            "task_id": "t",
            "initial_prompt": "x",
            "run_limits": {"stop_early_gate_threshold": 0.5, "max_tool_calls": 40, "expected_turns": 9},
            "success_criteria": [armed],
        }
    )
    assert task.success_criteria[0].stop_early.decide_within == 3
    # the kill switch disarms, so what arming would refuse (an oracle) is fine
    TaskSpec.model_validate(
        {
            "task_id": "t",
            "initial_prompt": "x",
            "agent": {"type": "oracle"},
            "run_limits": {"stop_early": False},
            "success_criteria": [armed],
        }
    )


def test_it_reports_several_cross_field_problems_at_once():
    with pytest.raises(ValidationError) as caught:
        TaskSpec.model_validate(
            {
                "task_id": "t",
                "agent": {"type": "none"},
                "success_criteria": [
                    {"type": "command_executed", "tool_name": "Bash"},
                    {**CRITERION, "suite_thresholds": {"accuracy": 0.9}},
                ],
            }
        )

    assert [loc for loc, _ in errors(caught.value)] == [
        ("success_criteria", 0, "type"),
        ("success_criteria", 1, "suite_thresholds"),
    ]


def test_it_requires_a_reference_when_a_criterion_reads_it():
    judge = {"type": "llm_judge", "prompt": "Compare.", "files": ["$REFERENCE_DIR/notes.md"]}

    with pytest.raises(ValidationError, match="no reference"):
        task(success_criteria=[judge])
    assert task(success_criteria=[judge], reference="ref").reference.directory == "ref"


def test_it_checks_run_command_stdout_options():
    with pytest.raises(ValidationError, match="mutually exclusive"):
        task(
            success_criteria=[
                {"type": "run_command", "command": "x", "expected_stdout": "1", "score_from_stdout": True}
            ]
        )
    with pytest.raises(ValidationError, match="invalid regular expression"):
        task(
            success_criteria=[
                {"type": "run_command", "command": "x", "expected_stdout": "(", "stdout_match": "regex"}
            ]
        )


def test_it_leaves_patterns_with_row_placeholders_unchecked():
    spec = task(success_criteria=[{"type": "file_matches_regex", "path": "a", "pattern": "${row.pattern}("}])

    assert spec.success_criteria[0].pattern == "${row.pattern}("


def test_it_keeps_unknown_keys_everywhere():
    spec = task(
        max_iterations=3, success_criteria=[{**CRITERION, "note": "x"}], run_limits={"max_turns": 3, "foo": 1}
    )

    assert spec.model_extra == {"max_iterations": 3}
    assert spec.success_criteria[0].model_extra == {"note": "x"}
    assert spec.run_limits.model_extra == {"foo": 1}


def test_it_accepts_an_empty_layer_and_partial_blocks_in_a_layer():
    assert TaskOverlay.model_validate({}).model_dump(exclude_unset=True) == {}
    layer = TaskOverlay.model_validate({"agent": {"model": "m"}, "run_limits": {"max_usd": 5}, "repeats": 2})

    assert layer.agent.type is None and layer.run_limits.max_usd == 5
    assert layer.model_dump(exclude_unset=True) == {
        "agent": {"model": "m"},
        "run_limits": {"max_usd": 5.0},
        "repeats": 2,
    }


def test_it_lists_the_task_and_layer_field_names_in_one_place():
    assert set(LAYER_FIELDS) - set(TASK_FIELDS) == {
        "template_sources",
        "driver",
        "prompt_mutations",
        "repeats",
    }
    # Identity and fan-out belong to the task alone: no layer may change them; nor what the
    # agent must leave alone (a variant cannot lift its task's protection).
    assert set(TASK_FIELDS) - set(LAYER_FIELDS) == {
        "task_id",
        "description",
        "tags",
        "skip",
        "dataset",
        "integrity",
    }


def test_it_allows_only_one_prompt_change_per_variant():
    with pytest.raises(ValidationError, match="set only one of prompt_mutations, initial_prompt_file"):
        VariantSpec.model_validate(
            {
                "variant_id": "v",
                "prompt_mutations": [{"type": "suffix", "content": "x"}],
                "initial_prompt_file": "p.md",
            }
        )


def test_it_defaults_the_baseline_to_the_first_variant():
    spec = ExperimentSpec.model_validate(
        {"experiment_id": "e", "variants": [{"variant_id": "a"}, {"variant_id": "b"}]}
    )

    assert (spec.baseline, spec.max_parallel, spec.task_sets) == ("a", 4, [])


def test_it_reads_evalsites_task_selection_fields():
    spec = ExperimentSpec.model_validate(
        {
            "experiment_id": "e",
            "task_sets": ["smoke"],
            "tags": ["python"],
            "exclude_tags": ["slow"],
            "max_parallel": 2,
            "baseline": "b",
            "variants": [{"variant_id": "a"}, {"variant_id": "b"}],
        }
    )

    assert (spec.task_sets, spec.tags, spec.exclude_tags, spec.max_parallel, spec.baseline) == (
        ["smoke"],
        ["python"],
        ["slow"],
        2,
        "b",
    )


def test_it_parses_every_prompt_mutation_type():
    mutations = [
        {"type": "prefix", "content": "a"},
        {"type": "suffix", "content": "b", "separator": " "},
        {"type": "replace", "pattern": "x+", "replacement": "y", "regex": True},
        {"type": "template", "variables": {"lang": "python"}},
    ]

    variant = VariantSpec.model_validate({"variant_id": "v", "prompt_mutations": mutations})

    assert [m.type for m in variant.prompt_mutations] == ["prefix", "suffix", "replace", "template"]


def test_it_accepts_null_defaults_like_coder_eval():
    spec = ExperimentSpec.model_validate(
        {"experiment_id": "e", "defaults": None, "variants": [{"variant_id": "a"}]}
    )

    assert spec.defaults.model_dump(exclude_unset=True) == {}


@pytest.mark.parametrize(
    ("task_id", "ok"),
    [("my.task", True), ("a.b.c-d_e", True), ("a..b", False), (".a", False), ("a.", False), ("a/b", False)],
)
def test_task_ids_may_hold_dots_like_coder_eval(task_id, ok):
    data = {"task_id": task_id, "initial_prompt": "x", "success_criteria": [CRITERION]}
    if ok:
        assert TaskSpec.model_validate(data).task_id == task_id
    else:
        with pytest.raises(ValidationError, match="must be a slug"):
            TaskSpec.model_validate(data)


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        ({"type": "claude-code", "permision_mode": "plan"}, "did you mean 'permission_mode'"),
        ({"type": "claude-code", "base_ur": "http://127.0.0.1:1"}, "did you mean 'base_url'"),
        ({"type": "codex", "max_retires": 2}, "did you mean 'max_retries'"),
        ({"max_retires": 2}, "no agent kind has an option 'max_retires'"),  # a layer without type
        (
            {"type": "codex", "allowed_tools": ["Bash"]},
            "'allowed_tools' applies to claude-code, not to codex",
        ),
        ({"type": "none", "command": "echo"}, "'command' applies to command, not to none"),
        (
            {"type": "claude-code", "plugins": [{"type": "local", "path": "$HOME/skills"}]},
            r"travels in the task's bundle \(environment variables and host paths do not reach a worker\)",
        ),
        (
            {"type": "claude-code", "sdk_options": {"user": "root"}},
            "cannot reach the Claude Code CLI: it names the OS user",
        ),
        ({"type": "claude-code", "context_window": 5000}, "must be an integer from 100000 to 1000000"),
        ({"type": "codex", "setting_sources": []}, "'setting_sources' applies to claude-code, not to codex"),
        # Kinds that send no prompt have no preamble to leave out; the switch is a boolean.
        ({"type": "oracle", "working_directory_preamble": False}, "'working_directory_preamble' applies to"),
        ({"type": "none", "working_directory_preamble": False}, "not to none"),
        ({"type": "codex", "working_directory_preamble": "no"}, "Input should be a valid boolean"),
        ({"type": "command", "command": "x", "working_directory_preamble": 0}, "valid boolean"),
    ],
)
def test_it_refuses_agent_options_the_kind_does_not_read(agent, message):
    data = {"task_id": "t", "initial_prompt": "x", "success_criteria": [CRITERION], "agent": agent}
    with pytest.raises(ValidationError, match=message):
        TaskSpec.model_validate(data)


@pytest.mark.parametrize("kind", ["claude-code", "codex", "gemini-cli", "opencode", "aider", "command"])
def test_every_kind_that_sends_a_prompt_may_send_it_bare(kind):
    agent = {
        "type": kind,
        "working_directory_preamble": False,
        **({"command": "x"} if kind == "command" else {}),
    }
    data = {"task_id": "t", "initial_prompt": "x", "success_criteria": [CRITERION], "agent": agent}
    assert TaskSpec.model_validate(data).agent.working_directory_preamble is False


def test_an_experiments_default_options_may_reach_a_variant_of_another_kind():
    resolved = {
        "task_id": "t",
        "initial_prompt": "x",
        "success_criteria": [CRITERION],
        "agent": {"type": "none", "permission_mode": "acceptEdits", "allowed_tools": ["Bash"]},
    }
    assert TaskSpec.model_validate(resolved, context={"resolved": True}).agent.type == "none"
