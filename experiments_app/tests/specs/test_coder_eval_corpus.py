"""The coder-eval corpus (`corpus/coder_eval/`): evalsite imports or refuses each file as
recorded in its expected.json, and every way it parts from coder-eval 0.12.16 is documented.

expected.json is written by `bench/coder_eval_parity.py --record`, which runs both tools (and
the runnable files through a real worker); this test needs neither coder-eval nor a worker.
It checks the import step only: a refusal at launch (a list in a `${row.*}` placeholder) is
decided in runs_app, which experiments_app may not import, so for those files the import must
succeed and the bench checks the rest.
"""

import json
from pathlib import Path

import pytest
from django.conf import settings

from experiments_app.definitions import ImportFailed, import_tasks

CORPUS = Path(__file__).parents[1] / "corpus" / "coder_eval"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())
DOCS = " ".join((settings.BASE_DIR / "docs" / "coder-eval.md").read_text().split())
FILES = sorted(str(p.relative_to(CORPUS)) for p in [*CORPUS.glob("*.yaml"), *CORPUS.glob("*/task.yaml")])


def _import_verdict(name: str) -> tuple[str, str]:
    """("accepted" or "refused", the first problem)."""
    try:
        import_tasks([CORPUS / name])
    except ImportFailed as exc:
        return "refused", exc.issues[0]
    return "accepted", ""


def test_it_has_a_corpus_of_at_least_30_tasks_all_recorded():
    assert len(FILES) >= 30
    assert sorted(EXPECTED) == FILES, "run bench/coder_eval_parity.py --record after changing the corpus"


def test_it_runs_at_least_a_dozen_files_through_both_tools():
    both = [n for n, e in EXPECTED.items() if "outcomes" in e["coder_eval"] and "outcomes" in e["evalsite"]]
    assert len(both) >= 12


@pytest.mark.django_db
@pytest.mark.parametrize("name", FILES)
def test_it_imports_or_refuses_the_file_as_recorded(name):
    recorded = EXPECTED[name]["evalsite"]
    expected = "refused" if recorded["verdict"] == "refused" and recorded["stage"] == "import" else "accepted"

    verdict, problem = _import_verdict(name)
    assert verdict == expected, problem or f"recorded as refused: {recorded['error']}"


@pytest.mark.parametrize("name", FILES)
def test_it_documents_every_difference_from_coder_eval(name):
    entry = EXPECTED[name]
    difference = entry.get("difference")
    if entry["agree"]:  # same verdict and, where both ran it, same outcomes (the bench compared)
        return
    if not difference:
        pytest.fail("the tools differ on this file and expected.json names no difference")
    if difference.startswith("UNDOCUMENTED"):
        pytest.fail(difference)
    assert " ".join(difference.split()) in DOCS, f"not in docs/coder-eval.md: {difference!r}"
