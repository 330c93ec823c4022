"""Fidelity round 2 (issue 30) at import: coder-eval 0.12.16 keys evalsite refused as unknown are
refused by name, and what coder-eval refuses evalsite refuses too, each naming file, line and field.
The files are in `corpus/coder_eval_round2/`; the verdicts coder-eval gives them were recorded with
`coder-eval plan FILE` (0.12.16)."""

import re
from pathlib import Path

import pytest
from django.conf import settings

from experiments_app.specs.loading import load_experiment, load_tasks
from experiments_app.specs.resolve import OverrideError, parse_overrides
from experiments_app.specs.unbuilt import unbuilt_names
from experiments_app.specs.yaml_errors import UNBUILT_CRITERIA

CORPUS = Path(__file__).parents[1] / "corpus" / "coder_eval_round2"
DOCS = (settings.BASE_DIR / "docs" / "coder-eval.md").read_text()

# (file, line, field, fragment): coder-eval 0.12.16 plans each of these as valid; evalsite cannot
# run them as coder-eval does, so it names the key and says what to do.
REFUSED_BY_NAME = [
    ("spec_7_checker_context.yaml", 4, "checker_context", "checker_context (the judge's API route"),
    ("spec_7_read_only.yaml", 8, "success_criteria[0].read_only", "read_only (also run the check"),
    (
        "spec_7_max_transcript_chars.yaml",
        9,
        "success_criteria[0].max_transcript_chars",
        "max_transcript_chars (a cap on the judge transcript",
    ),
]
# (file, line, field, fragment): coder-eval 0.12.16 refuses each of these (`coder-eval plan`: rc 1).
REFUSED_AS_CODER_EVAL = [
    (
        "spec_8_json_contains_short.yaml",
        11,
        "success_criteria[0].assertions[0].expected",
        "'scalat' has 6",
    ),
    ("spec_8_reference_dir_brace.yaml", 5, "success_criteria[0]", "uses $REFERENCE_DIR"),
    ("spec_8_system_prompt_and_file.yaml", 7, "agent.system_prompt_file", "not both"),
]
# coder-eval 0.12.16 accepts these; so does evalsite.
ACCEPTED = ["spec_7_read_only_false.yaml", "spec_8_reference_directory_var.yaml"]


@pytest.mark.parametrize(("name", "line", "field", "fragment"), REFUSED_BY_NAME + REFUSED_AS_CODER_EVAL)
def test_it_refuses_the_file_naming_its_line_field_and_what_to_do(name, line, field, fragment):
    result = load_tasks([CORPUS / name], root=CORPUS)

    assert [(e.line, e.field) for e in result.errors] == [(line, field)], [str(e) for e in result.errors]
    assert fragment in result.errors[0].message
    assert ": " in result.errors[0].message.split(fragment, 1)[1]  # then what to do


@pytest.mark.parametrize("name", ACCEPTED)
def test_it_accepts_what_coder_eval_accepts(name):
    result = load_tasks([CORPUS / name], root=CORPUS)

    assert result.ok, [str(e) for e in result.errors]


def test_it_refuses_the_same_keys_in_an_experiment_variant(tmp_path):
    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(
        "experiment_id: e\nvariants:\n  - variant_id: v\n    checker_context: {api_route: {model: m}}\n"
    )
    result = load_experiment(experiment, root=tmp_path)

    assert [(e.line, e.field) for e in result.errors] == [(4, "variants[0].checker_context")]


def _not_built_table() -> str:
    return DOCS.split("## Not built yet (refused by name)", 1)[1].split("\n## ", 1)[0]


def test_the_docs_table_lists_every_key_and_criterion_refused_as_not_built():
    table = _not_built_table()
    named = set(re.findall(r"`([^`]+)`", table))

    missing = [name for name in [*unbuilt_names(), *UNBUILT_CRITERIA] if name not in named]
    assert not missing, f"add these to docs/coder-eval.md's 'Not built yet' table: {missing}"


def test_the_docs_table_lists_nothing_evalsite_accepts():
    table = _not_built_table()
    rows = [row for row in table.splitlines() if row.startswith("| ") and "---" not in row]
    first_column = [row.split("|")[1] for row in rows]
    named = {name for cell in first_column[1:] for name in re.findall(r"`([^`]+)`", cell)}

    assert named <= {*unbuilt_names(), *UNBUILT_CRITERIA}


@pytest.mark.parametrize(
    ("item", "fragment"),
    [
        ("checker_context.api_route.model=m", "coder-eval's checker_context (the judge's API route"),
        ("success_criteria=[{type: run_command, command: 'true', read_only: true}]", "key read_only"),
        (
            "success_criteria=[{type: llm_judge, prompt: p, max_transcript_chars: 9}]",
            "key max_transcript_chars",
        ),
    ],
)
def test_a_d_override_names_the_unbuilt_key_too(item, fragment):
    with pytest.raises(OverrideError, match=re.escape(fragment)):
        parse_overrides([item])
