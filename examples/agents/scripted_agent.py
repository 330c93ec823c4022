#!/usr/bin/env python3
"""A deterministic "mediocre agent" for the evalsite demo: no model, no network, stdlib only.

The `scripted` variant of examples/experiments/demo.yaml runs it as a `command` agent inside the
trial's workspace (the current directory), with the task prompt on stdin. It recognises the task
from the EVALSITE_TASK_ID environment variable ("unit-convert" or "unit-convert/km-mi"), or, when
that is unset, from a phrase in the prompt. Then it:

- solves some tasks (it knows their fixes and writes the files),
- gets others wrong (a plausible but incomplete change),
- and gives up on the rest without touching anything,

so a demo run shows a variant that sits between `no-op` and `reference`, and does so the same way
every time.

It reports what it does as JSON lines on stdout, one event per line:

    {"type": "message", "text": "..."}
    {"type": "tool_call", "name": "Bash", "input": {"command": "..."}, "status": "success"}
    {"type": "usage", "input_tokens": N, "output_tokens": M, "cost_usd": X}

Each usage event covers one turn; the runner adds them up. Token counts are made up from the prompt
length and the number of actions, priced like a mid-size model, so budgets and cost charts have
something to show.
"""

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

USD_PER_INPUT_TOKEN = 3e-6
USD_PER_OUTPUT_TOKEN = 15e-6


class Session:
    """The workspace plus the event stream; every action is reported as it happens."""

    def __init__(self, prompt: str):
        self.prompt = prompt
        self.turns = 0

    def emit(self, event: dict) -> None:
        print(json.dumps(event), flush=True)

    def say(self, text: str) -> None:
        self.emit({"type": "message", "text": text})

    def turn(self, output_tokens: int) -> None:
        """Report the usage of one model turn (the whole prompt is re-read every turn)."""
        self.turns += 1
        input_tokens = 400 + len(self.prompt) // 4 + 150 * self.turns
        cost = input_tokens * USD_PER_INPUT_TOKEN + output_tokens * USD_PER_OUTPUT_TOKEN
        self.emit(
            {
                "type": "usage",
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "cost_usd": round(cost, 6),
            }
        )

    def read(self, path: str) -> str:
        self.emit({"type": "tool_call", "name": "Read", "input": {"file_path": path}})
        self.turn(40)
        return Path(path).read_text(encoding="utf-8")

    def write(self, path: str, content: str) -> None:
        self.emit({"type": "tool_call", "name": "Write", "input": {"file_path": path}})
        Path(path).write_text(content, encoding="utf-8")
        self.turn(60 + len(content) // 4)

    def edit(self, path: str, old: str, new: str) -> None:
        edit_input = {"file_path": path, "old_string": old, "new_string": new}
        self.emit({"type": "tool_call", "name": "Edit", "input": edit_input})
        text = Path(path).read_text(encoding="utf-8")
        if old not in text:
            self.say(f"Could not find the text to replace in {path}; leaving it as it is.")
            return
        Path(path).write_text(text.replace(old, new, 1), encoding="utf-8")
        self.turn(60 + len(new) // 4)

    def bash(self, command: list[str]) -> int:
        """Run a command the way an agent's Bash tool would, bounded in time."""
        shown = " ".join(command)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
            status = done.returncode
        except (OSError, subprocess.TimeoutExpired) as error:
            self.say(f"Command failed to run: {error}")
            status = -1
        outcome = "success" if status == 0 else "error"
        self.emit({"type": "tool_call", "name": "Bash", "input": {"command": shown}, "status": outcome})
        self.turn(30)
        self.say(f"`{shown}` exited with status {status}.")
        return status


RUN_TESTS = ["python3", "-m", "unittest", "discover", "-s", "tests"]


def solve_fix_mean(s: Session) -> None:
    s.read("stats.py")
    s.edit(
        "stats.py",
        "    total = 0\n    for value in values:\n        total += value\n"
        "    return total / (len(values) - 1)\n",
        "    total = 0\n    count = 0\n    for value in values:\n        total += value\n        count += 1\n"
        '    if not count:\n        raise ValueError("mean() of empty data")\n    return total / count\n',
    )
    s.bash(RUN_TESTS)
    s.say("mean() now divides by the number of values, raises on empty input and accepts generators.")


def solve_paginate(s: Session) -> None:
    s.read("pager.py")
    s.edit("pager.py", "return total_items // per_page", "return -(-total_items // per_page)")
    s.edit("pager.py", "start = page * per_page", "start = (page - 1) * per_page")
    s.bash(RUN_TESTS)
    s.say("Pages now start at item 0 and the page count rounds up.")


def solve_csv_totals(s: Session) -> None:
    s.read("totals.py")
    s.write(
        "totals.py",
        '"""Expense totals from the finance CSV export."""\n\n'
        "import csv\n\n\n"
        "def totals_by(path, key, value):\n"
        '    """Sum the numeric column `value`, grouped by column `key`, in the CSV file at `path`."""\n'
        "    totals = {}\n"
        '    with open(path, newline="", encoding="utf-8") as f:\n'
        "        for row in csv.DictReader(f):\n"
        "            if row.get(key):\n"
        "                totals[row[key]] = totals.get(row[key], 0) + float(row[value])\n"
        "    return totals\n",
    )
    s.bash(RUN_TESTS)
    s.say("totals_by() now reads the file with csv.DictReader and skips blank lines.")


WORDCOUNT = '''"""Count words in a text file.

Usage: python3 wordcount.py FILE [--top N] [--ignore-case]
"""

import argparse
import re
from collections import Counter

WORD = re.compile(r"[A-Za-z']+")


def count_words(text):
    return Counter(WORD.findall(text))


def positive(value):
    if not value.isdigit() or int(value) == 0:
        raise argparse.ArgumentTypeError("expected a positive integer")
    return int(value)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Count words in a text file.")
    parser.add_argument("file", help="text file to read")
    parser.add_argument("--top", type=positive, help="print only the N most frequent words")
    parser.add_argument("--ignore-case", action="store_true", help="count case-insensitively")
    args = parser.parse_args(argv)
    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    counts = count_words(text.lower() if args.ignore_case else text)
    rows = sorted(counts.items())
    if args.top:
        rows = sorted(rows, key=lambda row: row[1], reverse=True)[: args.top]
    for word, n in rows:
        print(f"{word} {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
'''


def solve_wordcount(s: Session) -> None:
    s.read("wordcount.py")
    s.write("wordcount.py", WORDCOUNT)
    s.bash(["python3", "wordcount.py", "sample.txt", "--top", "3", "--ignore-case"])
    s.say("Added --top N and --ignore-case.")


LRU = '''"""A small least-recently-used cache for API responses."""

from collections import OrderedDict


class LRUCache:
    """Fixed-capacity mapping that evicts the least recently used key."""

    def __init__(self, capacity: int):
        if type(capacity) is not int:
            raise TypeError("capacity must be an int")
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.evictions = 0
        self._items = OrderedDict()

    def get(self, key, default=None):
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        return default

    def put(self, key, value):
        if key in self._items:
            self._items.move_to_end(key)
        self._items[key] = value
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)
            self.evictions += 1

    def keys(self):
        return list(self._items.keys())

    def __len__(self):
        return len(self._items)

    def __contains__(self, key):
        return key in self._items
'''


def solve_lru(s: Session) -> None:
    s.read("lru.py")
    s.write("lru.py", LRU)
    s.bash(RUN_TESTS)
    s.say("Implemented LRUCache on top of OrderedDict.")


def attempt_slugify(s: Session) -> None:
    """A plausible first draft that forgets accents, punctuation runs and word-boundary cuts."""
    s.read("slug.py")
    s.edit(
        "slug.py",
        "    raise NotImplementedError\n",
        '    slug = "-".join(text.lower().split())\n    return slug[:max_length] or "untitled"\n',
    )
    s.say("slugify() lowercases the title and joins the words with hyphens.")


def attempt_inventory(s: Session) -> None:
    """Fixes two of the four bugs, then stops without noticing the rest."""
    s.read("inventory.py")
    s.bash(RUN_TESTS)
    s.edit(
        "inventory.py",
        "        self._stock[sku] = self._stock.get(sku, 0) + qty\n        return self._stock[sku]\n",
        "        key = self._key(sku)\n        self._stock[key] = self._stock.get(key, 0) + qty\n"
        "        return self._stock[key]\n",
    )
    s.edit("inventory.py", "if qty >= have:", "if qty > have:")
    s.say("Fixed SKU normalisation in add() and the off-by-one in remove().")


# The conversions this agent knows; temperatures and volumes are beyond it.
KNOWN_CONVERSIONS = {
    ("km", "mi"): "value / 1.609344",
    ("mi", "km"): "value * 1.609344",
    ("kg", "lb"): "value / 0.45359237",
    ("lb", "kg"): "value * 0.45359237",
}


def attempt_unit_convert(s: Session) -> None:
    pairs = [pair for pair in KNOWN_CONVERSIONS if f'"{pair[0]}", "{pair[1]}"' in s.prompt]
    if not pairs:
        s.say("I do not know that conversion, so I left units.py unchanged.")
        return
    src, dst = pairs[0]
    s.read("units.py")
    anchor = '    ("cm", "m"): lambda value: value / 100,\n'
    added = f'    ("{src}", "{dst}"): lambda value: {KNOWN_CONVERSIONS[src, dst]},\n'
    s.edit("units.py", anchor, anchor + added)
    s.bash(["python3", "-c", f'from units import convert; print(convert(1, "{src}", "{dst}"))'])
    s.say(f"Added the {src} -> {dst} conversion.")


SOLVERS: dict[str, Callable[[Session], None]] = {
    "fix-mean": solve_fix_mean,
    "paginate-off-by-one": solve_paginate,
    "csv-totals-quoting": solve_csv_totals,
    "wordcount-top-flag": solve_wordcount,
    "lru-cache": solve_lru,
    "slugify": attempt_slugify,
    "inventory-failing-tests": attempt_inventory,
    "unit-convert": attempt_unit_convert,
}

# Used only when EVALSITE_TASK_ID is not set: a phrase that appears in the task's prompt.
PROMPT_MARKERS = {
    "fix-mean": "`mean()` in stats.py",
    "paginate-off-by-one": "pager.py",
    "csv-totals-quoting": "totals_by(",
    "wordcount-top-flag": "wordcount.py",
    "lru-cache": "`LRUCache`",
    "slugify": "`slugify(",
    "inventory-failing-tests": "inventory module",
    "unit-convert": "units.py can only convert",
}


def identify_task(prompt: str) -> str | None:
    task_id = os.environ.get("EVALSITE_TASK_ID", "").strip()
    if task_id:
        # Dataset rows arrive as "<task_id>/<row_id>".
        return task_id.split("/", 1)[0]
    for candidate, marker in PROMPT_MARKERS.items():
        if marker in prompt:
            return candidate
    return None


def main() -> int:
    prompt = sys.stdin.read()
    session = Session(prompt)
    session.turn(25)
    task_id = identify_task(prompt)
    solver = SOLVERS.get(task_id or "")
    if solver is None:
        session.say(f"I don't know how to do task {task_id or '(unknown)'}; giving up without changes.")
        return 0
    session.say(f"Working on {task_id}.")
    solver(session)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
