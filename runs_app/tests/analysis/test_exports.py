"""The trials' CSV: the database's COPY (PostgreSQL) and Python's writer read back alike."""

import csv
import io
from datetime import UTC, datetime

import pytest
from django.db import connection

from runs_app.analysis import exports
from runs_app.models import Trial
from runs_app.tests.analysis.test_comparison import make_experiment, make_run

pytestmark = pytest.mark.django_db

NUMBERS = {"id", "run", "task_version", "replicate", "attempt", "score", "duration_seconds", "input_tokens",
           "output_tokens", "cache_read_tokens", "cache_creation_tokens", "cost_usd", "turns",
           "answerer_cost_usd", "judge_cost_usd"}  # fmt: skip
MOMENTS = {"started_at", "finished_at"}


def _cell(column: str, text: str):
    """A CSV cell as the value it stands for (numbers and times may be written differently)."""
    if text == "":
        return None
    if column in NUMBERS:
        return float(text)
    if column in MOMENTS:
        return datetime.fromisoformat(text)
    return text


def _read(chunks) -> list[dict]:
    text = "".join(c.decode() if isinstance(c, bytes) else c for c in chunks)
    reader = csv.DictReader(io.StringIO(text))
    assert reader.fieldnames == exports.TRIAL_COLUMNS
    return [{column: _cell(column, value) for column, value in row.items()} for row in reader]


def _expected(row: dict) -> dict:
    values = {}
    for column in exports.TRIAL_COLUMNS:
        value = exports.csv_safe(row[column])
        value = str(value) if isinstance(value, bool | datetime) else value
        values[column] = _cell(column, value) if isinstance(value, str) else value
        if column in NUMBERS and values[column] is not None:
            values[column] = float(values[column])
    return values


def test_the_trials_csv_reads_back_as_the_trials_on_either_writer():
    run = make_run(
        make_experiment(),
        {"a": {"base": "PF", "new": "E"}, "b": {"base": "P"}},
        dataset_row_id={("a", "base", 0): "=HYPERLINK(1)", ("a", "base", 1): ""},
        error_message={("a", "new", 0): 'line one\nline "two", with a comma\r\n-3'},
        error_category={("a", "new", 0): "-minus"},
        budget_exceeded={("b", "base", 0): "@tokens"},
        score={("a", "base", 0): 1.0, ("a", "base", 1): 1e-05},
        duration_seconds={("b", "base", 0): 0.1},
        cost_usd={("a", "base", 0): 0.000123456789},
        timed_out={("a", "base", 1): True},
        started_at={
            ("a", "base", 0): datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
            ("a", "base", 1): datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        },  # fmt: skip
    )
    trials = Trial.objects.filter(run=run).current().order_by("pk")
    expected = [_expected(row) for row in exports.trial_rows(trials)]
    assert len(expected) == 4

    written = {"python": exports.csv_lines(exports.trial_rows(trials), exports.TRIAL_COLUMNS)}
    if connection.vendor == "postgresql":
        written["copy"] = exports._copied_csv(trials)
    written["chosen"] = exports.trials_csv(trials)
    for writer, chunks in written.items():
        assert _read(chunks) == expected, writer
    first = expected[0]
    assert first["dataset_row_id"] == "'=HYPERLINK(1)" and first["label"] == "a[=HYPERLINK(1)]#0"
    assert first["timed_out"] == "False" and expected[1]["timed_out"] == "True"
    assert expected[1]["label"] == "a#1" and expected[1]["dataset_row_id"] is None
    errored = next(row for row in expected if row["status"] == "error")
    assert errored["error_category"] == "'-minus" and errored["error_message"].startswith("line one\n")
