"""Layered resolution: merge rules, lineage, overrides, prompt mutations, fingerprint."""

import copy

import pytest
import yaml

from experiments_app.specs.resolve import (
    APPEND_FIELDS,
    BUILTIN_DEFAULTS,
    OverrideError,
    ResolveError,
    apply_prompt_mutations,
    config_fingerprint,
    merge_layers,
    parse_overrides,
    resolve,
    trial_layers,
)

# Copied as-is from coder-eval-samples (experiments/ and tasks/).
MODEL_AB = """
experiment_id: model-ab
description: "Sonnet vs Opus, plus a prompt-suffix arm"
defaults:
  repeats: 3
  agent:
    type: claude-code
    permission_mode: acceptEdits   # bypassPermissions is refused by Claude Code when run as root
    allowed_tools: ["Bash", "Read", "Write", "Edit", "Glob", "Grep"]
  run_limits:
    max_turns: 60
    turn_timeout: 900
    task_timeout: 900
  prompt_mutations:
    - type: prefix
      content: "You are working in a throwaway sandbox."
variants:
  - variant_id: sonnet
    agent: {model: claude-sonnet-4-6}
  - variant_id: opus
    agent: {model: claude-opus-4-6}
    run_limits: {max_usd: 5.0}     # per-key merge: other run_limits keys survive
  - variant_id: sonnet-careful
    description: "same model, extra instruction"
    agent: {model: claude-sonnet-4-6, sdk_options: {effort: high}}
    repeats: 5
    prompt_mutations:
      - type: suffix
        content: "Run the tests before you finish."
"""

OVERLAY_AB = """
experiment_id: overlay-ab
description: "Baseline vs. pre-fixed overlay (agentless harness self-test)"
defaults:
  repeats: 3
  agent:
    type: none
  run_limits:
    task_timeout: 60
    turn_timeout: 60
variants:
  - variant_id: baseline
    description: "task template only"
  - variant_id: fixed-overlay
    description: "overlay with the corrected file appended after the task template"
    template_sources:
      - type: template_dir
        path: ../overlays/fixed
"""

FIX_CALC = """
task_id: fix-calc
description: "Fix the add() bug so the unit check passes"
initial_prompt: "calc.py has a bug in add(). Fix it; do not change the signature."
tags: [smoke, "lang:python"]
sandbox:
  driver: tempdir
  python: null                 # skip the default per-sandbox venv
  template_sources:
    - type: template_dir
      path: template           # relative to this YAML; holds calc.py with the bug
run_limits:
  max_turns: 20
  turn_timeout: 120
  task_timeout: 120
success_criteria:
  - type: run_command
    description: "add(2, 3) == 5"
    command: "python3 -c 'import calc; assert calc.add(2, 3) == 5'"
    timeout: 10
    weight: 3
  - type: file_matches_regex
    description: "signature unchanged"
    path: calc.py
    pattern: "def add\\\\(a, b\\\\):"
"""

FIX_CALC_AGENTLESS = """
task_id: fix-calc-agentless
description: "Fix the add() bug so the unit check passes"
tags: [smoke, "lang:python"]
agent:
  type: none
sandbox:
  driver: tempdir
  python: null
  template_sources:
    - type: template_dir
      path: template
run_limits:
  max_turns: 20
  turn_timeout: 120
  task_timeout: 120
success_criteria:
  - type: run_command
    description: "add(2, 3) == 5"
    command: "python3 -c 'import calc; assert calc.add(2, 3) == 5'"
    timeout: 10
    weight: 3
"""

NOOP_CANARY = """
# Agentless canary task: no model call; the sandbox is set up, pre_run runs,
# and the criteria are checked directly against the sandbox.
task_id: noop-canary
description: "Agentless system check: sandbox + pre_run + criteria, no model call"
tags: [smoke, "kind:canary"]
agent:
  type: none
sandbox:
  driver: tempdir
  template_sources:
    - type: starter_files
      files:
        - path: hello.py
          content: |
            print("Hello, World!")
pre_run:
  - command: "python3 hello.py > out.txt"
    timeout: 10
success_criteria:
  - type: file_exists
    path: hello.py
    description: "starter file materialised"
  - type: run_command
    command: "python3 hello.py"
    expected_stdout: "Hello, World!"
    stdout_match: exact
    timeout: 10
    description: "script prints greeting"
  - type: file_contains
    path: out.txt
    includes: ["Hello"]
    description: "pre_run output captured"
    weight: 0.5
"""

# Not a sample: a task that sets no run_limits, so the experiment's defaults show through.
PLAIN_TASK = """
task_id: plain
description: "A task with no limits of its own"
initial_prompt: "Do the thing."
success_criteria:
  - type: file_exists
    path: out.txt
"""


def _experiment(text: str) -> tuple[dict, dict[str, dict]]:
    data = yaml.safe_load(text)
    return data["defaults"], {v["variant_id"]: v for v in data["variants"]}


def _merged(*layers: tuple[str, dict]):
    return merge_layers(list(layers))


def _leaf_paths(value, path=""):
    """Every leaf path of a resolved config, append-list elements one by one."""
    if isinstance(value, dict) and value:
        for key, child in value.items():
            yield from _leaf_paths(child, f"{path}.{key}" if path else key)
    elif path in APPEND_FIELDS:
        for index in range(len(value)):
            yield f"{path}[{index}]"
    else:
        yield path


# --------------------------------------------------------------------------- merge rules


def test_it_replaces_scalars_with_the_last_layer_that_sets_them():
    r = _merged(
        ("builtin", {"agent": {"model": "a"}, "skip": False}),
        ("experiment", {"agent": {"model": "b"}}),
        ("task", {"agent": {"model": "c"}, "skip": True}),
        ("variant", {"agent": {"model": "d"}}),
    )
    assert r.config["agent"]["model"] == "d"
    assert r.lineage["agent.model"] == "variant"
    assert r.config["skip"] is True
    assert r.lineage["skip"] == "task"


def test_it_replaces_lists_wholesale():
    r = _merged(
        ("builtin", {"agent": {"allowed_tools": ["Bash", "Read", "Skill"]}, "tags": ["x"]}),
        ("experiment", {"agent": {"allowed_tools": ["Bash"]}}),
        ("override", {"tags": ["a", "b"]}),
    )
    assert r.config["agent"]["allowed_tools"] == ["Bash"]
    assert r.lineage["agent.allowed_tools"] == "experiment"
    assert r.config["tags"] == ["a", "b"]
    assert r.lineage["tags"] == "override"
    assert "tags[0]" not in r.lineage


def test_it_replaces_success_criteria_wholesale():
    r = _merged(
        ("task", {"success_criteria": [{"type": "file_exists", "path": "a"}]}),
        ("override", {"success_criteria": [{"type": "file_exists", "path": "b"}]}),
    )
    assert r.config["success_criteria"] == [{"type": "file_exists", "path": "b"}]


def test_it_deep_merges_nested_mappings():
    r = _merged(
        ("experiment", {"run_limits": {"max_turns": 60, "task_timeout": 900}}),
        ("task", {"agent": {"sdk_options": {"effort": "low", "thinking": {"budget": 1}}}}),
        ("variant", {"run_limits": {"max_usd": 5.0}, "agent": {"sdk_options": {"thinking": {"on": True}}}}),
    )
    assert r.config["run_limits"] == {"max_turns": 60, "task_timeout": 900, "max_usd": 5.0}
    assert r.config["agent"]["sdk_options"] == {"effort": "low", "thinking": {"budget": 1, "on": True}}
    assert r.lineage["run_limits.max_turns"] == "experiment"
    assert r.lineage["run_limits.max_usd"] == "variant"
    assert r.lineage["agent.sdk_options.thinking.budget"] == "task"
    assert r.lineage["agent.sdk_options.thinking.on"] == "variant"


def test_it_lets_null_replace_a_mapping_and_forgets_the_old_leaves():
    r = _merged(
        ("builtin", {"sandbox": {"python": {"env_packages": ["pytest"]}}}),
        ("task", {"sandbox": {"python": None}}),
    )
    assert r.config["sandbox"]["python"] is None
    assert r.lineage["sandbox.python"] == "task"
    assert "sandbox.python.env_packages" not in r.lineage


def test_it_forgets_the_old_value_when_a_mapping_replaces_a_scalar():
    r = _merged(
        ("experiment", {"agent": {"claude_settings": "settings.json"}}),
        ("variant", {"agent": {"claude_settings": {"permissions": {"deny": ["Read(x)"]}}}}),
    )
    assert r.config["agent"]["claude_settings"] == {"permissions": {"deny": ["Read(x)"]}}
    assert "agent.claude_settings" not in r.lineage
    assert r.lineage["agent.claude_settings.permissions.deny"] == "variant"


def test_it_appends_pre_run_in_layer_order():
    r = _merged(
        ("experiment", {"pre_run": [{"command": "setup"}]}),
        ("task", {"pre_run": [{"command": "task-1"}, {"command": "task-2"}]}),
        ("override", {"pre_run": [{"command": "extra"}]}),
    )
    assert [c["command"] for c in r.config["pre_run"]] == ["setup", "task-1", "task-2", "extra"]
    assert [r.lineage[f"pre_run[{i}]"] for i in range(4)] == ["experiment", "task", "task", "override"]


def test_it_appends_post_run_with_later_layers_first():
    r = _merged(
        ("experiment", {"post_run": [{"command": "cleanup"}]}),
        ("task", {"post_run": [{"command": "collect-1"}, {"command": "collect-2"}]}),
        ("variant", {"post_run": [{"command": "variant-extra"}]}),
    )
    commands = [c["command"] for c in r.config["post_run"]]
    assert commands == ["variant-extra", "collect-1", "collect-2", "cleanup"]
    assert [r.lineage[f"post_run[{i}]"] for i in range(4)] == ["variant", "task", "task", "experiment"]


def test_it_puts_the_task_template_sources_first_then_the_overlays():
    base = {"type": "template_dir", "path": "template"}
    exp_overlay = {"type": "template_dir", "path": "../exp"}
    variant_overlay = {"type": "template_dir", "path": "../fixed"}
    r = _merged(
        ("experiment", {"template_sources": [exp_overlay]}),
        ("task", {"sandbox": {"template_sources": [base]}}),
        ("variant", {"template_sources": [variant_overlay]}),
    )
    assert r.config["sandbox"]["template_sources"] == [base, exp_overlay, variant_overlay]
    assert r.lineage["sandbox.template_sources[0]"] == "task"
    assert r.lineage["sandbox.template_sources[1]"] == "experiment"
    assert r.lineage["sandbox.template_sources[2]"] == "variant"
    assert "template_sources" not in r.config


def test_it_moves_a_top_level_driver_under_sandbox_for_experiments_and_variants():
    r = _merged(
        ("experiment", {"driver": "docker"}),
        ("task", {"sandbox": {"driver": "tempdir", "python": None}}),
        ("variant", {"driver": "docker"}),
    )
    assert r.config["sandbox"] == {"driver": "docker", "python": None, "template_sources": []}
    assert r.lineage["sandbox.driver"] == "variant"
    assert "driver" not in r.config


def test_it_records_lineage_for_every_leaf_even_without_builtin_defaults():
    r = _merged(
        ("task", {"sandbox": {"template_sources": [{"type": "template_dir", "path": "t"}]}, "agent": {}}),
        ("variant", {"driver": None, "agent": {"sdk_options": {}}}),
    )
    assert set(_leaf_paths(r.config)) == set(r.lineage)
    assert r.lineage["agent.sdk_options"] == "variant"
    assert "driver" not in r.config


def test_it_always_returns_the_append_fields_as_lists():
    r = _merged(("task", {"task_id": "t"}))
    assert r.config["pre_run"] == []
    assert r.config["post_run"] == []
    assert r.config["prompt_mutations"] == []
    assert r.config["sandbox"]["template_sources"] == []


def test_it_rejects_an_append_field_that_is_not_a_list():
    with pytest.raises(ResolveError, match=r"pre_run: expected a list.*layer task"):
        _merged(("task", {"pre_run": "echo hi"}))


def test_it_keeps_earlier_agent_options_when_a_layer_changes_agent_type():
    # coder-eval merges the agent dict field by field: no reset on a type change.
    r = _merged(
        ("builtin", BUILTIN_DEFAULTS),
        ("experiment", {"agent": {"type": "claude-code", "sdk_options": {"effort": "high"}}}),
        ("task", {"agent": {"type": "none"}}),
    )
    assert r.config["agent"]["type"] == "none"
    assert r.config["agent"]["model"] == "claude-sonnet-4-6"
    assert r.config["agent"]["sdk_options"] == {"effort": "high"}
    assert r.lineage["agent.type"] == "task"
    assert r.lineage["agent.model"] == "builtin"
    assert r.lineage["agent.sdk_options.effort"] == "experiment"


def test_it_drops_the_prompt_file_when_a_later_layer_sets_the_prompt_text():
    r = _merged(
        ("task", {"initial_prompt_file": "prompt.md"}),
        ("variant", {"initial_prompt": "Something else."}),
    )
    assert "initial_prompt_file" not in r.config
    assert "initial_prompt_file" not in r.lineage
    assert r.lineage["initial_prompt"] == "variant"


def test_it_drops_the_system_prompt_when_a_later_layer_sets_a_system_prompt_file():
    r = _merged(
        ("experiment", {"agent": {"system_prompt": "Be brief."}}),
        ("variant", {"agent": {"system_prompt_file": "sys.md"}}),
    )
    assert r.config["agent"] == {"system_prompt_file": "sys.md"}
    assert "agent.system_prompt" not in r.lineage


def test_it_never_takes_repeats_from_the_task():
    r = _merged(("builtin", {"repeats": 1}), ("experiment", {"repeats": 3}), ("task", {"repeats": 9}))
    assert r.config["repeats"] == 3
    assert r.lineage["repeats"] == "experiment"


def test_it_ignores_variant_identity_fields():
    r = _merged(
        ("task", {"task_id": "t", "description": "the task"}),
        ("variant", {"variant_id": "opus", "description": "the variant"}),
    )
    assert r.config["description"] == "the task"
    assert "variant_id" not in r.config


def test_it_credits_a_field_set_by_several_layers_to_the_last_one():
    r = _merged(
        ("builtin", {"run_limits": {"max_turns": 20}}),
        ("experiment", {"run_limits": {"max_turns": 60}}),
        ("task", {"run_limits": {"max_turns": 20}}),
        ("variant", {"run_limits": {"max_turns": 30}}),
        ("override", {"run_limits": {"max_turns": 5}}),
    )
    assert r.config["run_limits"] == {"max_turns": 5}
    assert r.lineage == {"run_limits.max_turns": "override"}


def test_it_records_lineage_for_every_leaf_and_nothing_else():
    defaults, variants = _experiment(MODEL_AB)
    task = yaml.safe_load(FIX_CALC)
    task["pre_run"] = [{"command": "a"}, {"command": "b"}]
    task["post_run"] = [{"command": "c"}]
    task["agent"] = {"sdk_options": {}}
    r = resolve(trial_layers(task, defaults, variants["sonnet-careful"]))
    leaves = set(_leaf_paths(r.config))
    assert leaves == set(r.lineage)
    assert r.lineage["agent.sdk_options.effort"] == "variant"
    assert r.lineage["sandbox.python"] == "task"
    assert r.lineage["success_criteria"] == "task"
    assert r.lineage["prompt_mutations[0]"] == "experiment"
    assert r.lineage["prompt_mutations[1]"] == "variant"


def test_it_does_not_change_its_inputs_or_the_builtin_defaults():
    builtin_before = copy.deepcopy(BUILTIN_DEFAULTS)
    defaults, variants = _experiment(MODEL_AB)
    task = yaml.safe_load(FIX_CALC)
    inputs_before = copy.deepcopy((defaults, variants, task))
    r = resolve(trial_layers(task, defaults, variants["opus"]))
    r.config["agent"]["allowed_tools"].append("Oops")
    r.config["sandbox"]["template_sources"][0]["path"] = "elsewhere"
    assert builtin_before == BUILTIN_DEFAULTS
    assert (defaults, variants, task) == inputs_before


def test_it_rejects_unknown_and_misordered_layers():
    with pytest.raises(ResolveError, match="unknown layer 'cli'"):
        merge_layers([("cli", {})])
    with pytest.raises(ResolveError, match="in the order"):
        merge_layers([("task", {}), ("experiment", {})])
    with pytest.raises(ResolveError, match="in the order"):
        merge_layers([("task", {}), ("task", {})])


# --------------------------------------------------------------------------- samples


def test_it_resolves_model_ab_opus_keeping_experiment_limits_and_adding_max_usd():
    defaults, variants = _experiment(MODEL_AB)
    task = yaml.safe_load(PLAIN_TASK)
    r = resolve(trial_layers(task, defaults, variants["opus"]))
    assert r.config["run_limits"] == {
        "max_turns": 60,
        "task_timeout": 900,
        "turn_timeout": 900,
        "max_usd": 5.0,
    }
    assert r.lineage["run_limits.max_turns"] == "experiment"
    assert r.lineage["run_limits.max_usd"] == "variant"
    assert r.config["agent"] == {
        "type": "claude-code",
        "permission_mode": "acceptEdits",
        "model": "claude-opus-4-6",
        "allowed_tools": ["Bash", "Read", "Write", "Edit", "Glob", "Grep"],
    }
    assert r.config["repeats"] == 3
    assert r.config["initial_prompt"] == "You are working in a throwaway sandbox.\n\nDo the thing."


def test_it_matches_coder_eval_for_model_ab_opus_on_fix_calc():
    # Expected values are what coder-eval recorded in runs/mab/opus/fix-calc/00/task.json.
    defaults, variants = _experiment(MODEL_AB)
    r = resolve(trial_layers(yaml.safe_load(FIX_CALC), defaults, variants["opus"]))
    assert r.config["run_limits"] == {
        "max_turns": 20,
        "task_timeout": 120,
        "turn_timeout": 120,
        "max_usd": 5.0,
    }
    expected_lineage = {
        "agent.type": "experiment",
        "agent.permission_mode": "experiment",
        "agent.model": "variant",
        "agent.allowed_tools": "experiment",
        "run_limits.max_turns": "task",
        "run_limits.task_timeout": "task",
        "run_limits.turn_timeout": "task",
        "run_limits.max_usd": "variant",
        "sandbox.driver": "task",
        "sandbox.python": "task",
        "sandbox.template_sources[0]": "task",
        "repeats": "experiment",
    }
    assert {path: r.lineage[path] for path in expected_lineage} == expected_lineage
    assert r.config["initial_prompt"] == (
        "You are working in a throwaway sandbox.\n\n"
        "calc.py has a bug in add(). Fix it; do not change the signature."
    )


def test_it_matches_coder_eval_for_model_ab_sonnet_careful():
    defaults, variants = _experiment(MODEL_AB)
    r = resolve(trial_layers(yaml.safe_load(FIX_CALC), defaults, variants["sonnet-careful"]))
    assert r.config["repeats"] == 5
    assert r.lineage["repeats"] == "variant"
    assert r.config["agent"]["sdk_options"] == {"effort": "high"}
    assert r.config["initial_prompt"] == (
        "You are working in a throwaway sandbox.\n\n"
        "calc.py has a bug in add(). Fix it; do not change the signature.\n\n"
        "Run the tests before you finish."
    )
    assert r.lineage["initial_prompt"] == "variant"
    assert r.config["description"] == "Fix the add() bug so the unit check passes"


def test_it_matches_coder_eval_for_overlay_ab_with_a_max_turns_override():
    # coder-eval's runs/ab used `-D run_limits.max_turns=7`.
    defaults, variants = _experiment(OVERLAY_AB)
    task = yaml.safe_load(FIX_CALC_AGENTLESS)
    overrides = parse_overrides(["run_limits.max_turns=7"])
    r = resolve(trial_layers(task, defaults, variants["fixed-overlay"], overrides))
    assert r.config["sandbox"]["template_sources"] == [
        {"type": "template_dir", "path": "template"},
        {"type": "template_dir", "path": "../overlays/fixed"},
    ]
    assert r.lineage["sandbox.template_sources[1]"] == "variant"
    assert r.config["run_limits"] == {"max_turns": 7, "task_timeout": 120, "turn_timeout": 120}
    assert r.lineage["run_limits.max_turns"] == "override"
    assert r.config["agent"]["type"] == "none"
    assert r.lineage["agent.type"] == "task"
    assert r.lineage["agent.model"] == "builtin"
    assert r.config["agent"]["allowed_tools"][-1] == "Skill"
    assert "initial_prompt" not in r.config

    baseline = resolve(trial_layers(task, defaults, variants["baseline"]))
    assert baseline.config["sandbox"]["template_sources"] == [{"type": "template_dir", "path": "template"}]
    assert baseline.config["run_limits"]["max_turns"] == 20


def test_it_applies_experiment_limits_and_keeps_the_task_pre_run_for_noop_canary():
    defaults, variants = _experiment(OVERLAY_AB)
    r = resolve(trial_layers(yaml.safe_load(NOOP_CANARY), defaults, variants["baseline"]))
    assert r.config["run_limits"] == {"max_turns": 20, "task_timeout": 60, "turn_timeout": 60}
    assert r.lineage["run_limits.max_turns"] == "builtin"
    assert r.lineage["run_limits.task_timeout"] == "experiment"
    assert r.config["pre_run"] == [{"command": "python3 hello.py > out.txt", "timeout": 10}]
    assert r.lineage["pre_run[0]"] == "task"
    assert r.config["post_run"] == []
    assert r.config["sandbox"]["template_sources"][0]["type"] == "starter_files"


# --------------------------------------------------------------------------- prompt mutations


def test_it_prefixes_and_suffixes_with_a_blank_line_by_default():
    mutations = [{"type": "prefix", "content": "P"}, {"type": "suffix", "content": "S"}]
    assert apply_prompt_mutations("body", mutations) == "P\n\nbody\n\nS"


def test_it_uses_a_custom_separator():
    mutations = [{"type": "prefix", "content": "P", "separator": " | "}]
    assert apply_prompt_mutations("body", mutations) == "P | body"


def test_it_replaces_literal_text_by_default():
    mutations = [{"type": "replace", "pattern": "a.c", "replacement": "X"}]
    assert apply_prompt_mutations("abc a.c", mutations) == "abc X"


def test_it_replaces_by_regex_when_asked():
    mutations = [{"type": "replace", "pattern": r"(\w+)@(\w+)", "replacement": r"\2 at \1", "regex": True}]
    assert apply_prompt_mutations("mail bob@home", mutations) == "mail home at bob"


def test_it_fills_template_placeholders_in_braces():
    mutations = [{"type": "template", "variables": {"lang": "Python", "n": 3}}]
    assert apply_prompt_mutations("Use {lang} in {n} steps; {other} stays.", mutations) == (
        "Use Python in 3 steps; {other} stays."
    )


def test_it_applies_mutations_in_order():
    mutations = [
        {"type": "suffix", "content": "Create it."},
        {"type": "replace", "pattern": "Create", "replacement": "Write"},
    ]
    assert apply_prompt_mutations("Task.", mutations) == "Task.\n\nWrite it."


@pytest.mark.parametrize(
    ("mutation", "message"),
    [
        ({"type": "rephrase", "instructions": "x"}, "unsupported type 'rephrase'"),
        ({"type": "prefix"}, r"prompt_mutations\[0\] \(prefix\): missing 'content'"),
        ({"type": "replace", "pattern": "(", "replacement": "", "regex": True}, "bad regex"),
    ],
)
def test_it_rejects_bad_mutations(mutation, message):
    with pytest.raises(ResolveError, match=message):
        apply_prompt_mutations("p", [mutation])


def test_it_skips_every_mutation_when_the_variant_replaces_the_prompt():
    defaults, _ = _experiment(MODEL_AB)
    variant = {"variant_id": "custom", "initial_prompt": "Completely different."}
    r = resolve(trial_layers(yaml.safe_load(PLAIN_TASK), defaults, variant))
    assert r.config["initial_prompt"] == "Completely different."
    assert r.lineage["initial_prompt"] == "variant"
    assert r.config["prompt_mutations"] == []
    assert not [path for path in r.lineage if path.startswith("prompt_mutations")]


def test_it_leaves_a_task_without_a_prompt_alone():
    defaults, _ = _experiment(MODEL_AB)
    r = resolve(trial_layers(yaml.safe_load(FIX_CALC_AGENTLESS), defaults))
    assert "initial_prompt" not in r.config
    assert len(r.config["prompt_mutations"]) == 1


def test_it_refuses_to_mutate_a_prompt_it_has_not_read():
    defaults, _ = _experiment(MODEL_AB)
    task = {"task_id": "t", "initial_prompt_file": "prompt.md"}
    with pytest.raises(ResolveError, match="inline initial_prompt_file"):
        resolve(trial_layers(task, defaults), validate=False)


# --------------------------------------------------------------------------- overrides


def test_it_parses_overrides_into_a_nested_patch():
    patch = parse_overrides(
        ["run_limits.max_turns=5", "agent.model=claude-opus-4-6", "tags=[a, b]", "run_limits.max_usd=0.5"],
        validate=False,
    )
    assert patch == {
        "run_limits": {"max_turns": 5, "max_usd": 0.5},
        "agent": {"model": "claude-opus-4-6"},
        "tags": ["a", "b"],
    }


@pytest.mark.parametrize(
    ("item", "value"),
    [
        ("skip=true", True),
        ("agent.model=on", "on"),
        ("agent.model=off", "off"),
        ("agent.sdk_options={effort: high}", {"effort": "high"}),
        ("agent.model=", None),
        ("agent.model=a=b", "a=b"),
        ("agent.model='5'", "5"),
    ],
)
def test_it_parses_override_values_as_yaml(item, value):
    path, _, _ = item.partition("=")
    patch = parse_overrides([item], validate=False)
    *parents, last = path.split(".")
    for key in parents:
        patch = patch[key]
    assert patch[last] == value


@pytest.mark.parametrize(
    ("item", "path", "value"),
    [
        # A shell command with ": " stays a command, not a one-key mapping.
        ("agent.command=echo status: ok", ("agent", "command"), "echo status: ok"),
        ("initial_prompt=- fix the bug", ("initial_prompt",), "- fix the bug"),
        # A str field given something YAML reads as a number keeps the text as typed.
        ("agent.model=1.10", ("agent", "model"), "1.10"),
        ("run_limits.max_turns=5", ("run_limits", "max_turns"), 5),
    ],
)
def test_it_takes_an_override_value_as_the_fields_type(item, path, value):
    patch = parse_overrides([item])
    for key in path:
        patch = patch[key]
    assert patch == value


def test_it_rejects_a_path_set_twice():
    with pytest.raises(OverrideError, match="'run_limits.max_turns' is set twice"):
        parse_overrides(["run_limits.max_turns=5", "run_limits.max_turns=6"], validate=False)


def test_it_rejects_overlapping_paths():
    with pytest.raises(OverrideError, match="'agent' and 'agent.model' overlap"):
        parse_overrides(["agent={model: x}", "agent.model=y"], validate=False)


@pytest.mark.parametrize("item", ["max_turns", "=5", "run_limits..max_turns=5", "run limits=5", "a.b[0]=1"])
def test_it_rejects_malformed_overrides_naming_them(item):
    with pytest.raises(OverrideError, match="malformed") as info:
        parse_overrides([item], validate=False)
    assert repr(item) in str(info.value)


def test_it_rejects_an_override_value_that_is_not_yaml():
    with pytest.raises(OverrideError, match="'tags=\\[a, b'.*not valid YAML"):
        parse_overrides(["tags=[a, b"], validate=False)


# --------------------------------------------------------------------------- validation


def test_it_accepts_valid_overrides_of_layer_fields():
    patch = parse_overrides(
        [
            "run_limits.max_turns=5",
            "agent.model=claude-opus-4-6",
            "agent.sdk_options={effort: high}",  # agent options are open
            "repeats=2",
            "template_sources=[{type: template_dir, path: ../overlay}]",
        ]
    )
    assert patch["agent"]["sdk_options"] == {"effort": "high"}
    assert patch["repeats"] == 2


def test_it_rejects_an_unknown_override_path_saying_what_was_expected():
    with pytest.raises(OverrideError) as info:
        parse_overrides(["run_limits.max_turnz=3"])
    message = str(info.value)
    assert "run_limits.max_turnz" in message
    assert "did you mean 'max_turns'?" in message
    assert "expected one of:" in message and "max_usd" in message


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("run_limits.max_turns=abc", "run_limits.max_turns: Input should be a valid integer"),
        ("run_limits.max_turns=0", "run_limits.max_turns: Input should be greater than 0"),
        ("repeats=0", "repeats: Input should be greater than or equal to 1"),
        ("sandbox.driver=podman", "sandbox.driver: Input should be 'tempdir' or 'docker'"),
        (
            "agent.type=bogus",
            "agent.type: unknown agent type 'bogus'; expected one of: aider, claude-code, codex",
        ),
        (
            "template_sources=[{type: template_dir, path: a}, {type: repo, url: 'https://h/r'}]",
            "must be the first one",
        ),
        ("template_sources=[{type: template_dir}]", r"template_sources\[0\].path: Field required"),
    ],
)
def test_it_rejects_an_override_value_of_the_wrong_type(item, expected):
    with pytest.raises(OverrideError, match=expected):
        parse_overrides([item])


@pytest.mark.parametrize("item", ["task_id=x", "tags=[a, b]", "dataset={rows: []}"])
def test_it_rejects_overrides_of_fields_a_layer_cannot_set(item):
    path = item.partition("=")[0]
    with pytest.raises(OverrideError, match=f"override {path}: unknown field '{path}'"):
        parse_overrides([item])


def test_it_rejects_an_override_below_a_single_value():
    with pytest.raises(OverrideError, match="run_limits.max_turns is a single value or a list"):
        parse_overrides(["run_limits.max_turns.hard=1"])


def test_it_validates_the_merged_config_naming_the_layer_responsible():
    overrides = {
        "template_sources": [{"type": "repo", "url": "https://example.com/r.git"}],
        "run_limits": {"task_timeout": 5},
    }
    with pytest.raises(ResolveError) as info:
        resolve(trial_layers(yaml.safe_load(FIX_CALC), overrides=overrides))
    message = str(info.value)
    expected = (
        "sandbox.template_sources[1].type: a repo template source must be the first one (set by override)"
    )
    assert expected in message
    assert "run_limits.task_timeout: Input should be greater than or equal to 30 (set by override)" in message


def test_it_lets_an_agentless_arm_run_a_task_that_has_a_prompt():
    # coder-eval refuses a `none` agent with a prompt inside one task file; in an experiment the
    # `none` arm is a baseline over prompted tasks, so the resolved config keeps the prompt.
    defaults, variants = _experiment(OVERLAY_AB)

    resolved = resolve(trial_layers(yaml.safe_load(PLAIN_TASK), defaults, variants["baseline"]))

    assert resolved.config["agent"]["type"] == "none"
    assert resolved.config["initial_prompt"]


def test_it_rejects_bad_repeats_from_any_layer():
    with pytest.raises(ResolveError, match=r"repeats: expected an integer >= 1, got 0 \(set by variant\)"):
        resolve(trial_layers(yaml.safe_load(PLAIN_TASK), variant={"variant_id": "v", "repeats": 0}))


def test_it_resolves_every_sample_variant_into_a_valid_config():
    pairs = (
        (MODEL_AB, FIX_CALC),
        (MODEL_AB, PLAIN_TASK),
        (OVERLAY_AB, FIX_CALC_AGENTLESS),
        (OVERLAY_AB, NOOP_CANARY),
    )
    for experiment, task_text in pairs:
        defaults, variants = _experiment(experiment)
        fingerprints = {
            config_fingerprint(resolve(trial_layers(yaml.safe_load(task_text), defaults, v)).config)
            for v in variants.values()
        }
        assert len(fingerprints) == len(variants)  # every arm differs from the others


# --------------------------------------------------------------------------- fingerprint


def test_it_fingerprints_configs_independently_of_key_order():
    a = {"agent": {"model": "m", "type": "t"}, "repeats": 1}
    b = {"repeats": 1, "agent": {"type": "t", "model": "m"}}
    assert config_fingerprint(a) == config_fingerprint(b)
    assert len(config_fingerprint(a)) == 64


def test_it_changes_the_fingerprint_when_a_value_changes():
    a = {"agent": {"model": "m"}, "repeats": 1}
    assert config_fingerprint(a) != config_fingerprint({"agent": {"model": "m2"}, "repeats": 1})
    assert config_fingerprint(a) != config_fingerprint({"agent": {"model": "m"}, "repeats": 2})
