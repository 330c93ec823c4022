"""Trials as rows: the one shape every export, the API and the reports use, one CSV escaper,
and streaming CSV / JSON writers (100,000 trials never sit in memory at once).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.urls import reverse

# Column -> the Trial field it reads (the CSV header is the keys, in this order).
_FIELDS = {
    "id": "pk",
    "run": "run_id",
    "variant": "variant__slug",
    "task": "task_version__task__slug",
    "task_version": "task_version__number",
    "replicate": "replicate",
    "dataset_row_id": "dataset_row_id",
    "attempt": "attempt",
    "status": "status",
    "score": "score",
    "duration_seconds": "duration_seconds",
    "input_tokens": "input_tokens",
    "output_tokens": "output_tokens",
    "cache_read_tokens": "cache_read_tokens",
    "cache_creation_tokens": "cache_creation_tokens",
    "cost_usd": "cost_usd",
    "turns": "turns",
    "timed_out": "timed_out",
    "budget_exceeded": "budget_exceeded",
    "error_category": "error_category",
    "error_message": "error_message",
    "config_fingerprint": "config_fingerprint",
    "started_at": "started_at",
    "finished_at": "finished_at",
}
# `label` is Trial.label (task[row]#replicate); `url` the trial page's path.
TRIAL_COLUMNS = [*_FIELDS, "label", "url"]
# Characters that make a spreadsheet read a cell as a formula.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def trial_rows(trials, chunk_size: int = 2000) -> Iterator[dict[str, Any]]:
    """One flat dict per trial of the queryset, in its order, with the TRIAL_COLUMNS keys."""
    # One reverse() for the whole export (it costs 10 µs a call): a template of the path.
    url = reverse("trial_detail", args=[987654321, 123456789])
    url = url.replace("987654321", "{run}").replace("123456789", "{id}")
    for values in trials.values_list(*_FIELDS.values()).iterator(chunk_size=chunk_size):
        row = dict(zip(_FIELDS, values, strict=True))
        suffix = f"[{row['dataset_row_id']}]" if row["dataset_row_id"] else ""
        row["label"] = f"{row['task']}{suffix}#{row['replicate']}"
        row["url"] = url.format(run=row["run"], id=row["id"])
        yield row


def csv_safe(value: Any) -> Any:
    """A cell as written to CSV: empty for None, and text that a spreadsheet would run as a
    formula (agent output, dataset row ids, gate details) prefixed with a quote. Numbers stay."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def csv_lines(rows: Iterable[dict[str, Any]], columns: Sequence[str], batch: int = 500) -> Iterator[str]:
    """CSV text: the header, then the rows (missing keys empty), `batch` lines a piece (a piece
    per line made the response's writes cost as much as the rows)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(columns)
    starts = "".join(_FORMULA_STARTS)
    pending = 0
    for row in rows:
        # csv_safe, inlined: it runs for every cell of 100,000 rows.
        writer.writerow(
            [
                "" if value is None
                else "'" + value if value.__class__ is str and value[:1] and value[0] in starts
                else value
                for value in map(row.get, columns)
            ]
        )  # fmt: skip
        pending += 1
        if pending >= batch:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
            pending = 0
    yield buffer.getvalue()


def json_array(rows: Iterable[dict[str, Any]]) -> Iterator[str]:
    """A JSON array, one element per line (dates as ISO 8601)."""
    yield "["
    for i, row in enumerate(rows):
        yield ("," if i else "") + "\n" + json.dumps(row, cls=DjangoJSONEncoder)
    yield "\n]\n"
