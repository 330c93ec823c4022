"""Time `import_tasks` on 1,000 generated task files (target: under 10 s).

Usage: .venv/bin/python bench/import_tasks.py [N]
Uses a throwaway SQLite database unless DATABASE_URL is set (then it must be a scratch database).
"""

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TASK_YAML = """task_id: gen-{i:04d}
description: Generated task {i}
initial_prompt: Make add() in calc.py return the sum (variant {i}).
tags: [generated, "bucket:{bucket}"]
sandbox:
  driver: tempdir
  python: null
  template_sources:
    - type: template_dir
      path: template
run_limits:
  max_turns: 10
  task_timeout: 120
success_criteria:
  - type: run_command
    command: "python3 -c 'import calc; assert calc.add(2, {i}) == {i} + 2'"
    timeout: 10
  - type: file_matches_regex
    path: calc.py
    pattern: "def add\\\\(a, b\\\\):"
"""


def generate(folder: Path, n: int) -> None:
    for i in range(n):
        task_dir = folder / f"gen-{i:04d}"
        (task_dir / "template").mkdir(parents=True)
        (task_dir / "task.yaml").write_text(TASK_YAML.format(i=i, bucket=i % 10))
        (task_dir / "template" / "calc.py").write_text(f"def add(a, b):\n    return a - b  # {i}\n")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    with tempfile.TemporaryDirectory(prefix="evalsite-bench-") as tmp:
        tmp_path = Path(tmp)
        if not os.environ.get("DATABASE_URL"):
            os.environ["SQLITE_PATH"] = str(tmp_path / "bench.sqlite3")
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")
        import django

        django.setup()
        from django.core.management import call_command

        from experiments_app.definitions import import_tasks
        from experiments_app.models import Task

        call_command("migrate", verbosity=0)
        suite = tmp_path / "suite"
        generate(suite, n)

        started = time.perf_counter()
        report = import_tasks([suite], task_set="bench")
        first = time.perf_counter() - started

        started = time.perf_counter()
        again = import_tasks([suite])
        second = time.perf_counter() - started

        assert len(report.created) == n and len(again.unchanged) == n, "import did not store every task"
        assert Task.objects.count() >= n
        backend = "PostgreSQL" if os.environ.get("DATABASE_URL") else "SQLite"
        print(
            f"import_tasks, {n} task files ({backend}): first import {first:.2f} s, "
            f"unchanged re-import {second:.2f} s (target: < 10 s)"
        )


if __name__ == "__main__":
    main()
