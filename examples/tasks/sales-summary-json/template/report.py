"""Print a sales summary of data/orders.csv.

Usage: python3 report.py [--orders PATH]
"""

import argparse
import csv
from collections import defaultdict


def load_orders(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", default="data/orders.csv")
    args = parser.parse_args(argv)
    revenue = defaultdict(float)
    for order in load_orders(args.orders):
        revenue[order["region"]] += int(order["quantity"]) * float(order["unit_price"])
    for region, amount in sorted(revenue.items()):
        print(f"{region:<8} {amount:>10.2f} EUR")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
