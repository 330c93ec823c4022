"""Writes of every trial's hot path, as SQL written out instead of composed by the ORM.

Composing an UPDATE or a bulk INSERT cost the ORM 0.3-1 ms of CPU each, many times a trial: a
trivial trial's CPU was mostly the ORM's. Values are still adapted by the models' own fields
(datetimes, JSON), so what is stored is what `Model.objects.update()` would store.
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
