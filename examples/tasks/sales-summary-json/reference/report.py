"""Print a sales summary of data/orders.csv, or write it as JSON with --json PATH.

Usage: python3 report.py [--orders PATH] [--json PATH]
"""

import argparse
import csv
import json
from collections import Counter, defaultdict


def load_orders(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def order_value(order):
    return int(order["quantity"]) * float(order["unit_price"])


def build_summary(orders):
    """The JSON summary; only paid orders count."""
    paid = [order for order in orders if order["status"] == "paid"]
    counts = Counter(order["region"] for order in paid)
    revenue = defaultdict(float)
    by_customer = defaultdict(float)
    for order in paid:
        revenue[order["region"]] += order_value(order)
        by_customer[order["customer"]] += order_value(order)
    regions = [
        {"region": region, "orders": counts[region], "revenue": round(revenue[region], 2)}
        for region in sorted(revenue, key=lambda name: -revenue[name])
    ]
    return {
        "currency": "EUR",
        "order_count": len(paid),
        "revenue": round(sum(revenue.values()), 2),
        "regions": regions,
        "top_customer": max(by_customer, key=lambda name: by_customer[name]),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", default="data/orders.csv")
    parser.add_argument("--json", metavar="PATH", help="write the JSON summary to PATH")
    args = parser.parse_args(argv)
    orders = load_orders(args.orders)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(build_summary(orders), f, indent=2)
            f.write("\n")
        return 0
    revenue = defaultdict(float)
    for order in orders:
        revenue[order["region"]] += order_value(order)
    for region, amount in sorted(revenue.items()):
        print(f"{region:<8} {amount:>10.2f} EUR")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
