"""Count words in a text file.

Usage: python3 wordcount.py FILE
"""

import argparse
import re
from collections import Counter

WORD = re.compile(r"[A-Za-z']+")


def count_words(text):
    return Counter(WORD.findall(text))


def main(argv=None):
    parser = argparse.ArgumentParser(description="Count words in a text file.")
    parser.add_argument("file", help="text file to read")
    args = parser.parse_args(argv)
    with open(args.file, encoding="utf-8") as f:
        counts = count_words(f.read())
    for word, n in sorted(counts.items()):
        print(f"{word} {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
