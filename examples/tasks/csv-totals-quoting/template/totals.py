"""Expense totals from the finance CSV export."""


def totals_by(path, key, value):
    """Sum the numeric column `value`, grouped by column `key`, in the CSV file at `path`."""
    totals = {}
    with open(path, encoding="utf-8") as f:
        header = f.readline().strip().split(",")
        k, v = header.index(key), header.index(value)
        for line in f:
            fields = line.strip().split(",")
            totals[fields[k]] = totals.get(fields[k], 0) + float(fields[v])
    return totals
