"""Trials as rows: the one shape every export, the API and the reports use, one CSV escaper,
and streaming CSV / JSON writers (100,000 trials never sit in memory at once).

On PostgreSQL the trials' CSV is written by the database (`COPY ... TO STDOUT`), with the same
columns and the same formula escaping: Python's writer manages about 17,000 rows a second. Both
read back to the same cells (tested).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any

from asgiref.sync import sync_to_async
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.db.models import F, Func, TextField
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
    "host": "host",
    "status": "status",
    "score": "score",
    "duration_seconds": "duration_seconds",
    "input_tokens": "input_tokens",
    "output_tokens": "output_tokens",
    "cache_read_tokens": "cache_read_tokens",
    "cache_creation_tokens": "cache_creation_tokens",
    "cost_usd": "cost_usd",
    "answerer_cost_usd": "answerer_cost_usd",
    "judge_cost_usd": "judge_cost_usd",
    "turns": "turns",
    "timed_out": "timed_out",
    "budget_exceeded": "budget_exceeded",
    "error_category": "error_category",
    "error_message": "error_message",
    "config_fingerprint": "config_fingerprint",
    "started_at": "started_at",
    "finished_at": "finished_at",
}
# The columns that hold text (agent output among them): escaped against formulas.
_TEXT_COLUMNS = ("variant", "task", "dataset_row_id", "host", "status", "budget_exceeded", "error_category",
                 "error_message", "config_fingerprint")  # fmt: skip
# The columns that hold floats: NaN and infinity leave as None (empty in CSV).
_FLOAT_COLUMNS = ("score", "duration_seconds", "cost_usd", "answerer_cost_usd", "judge_cost_usd")
# `label` is Trial.label (task[row]#replicate); `url` the trial page's path.
TRIAL_COLUMNS = [*_FIELDS, "label", "url"]
# Characters that make a spreadsheet read a cell as a formula.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _trial_url_template() -> str:
    """The trial page's path with {run} and {id} to fill (reverse() costs 10 µs a call)."""
    url = reverse("trial_detail", args=[987654321, 123456789])
    return url.replace("987654321", "{run}").replace("123456789", "{id}")


def trial_rows(trials, chunk_size: int = 2000) -> Iterator[dict[str, Any]]:
    """One flat dict per trial of the queryset, in its order, with the TRIAL_COLUMNS keys; a
    number that is not finite (a NaN cost PostgreSQL kept from before costs were checked) is
    None, as JSON needs."""
    url = _trial_url_template()
    for values in trials.values_list(*_FIELDS.values()).iterator(chunk_size=chunk_size):
        row = dict(zip(_FIELDS, values, strict=True))
        for column in _FLOAT_COLUMNS:
            value = row[column]
            if value is not None and not math.isfinite(value):
                row[column] = None
        suffix = f"[{row['dataset_row_id']}]" if row["dataset_row_id"] else ""
        row["label"] = f"{row['task']}{suffix}#{row['replicate']}"
        row["url"] = url.format(run=row["run"], id=row["id"])
        yield row


def run_counts(run) -> dict[str, int]:
    """A run's trials by outcome, as the API and the reports give them (the names of the
    comparison's per-arm counts: `stats.records`)."""
    return {
        "trials": run.n_trials,
        "done": run.n_done,
        "queued": run.n_queued,
        "running": run.n_running,
        "passed": run.n_passed,
        "failed": run.n_failed,
        "errors": run.n_error,
        "cancelled": run.n_cancelled,
    }


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


def trials_csv(trials, chunk_size: int = 2000) -> Iterator[str | bytes]:
    """The CSV of a trial queryset, in its order, with the TRIAL_COLUMNS header."""
    if connection.vendor == "postgresql":
        return _copied_csv(trials)
    return csv_lines(trial_rows(trials, chunk_size=chunk_size), TRIAL_COLUMNS)


class _Sql(Func):
    """A column of the COPY: `sql` with {0}, {1}, ... standing for the column expressions."""

    def __init__(self, sql: str, *expressions):
        super().__init__(*expressions, output_field=TextField())
        self.sql = sql

    def as_sql(self, compiler, connection, **extra_context):
        parts = []
        for expression in self.get_source_expressions():
            part, params = compiler.compile(expression)
            if params:
                raise ValueError("a COPY column reads columns only")
            parts.append(part)
        return self.sql.format(*parts), []


def _safe(sql: str) -> str:
    """csv_safe in SQL: a quote before a formula start; NULL for "" (written empty and
    unquoted, as Python writes it: COPY quotes an empty string)."""
    starts = ", ".join(f"chr({ord(c)})" for c in _FORMULA_STARTS)
    return f"NULLIF(CASE WHEN left({sql}, 1) IN ({starts}) THEN chr(39) || {sql} ELSE {sql} END, '')"


def _copy_columns() -> dict[str, Any]:
    """TRIAL_COLUMNS as SQL, each written as trial_rows + csv_lines write it."""

    def text(field: str) -> _Sql:
        return _Sql(_safe("{0}"), F(field))

    def moment(field: str) -> _Sql:  # str() of an aware UTC datetime
        return _Sql("to_char({0} AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US\"+00:00\"')", F(field))

    url = _trial_url_template().replace("'", "''").format(run="' || {0} || '", id="' || {1} || '")
    label = "({0} || CASE WHEN coalesce({1}, '') <> '' THEN '[' || {1} || ']' ELSE '' END || '#' || {2})"
    columns: dict[str, Any] = {name: F(field) for name, field in _FIELDS.items()}
    for name in _FLOAT_COLUMNS:  # as trial_rows: NaN and infinity empty
        columns[name] = _Sql(
            "CASE WHEN {0} IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8) THEN NULL "
            "ELSE {0} END",
            F(_FIELDS[name]),
        )
    for name in _TEXT_COLUMNS:
        columns[name] = text(_FIELDS[name])
    columns["started_at"], columns["finished_at"] = moment("started_at"), moment("finished_at")
    columns["timed_out"] = _Sql("CASE WHEN {0} THEN 'True' ELSE 'False' END", F("timed_out"))
    columns["label"] = _Sql(_safe(label), F("task_version__task__slug"), F("dataset_row_id"), F("replicate"))
    columns["url"] = _Sql(f"'{url}'", F("run_id"), F("pk"))
    return columns


def _copied_csv(trials, block_bytes: int = 65_536) -> Iterator[str | bytes]:
    names = [f"csv_{i}" for i in range(len(TRIAL_COLUMNS))]
    columns = _copy_columns()
    query = trials.annotate(
        **{name: columns[column] for name, column in zip(names, TRIAL_COLUMNS, strict=True)}
    )
    sql, params = query.values_list(*names).query.sql_with_params()
    yield ",".join(TRIAL_COLUMNS) + "\r\n"
    with (
        connection.cursor() as cursor,
        cursor.cursor.copy(f"COPY ({sql}) TO STDOUT WITH (FORMAT csv)", params) as copy,
    ):
        pending, size = [], 0
        for block in copy:
            pending.append(bytes(block))
            size += len(block)
            if size >= block_bytes:
                yield b"".join(pending)
                pending, size = [], 0
        yield b"".join(pending)


async def pulled(chunks: Iterable[str | bytes]) -> AsyncIterator[str | bytes]:
    """A download for an ASGI server, a chunk at a time: given a sync iterator, Django's
    StreamingHttpResponse reads it to the end into memory before it sends a byte."""
    iterator = iter(chunks)
    step = sync_to_async(next, thread_sensitive=True)
    while (chunk := await step(iterator, None)) is not None:
        yield chunk


def json_array(rows: Iterable[dict[str, Any]]) -> Iterator[str]:
    """A JSON array, one element per line (dates as ISO 8601)."""
    yield "["
    for i, row in enumerate(rows):
        yield ("," if i else "") + "\n" + json.dumps(row, cls=DjangoJSONEncoder)
    yield "\n]\n"
