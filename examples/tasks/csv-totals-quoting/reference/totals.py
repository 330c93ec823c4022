"""Expense totals from the finance CSV export."""

import csv


def totals_by(path, key, value):
    """Sum the numeric column `value`, grouped by column `key`, in the CSV file at `path`."""
    totals = {}
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if not row.get(key):  # blank line at the end of the export
                continue
            totals[row[key]] = totals.get(row[key], 0) + float(row[value])
    return totals
