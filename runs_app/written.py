"""Statements of every trial's hot path, as SQL written out instead of composed by the ORM.

Composing an UPDATE, a bulk INSERT or a SELECT cost the ORM 0.3-1 ms of CPU each, many times a
trial: a trivial trial's CPU was mostly the ORM's. Values are still adapted and converted by the
models' own fields (datetimes, JSON), so what is stored and read is what the ORM would store
and read.
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.db import connection, models

from runs_app.models import Run, Trial, UnitTally

# SQLite's limit on a statement's parameters is 32,766; PostgreSQL's 65,535.
_ROWS_PER_INSERT = 500


def update(model: type[models.Model], values: Mapping[str, Any], where: str, params: Sequence[Any]) -> int:
    """UPDATE `model`'s table SET `values` WHERE `where` (with `params`); returns the rows changed."""
    fields = [model._meta.get_field(name) for name in values]
    assignments = ", ".join(f"{connection.ops.quote_name(field.column)} = %s" for field in fields)
    adapted = [field.get_db_prep_save(values[field.name], connection) for field in fields]
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {model._meta.db_table} SET {assignments} WHERE {where}", [*adapted, *params])
        return cursor.rowcount


def fetch(
    model: type[models.Model],
    where: str,
    params: Sequence[Any],
    names: Sequence[str] | None = None,
    lock: bool = False,
) -> list[models.Model]:
    """SELECT `model` rows WHERE `where` (with `params`), as instances the ORM would make: with
    `names` only (the other fields deferred: read on access) or every field. `lock` reads
    them FOR UPDATE where the database has row locks (SQLite's IMMEDIATE transactions lock
    the whole database already)."""
    select, attnames, converters = _select(model, tuple(names) if names is not None else None)
    sql = f"{select} WHERE {where}"
    if lock and connection.features.has_select_for_update:
        sql += " FOR UPDATE"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    instances = []
    for row in rows:
        values = list(row)
        for index, column, found in converters:
            for convert in found:
                values[index] = convert(values[index], column, connection)
        instances.append(model.from_db(connection.alias, attnames, values))
    return instances


_SELECTS: dict[tuple, tuple] = {}


def _select(model: type[models.Model], names: tuple[str, ...] | None) -> tuple[str, list[str], list]:
    """The SELECT … FROM of `fetch`, the attribute names it reads and the fields' converters,
    made once per model, fields and database (making them cost more than the query)."""
    key = (model, names, connection.alias)
    if key not in _SELECTS:
        fields = list(model._meta.concrete_fields)
        if names is not None:
            fields = [field for field in fields if field.name in names or field.attname in names]
        table = model._meta.db_table
        columns = ", ".join(connection.ops.quote_name(field.column) for field in fields)
        converters = []
        for index, field in enumerate(fields):
            column = field.get_col(table)
            found = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
            if found:
                converters.append((index, column, found))
        _SELECTS[key] = (f"SELECT {columns} FROM {table}", [field.attname for field in fields], converters)
    return _SELECTS[key]


def insert(model: type[models.Model], objects: Iterable[models.Model], names: Sequence[str]) -> None:
    """INSERT `objects`' `names` fields, a few hundred rows a statement (no ids read back)."""
    fields = [model._meta.get_field(name) for name in names]
    columns = ", ".join(connection.ops.quote_name(field.column) for field in fields)
    rows = [
        [field.get_db_prep_save(getattr(obj, field.attname), connection) for field in fields]
        for obj in objects
    ]
    placeholder = f"({', '.join(['%s'] * len(fields))})"
    with connection.cursor() as cursor:
        for start in range(0, len(rows), _ROWS_PER_INSERT):
            batch = rows[start : start + _ROWS_PER_INSERT]
            values = ", ".join([placeholder] * len(batch))
            cursor.execute(
                f"INSERT INTO {model._meta.db_table} ({columns}) VALUES {values}",
                [value for row in batch for value in row],
            )


# ---------------------------------------------------------------------------------------------
# The hot path's own statements: a trial's claim, its slot, its unit's tally, its run's counts.
# Table and column names come from the models (`_meta`), never typed by hand.


def _table(model: type[models.Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def claimable() -> str:
    """The WHERE of a trial's claim (an UPDATE of the trial; params: the trial's id, the queued
    status, the worker's code version, the ready suite status, the worker's host). As the ORM
    version was: not cancelled; the run's code version, or any (a message that reached a worker
    of another code version is left for a worker of the run's own version); a run with suite
    hooks only once its suite is up, and only on its host."""
    return f"""
        id = %s AND status = %s AND run_id IN (
            SELECT id FROM {_table(Run)}
            WHERE NOT cancel_requested
              AND (any_code_version OR code_version IN ('', %s))
              AND (suite_status = '' OR (suite_status = %s AND suite_host = %s))
        )"""


def count_claimed(trial_id: int) -> None:
    """One more running trial on the claimed trial's run, one fewer queued."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""UPDATE {_table(Run)}
            SET n_running = n_running + 1, n_queued = CASE WHEN n_queued > 0 THEN n_queued - 1 ELSE 0 END
            WHERE id = (SELECT run_id FROM {_table(Trial)} WHERE id = %s)""",
            [trial_id],
        )


def count_given_back(trial_id: int) -> None:
    """One fewer running trial on the run of a trial given back to the queue, one more queued."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""UPDATE {_table(Run)}
            SET n_queued = n_queued + 1, n_running = CASE WHEN n_running > 0 THEN n_running - 1 ELSE 0 END
            WHERE id = (SELECT run_id FROM {_table(Trial)} WHERE id = %s)""",
            [trial_id],
        )


def trials_holding_a_slot(run_id: int) -> int:
    """The run's current attempts (`is_latest IN (true)`, see TrialQuerySet.current) that hold a
    slot: running, or queued and already sent to a worker."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""SELECT COUNT(*) FROM {_table(Trial)}
            WHERE run_id = %s AND is_latest IN (%s)
              AND (status = %s OR (status = %s AND dispatched_at IS NOT NULL))""",
            [run_id, True, Trial.Status.RUNNING, Trial.Status.QUEUED],
        )
        return cursor.fetchone()[0]


def next_to_send(run_id: int, limit: int) -> list[int]:
    """The run's current queued attempts not sent yet, in order (replicate, then id)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""SELECT id FROM {_table(Trial)}
            WHERE run_id = %s AND is_latest IN (%s) AND status = %s AND dispatched_at IS NULL
            ORDER BY replicate, id LIMIT %s""",
            [run_id, True, Trial.Status.QUEUED, limit],
        )
        return [row[0] for row in cursor.fetchall()]


def running_trials(run_id: int) -> int:
    """The run's current attempts that are running."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT COUNT(*) FROM {_table(Trial)} WHERE run_id = %s AND is_latest IN (%s) AND status = %s",
            [run_id, True, Trial.Status.RUNNING],
        )
        return cursor.fetchone()[0]


def unit_tally(
    run_id: int, variant_id: int, task_version_id: int, dataset_row_id: str
) -> tuple[int, dict] | None:
    """The id and criterion counts of a unit's tally row, if it has one."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""SELECT id, criteria FROM {_table(UnitTally)}
            WHERE run_id = %s AND variant_id = %s AND task_version_id = %s AND dataset_row_id = %s""",
            [run_id, variant_id, task_version_id, dataset_row_id],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return row[0], UnitTally._meta.get_field("criteria").from_db_value(row[1], None, connection)


def add_to_tally(tally_id: int, share: Mapping[str, float], criteria: dict) -> None:
    """Add `share` to a tally row's counters (columns named as the fields) and set its criterion
    counts."""
    columns = [UnitTally._meta.get_field(name).column for name in share]
    added = ", ".join(
        f"{connection.ops.quote_name(c)} = {connection.ops.quote_name(c)} + %s" for c in columns
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_table(UnitTally)} SET {added}, criteria = %s WHERE id = %s",
            [
                *share.values(),
                UnitTally._meta.get_field("criteria").get_db_prep_save(criteria, connection),
                tally_id,
            ],
        )
