"""Count words in a text file.

Usage: python3 wordcount.py FILE [--top N] [--ignore-case]
"""

import argparse
import re
from collections import Counter

WORD = re.compile(r"[A-Za-z']+")


def count_words(text, ignore_case=False):
    if ignore_case:
        text = text.lower()
    return Counter(WORD.findall(text))


def positive_int(value):
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return number


def main(argv=None):
    parser = argparse.ArgumentParser(description="Count words in a text file.")
    parser.add_argument("file", help="text file to read")
    parser.add_argument("--top", type=positive_int, metavar="N", help="only print the N most frequent words")
    parser.add_argument("--ignore-case", action="store_true", help="count words case-insensitively")
    args = parser.parse_args(argv)
    with open(args.file, encoding="utf-8") as f:
        counts = count_words(f.read(), ignore_case=args.ignore_case)
    if args.top:
        # Most frequent first; ties in alphabetical order.
        rows = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[: args.top]
    else:
        rows = sorted(counts.items())
    for word, n in rows:
        print(f"{word} {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
