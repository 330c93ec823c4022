"""bench/coder_eval_parity.py walks any folder and classifies each file: checked here without
coder-eval, against a fake `coder-eval` executable that refuses the files saying so."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from django.conf import settings

BENCH = settings.BASE_DIR / "bench" / "coder_eval_parity.py"
_SPEC = importlib.util.spec_from_file_location("coder_eval_parity", BENCH)
assert _SPEC and _SPEC.loader
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)

DOCS = " ".join((settings.BASE_DIR / "docs" / "coder-eval.md").read_text().split())

# `plan`: refuses a file holding "FAKE-REFUSE: <message>" with that message, as coder-eval prints
# a pydantic error; warns of "FAKE-WARN: <message>"; accepts anything else.
FAKE_CODER_EVAL = """#!{python}
import re, sys
files = [a for a in sys.argv[2:] if a != "-e"]
for name in files:
    text = open(name).read()
    for warning in re.findall(r"FAKE-WARN: (.*)", text):
        print("  ⚠ TaskDefinition: " + warning)
    found = re.search(r"FAKE-REFUSE: (.*)", text)
    if found:
        print("  Error: Invalid task definition: 1 validation error for TaskDefinition")
        print(found.group(1))
        sys.exit(1)
print("All tasks are valid!")
"""

TASK = """task_id: {task_id}
description: a task
agent: {{type: none}}
sandbox: {{python: null}}
success_criteria:
  - type: file_exists
    path: a.txt
    description: a.txt exists{extra}
"""


def _task(folder: Path, name: str, task_id: str, extra: str = "", comment: str = "") -> None:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((f"# {comment}\n" if comment else "") + TASK.format(task_id=task_id, extra=extra))


@pytest.fixture
def fake_coder_eval(tmp_path):
    exe = tmp_path / "coder-eval"
    exe.write_text(FAKE_CODER_EVAL.format(python=sys.executable))
    exe.chmod(0o755)
    return exe


@pytest.fixture
def folder(tmp_path):
    """A user's folder: no expected.json but for one `pending` file."""
    root = tmp_path / "suite"
    _task(root, "same.yaml", "pb-same")
    # evalsite's own `gating` key: coder-eval refuses it, a documented difference.
    _task(
        root, "gating.yaml", "pb-gating", extra="\n    gating: true",
        comment="FAKE-REFUSE: success_criteria.0.file_exists.gating Extra inputs are not permitted",
    )  # fmt: skip
    # A top-level typo: coder-eval runs the task, evalsite refuses it, a documented difference.
    _task(
        root, "top_typo.yaml", "pb-top-typo", extra="\ntag: [x]",
        comment="FAKE-WARN: unknown top-level field 'tag' will be ignored",
    )  # fmt: skip
    # A real coder-eval key that evalsite does not know is no typo: not documented by that rule.
    _task(root, "real_key.yaml", "pb-real-key", extra="\nchecker_context: {}")
    # coder-eval refuses for a reason no docs entry gives.
    _task(root, "odd.yaml", "pb-odd", comment="FAKE-REFUSE: something else entirely")
    _task(root, "awaited.yaml", "pb-awaited", comment="FAKE-REFUSE: something else entirely")
    _task(root, "folder_task/task.yaml", "pb-folder-task")
    (root / "exp").mkdir()
    _task(root, "exp/task.yaml", "pb-exp-task")
    (root / "exp" / "experiment.yaml").write_text(
        "experiment_id: pb-exp\ndescription: e\nvariants:\n  - variant_id: a\n    agent: {type: none}\n"
    )
    (root / "notes.md").write_text("not a task")
    (root / "expected.json").write_text(json.dumps({"awaited.yaml": {"pending": "issue 30 item 99"}}))
    return root


def test_it_walks_top_level_files_task_folders_and_experiments(folder):
    items = bench.collect([folder], None)

    assert [item.name for item in items] == [
        "awaited.yaml", "exp/experiment.yaml", "folder_task/task.yaml", "gating.yaml", "odd.yaml",
        "real_key.yaml", "same.yaml", "top_typo.yaml",
    ]  # fmt: skip
    experiment = next(item for item in items if item.is_experiment)
    assert experiment.tasks == ["exp/task.yaml"]
    assert bench.coder_eval_files(experiment)[0] == "-e"
    assert next(item for item in items if item.name == "awaited.yaml").expected["pending"]


def test_it_narrows_to_one_file_given_by_path(folder):
    assert [item.name for item in bench.collect([folder / "odd.yaml"], None)] == ["odd.yaml"]
    # An experiment's task stands for its experiment.
    names = [item.name for item in bench.collect([folder / "exp" / "task.yaml"], None)]
    assert names == ["exp/experiment.yaml"]


@pytest.mark.django_db
def test_it_classifies_each_file_and_exits_by_the_worst(folder, fake_coder_eval, tmp_path):
    items = bench.collect([folder], None)

    results = bench.compare(items, fake_coder_eval, tmp_path, run=False)
    verdicts = {item.name: bench.judge(item, results[item.key], DOCS) for item in items}

    assert {name: verdict for name, (verdict, _) in verdicts.items()} == {
        "awaited.yaml": "pending",
        "exp/experiment.yaml": "agree",
        "folder_task/task.yaml": "agree",
        "gating.yaml": "documented",
        "odd.yaml": "DIFFERENT",
        "real_key.yaml": "DIFFERENT",
        "same.yaml": "agree",
        "top_typo.yaml": "documented",
    }
    assert "gating" in verdicts["gating.yaml"][1]
    assert verdicts["awaited.yaml"][1] == "issue 30 item 99"
    by_key = {item.key: verdicts[item.name] for item in items}
    assert bench.summary(items, by_key) == bench.EXIT_DIFFERENT
    without_odd = [item for item in items if item.name not in ("odd.yaml", "real_key.yaml")]
    assert bench.summary(without_odd, by_key) == bench.EXIT_ONLY_PENDING
    assert bench.summary([item for item in without_odd if item.name != "awaited.yaml"], by_key) == 0


def test_it_compares_outcomes_and_exit_codes_when_both_ran():
    ran = {"verdict": "accepted", "stage": "", "error": ""}
    passed = [{"row": "a", "status": "SUCCESS", "score": 1.0}]
    result = {
        "coder_eval": {**ran, "outcomes": passed, "run_exit_code": 1},
        "evalsite": {**ran, "outcomes": [{"row": "a", "status": "passed", "score": 1.0}], "run_exit_code": 0},
    }
    assert not bench.tools_agree(result)  # a failed suite threshold: coder-eval exits 1

    result["evalsite"]["run_exit_code"] = 1
    assert bench.tools_agree(result)

    result["evalsite"]["outcomes"][0]["score"] = 0.5
    assert not bench.tools_agree(result)


def test_it_holds_evalsite_to_its_own_expectation_where_coder_eval_cannot_show_it():
    item = bench.Item(
        Path("/x"), "hooks.yaml", {"evalsite_expects": {"statuses": ["error"], "error": "says no"}}
    )
    ran = {"verdict": "accepted", "stage": "", "error": ""}
    result = {
        "coder_eval": {
            **ran,
            "outcomes": [{"row": None, "status": "SUCCESS", "score": 1.0}],
            "run_exit_code": 0,
        },
        "evalsite": {**ran, "outcomes": [{"row": None, "status": "error", "score": 1.0, "error": "x: "}]},
    }
    assert bench.judge(item, result, DOCS)[0] == "DIFFERENT"

    item.expected["pending"] = "issue 30 item 12"
    assert bench.judge(item, result, DOCS) == ("pending", "issue 30 item 12")

    result["evalsite"]["outcomes"][0]["error"] = "x: the hook says no"
    del item.expected["pending"]
    verdict, why = bench.judge(item, result, DOCS)
    assert (verdict, why) == ("DIFFERENT", "no difference recorded")  # met; the tools still differ


def test_every_known_difference_quotes_the_docs():
    for rule in bench.KNOWN_DIFFERENCES:
        assert " ".join(rule.docs.split()) in DOCS, rule.name


def test_the_rules_recognise_the_corpus_documented_refusals():
    """Without the corpus's expected.json, a user's copy of a corpus file whose difference is a
    refusal still comes out `documented`."""
    corpus = bench.CORPORA[0]
    expected = json.loads((corpus / "expected.json").read_text())
    unrecognised = []
    for name, entry in expected.items():
        refusal = entry["coder_eval"]["verdict"] != entry["evalsite"]["verdict"]
        if entry["agree"] or not refusal or entry["evalsite"].get("stage") == "launch":
            continue
        if bench.matching_rule(entry, bench._load_yaml(corpus / name)) is None:
            unrecognised.append(name)
    assert unrecognised == []


# --- the second-round corpus (corpus/coder_eval_round2/) -------------------------------------

ROUND2 = bench.CORPORA[1]
ROUND2_ITEMS = bench.collect([ROUND2], None)
ROUND2_EXPECTED = json.loads((ROUND2 / "expected.json").read_text())


def test_the_second_round_corpus_is_all_recorded():
    assert len(ROUND2_ITEMS) >= 25
    assert sorted(item.name for item in ROUND2_ITEMS) == sorted(
        name for name, entry in ROUND2_EXPECTED.items() if "evalsite" in entry
    ), "run bench/coder_eval_parity.py experiments_app/tests/corpus/coder_eval_round2 --record"


@pytest.mark.django_db
@pytest.mark.parametrize("item", ROUND2_ITEMS, ids=lambda item: item.name)
def test_it_imports_or_refuses_each_second_round_file_as_recorded(item):
    from experiments_app.definitions import ImportFailed

    recorded = ROUND2_EXPECTED[item.name]["evalsite"]
    expected = "refused" if recorded["verdict"] == "refused" and recorded["stage"] == "import" else "accepted"
    try:
        bench._evalsite_import(item)
        verdict, problem = "accepted", ""
    except ImportFailed as exc:
        verdict, problem = "refused", exc.issues[0]
    assert verdict == expected, problem or f"recorded as refused: {recorded['error']}"


@pytest.mark.parametrize("item", ROUND2_ITEMS, ids=lambda item: item.name)
def test_every_second_round_difference_is_documented_or_awaits_a_named_fix(item):
    entry = ROUND2_EXPECTED[item.name]
    if entry["agree"]:
        return
    verdict, why = bench.judge(item, entry, DOCS)
    assert verdict in ("documented", "pending"), why
    if verdict == "pending":
        assert why.startswith("issue 30 item "), why
