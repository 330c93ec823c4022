"""Statements of every trial's hot path, as SQL written out instead of composed by the ORM.

Composing an UPDATE, a bulk INSERT or a SELECT cost the ORM 0.3-1 ms of CPU each, many times a
trial: a trivial trial's CPU was mostly the ORM's. Values are still adapted and converted by the
models' own fields (datetimes, JSON), so what is stored and read is what the ORM would store
and read.
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.db import connection, models

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
