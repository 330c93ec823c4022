"""Parity with coder-eval 0.12.16: both tools read the same corpus of coder-eval-format tasks.

Usage: .venv/bin/python bench/coder_eval_parity.py [--coder-eval PATH] [--only NAME ...]
       [--no-run] [--record]

Corpus: experiments_app/tests/corpus/coder_eval/ (every top-level *.yaml and every */task.yaml;
its README.md says what each one exercises). For each file:

1. coder-eval's verdict: `coder-eval plan FILE` (exit code, first error line; a variant's
   "resolution failed" counts as refused, since `run` would refuse it). A file it accepts whose
   agent is `type: none` is then run, `coder-eval run FILE --run-dir DIR`, and its outcomes are
   read from DIR/**/task.json (final_status, weighted_score; one per dataset row). A run that
   refuses the file before any task starts (dataset expansion) counts as refused, at "run".
2. evalsite's verdict: `import_tasks` then the launch checks (`preview_trials`), both rolled
   back, as `evalrun FILE --plan` does. The agentless files it accepts run through a real
   Celery worker (2 pool processes) started here, in one run of the ad-hoc experiment.
3. Each file is `agree`, `documented` (the tools differ and expected.json names the entry of
   docs/coder-eval.md that says why) or `MISMATCH` (an undocumented difference, including those
   recorded as "UNDOCUMENTED: ..."). Outcomes agree when the statuses match (coder-eval's mapped
   as `manage.py import_coder_eval_run` maps them) and, for graded trials, the scores do.

Exit codes: 0 no mismatch, 1 a mismatch, 2 coder-eval not found.
--no-run compares verdicts only (about a minute). --record rewrites expected.json from this
run's results, keeping each file's `difference` (review the diff before committing it).

A scratch SQLite database and broker folder are used unless DATABASE_URL / CELERY_BROKER_URL
are set (then they must be scratch ones); trials run under SANDBOX_ROOT, as a worker's always
do. Nothing leaves the machine but the corpus's `env_packages` installs (from the package
registries); every command has a time limit. About three minutes on 2 cores.
"""

import argparse
import glob
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CORPUS = ROOT / "experiments_app" / "tests" / "corpus" / "coder_eval"
EXPECTED = CORPUS / "expected.json"
DOCS = ROOT / "docs" / "coder-eval.md"
PLAN_TIMEOUT = 120
RUN_TIMEOUT = 600  # one coder-eval run (env_packages installs included)
EVALSITE_TIMEOUT = 900  # the whole evalsite run
ERROR_CHARS = 300
UNDOCUMENTED = "UNDOCUMENTED"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coder-eval", type=Path, help="the coder-eval executable (default: on PATH)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these corpus files")
    parser.add_argument("--no-run", action="store_true", help="compare verdicts only")
    parser.add_argument("--record", action="store_true", help="rewrite expected.json from this run")
    return parser.parse_args()


def corpus_files(only: list[str] | None) -> list[str]:
    names = sorted(str(p.relative_to(CORPUS)) for p in [*CORPUS.glob("*.yaml"), *CORPUS.glob("*/task.yaml")])
    if only:
        missing = sorted(set(only) - set(names))
        if missing:
            sys.exit(f"not in the corpus: {', '.join(missing)}")
        names = [n for n in names if n in only]
    return names


def agentless(name: str) -> bool:
    """Whether the file's own agent is coder-eval's `none` kind (the only ones run here)."""
    data = yaml.safe_load((CORPUS / name).read_text())
    return (
        isinstance(data, dict) and isinstance(data.get("agent"), dict) and data["agent"].get("type") == "none"
    )


def shown(text: str) -> str:
    """An error line without this machine's paths, cut to a readable length."""
    text = " ".join(text.replace(str(CORPUS) + "/", "").split())
    return text[:ERROR_CHARS]


# --- coder-eval ------------------------------------------------------------------------------


def coder_eval_env(home: Path) -> dict[str, str]:
    # Telemetry off, a scratch HOME, and wide lines so error messages are not wrapped.
    return {**os.environ, "TELEMETRY_ENABLED": "false", "HOME": str(home), "COLUMNS": "400", "NO_COLOR": "1"}


def coder_eval_plan(exe: Path, name: str, scratch: Path) -> dict:
    """coder-eval's load verdict: exit code and the first error it printed."""
    try:
        done = subprocess.run(
            [str(exe), "plan", str(CORPUS / name)], cwd=scratch, env=coder_eval_env(scratch / "home"),
            capture_output=True, text=True, timeout=PLAN_TIMEOUT,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"verdict": "refused", "stage": "plan", "exit_code": None, "error": "plan timed out"}
    lines = (done.stdout + done.stderr).splitlines()
    error = ""
    for i, line in enumerate(lines):
        if "Error:" in line or "early-stop config error" in line or "resolution failed" in line:
            # A pydantic error names the field on the next lines.
            error = shown(" ".join(lines[i : i + 3]).split("Error:", 1)[-1])
            break
    refused = done.returncode != 0 or "resolution failed" in done.stdout
    return {
        "verdict": "refused" if refused else "accepted",
        "stage": "plan" if refused else "",
        "exit_code": done.returncode,
        "error": error,
    }


def coder_eval_run(exe: Path, name: str, scratch: Path) -> tuple[str | None, list[dict]]:
    """(why the run refused the file, or None; the outcomes of its tasks)."""
    run_dir = scratch / "runs" / name.replace("/", "_")
    try:
        done = subprocess.run(
            [str(exe), "run", str(CORPUS / name), "--run-dir", str(run_dir), "--preservation-mode", "NONE"],
            cwd=scratch, env=coder_eval_env(scratch / "home"), capture_output=True, text=True,
            timeout=RUN_TIMEOUT,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"run timed out after {RUN_TIMEOUT} s", []
    outcomes = []
    for path in sorted(glob.glob(str(run_dir / "**" / "task.json"), recursive=True)):
        data = json.loads(Path(path).read_text())
        outcomes.append(
            _ce_outcome(
                data["task_id"], data["final_status"], data.get("weighted_score"), data.get("error_message")
            )
        )
    if not outcomes and (run_dir / "run.json").exists():
        # A task that errors before its sandbox exists (e.g. no docker) has no task.json.
        summary = json.loads((run_dir / "run.json").read_text())
        for task in summary.get("task_results") or []:
            outcomes.append(
                _ce_outcome(
                    task["task_id"], task["status"], task.get("weighted_score"), task.get("error_message")
                )
            )
    if outcomes:
        return None, outcomes
    log = (done.stdout + done.stderr).splitlines()
    why = next((line.split("—", 1)[-1] for line in log if "Skipping task file" in line), "")
    why = why or next((line for line in reversed(log) if re.match(r"^\w+(Error|Exception)\b", line)), "")
    return shown(why or f"no task ran (exit {done.returncode})"), []


def _ce_outcome(task_id: str, status: str, score: float | None, error: str | None) -> dict:
    row = task_id.split("/", 1)[1] if "/" in task_id else None
    return {"row": row, "status": status, "score": score, **({"error": shown(error)} if error else {})}


# --- evalsite --------------------------------------------------------------------------------


def evalsite_verdict(name: str) -> tuple[dict, list[str]]:
    """evalsite's verdict (what `evalrun FILE --plan` decides) and the task slugs, rolled back."""
    from django.db import transaction

    from experiments_app.definitions import ImportFailed, adhoc_experiment, import_tasks
    from runs_app.launching import LaunchError, LaunchOptions, preview_trials

    with transaction.atomic():
        try:
            report = import_tasks([CORPUS / name])
        except ImportFailed as exc:
            return {"verdict": "refused", "stage": "import", "error": shown(exc.issues[0])}, []
        try:
            preview_trials(adhoc_experiment(None, None), LaunchOptions(task_slugs=report.task_slugs))
            verdict = {"verdict": "accepted", "stage": "", "error": ""}
        except LaunchError as exc:
            verdict = {"verdict": "refused", "stage": "launch", "error": shown(exc.problems[0])}
        transaction.set_rollback(True)
    return verdict, report.task_slugs


def evalsite_outcomes(names: list[str], scratch: Path) -> dict[str, list[dict]]:
    """Import `names` for real and run them in one run through a worker started here."""
    from evalsite.celery import app
    from experiments_app.definitions import adhoc_experiment, import_tasks
    from runs_app.launching import LaunchOptions, launch_run
    from runs_app.models import Run, Trial

    slug_file = {}
    for name in names:
        for slug in import_tasks([CORPUS / name]).task_slugs:
            slug_file[slug] = name
    app.control.purge()
    log_path = scratch / "worker.log"
    with log_path.open("w") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "evalsite", "worker", "-c", "2", "--loglevel=WARNING",
             "--without-gossip", "--without-mingle", "-n", "parity@%h"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        options = LaunchOptions(task_slugs=sorted(slug_file), max_parallel=2)
        run = launch_run(adhoc_experiment(None, None), options=options)
        deadline = time.monotonic() + EVALSITE_TIMEOUT
        while not Run.objects.get(pk=run.pk).is_final:
            if time.monotonic() > deadline:
                sys.exit(f"evalsite's run did not finish in {EVALSITE_TIMEOUT} s: see {log_path}")
            time.sleep(0.2)
    finally:
        os.killpg(worker.pid, 9)
        worker.wait()
    results: dict[str, list[dict]] = {name: [] for name in names}
    trials = Trial.objects.for_run(run).current().select_related("task_version__task")
    for trial in trials.order_by("task_version__task__slug", "dataset_row_id"):
        results[slug_file[trial.task_version.task.slug]].append(
            {"row": trial.dataset_row_id or None, "status": trial.status, "score": trial.score}
            | ({"error": shown(trial.error_message)} if trial.error_message else {})
        )
    return results


# --- comparing -------------------------------------------------------------------------------


def outcomes_agree(ce: list[dict], es: list[dict]) -> bool:
    from runs_app.importers.coder_eval import STATUSES

    if len(ce) != len(es):
        return False
    for a, b in zip(sorted(ce, key=_row), sorted(es, key=_row), strict=True):
        status = STATUSES.get(a["status"], ("?", ""))[0]
        if a["row"] != b["row"] or status != b["status"]:
            return False
        # An error has no grade: coder-eval writes 0.0, evalsite leaves it empty.
        if status != "error" and round(a["score"] or 0.0, 6) != round(b["score"] or 0.0, 6):
            return False
    return True


def _row(outcome: dict) -> str:
    return outcome["row"] or ""


def documented(difference: str | None, docs: str) -> bool:
    """Whether `difference` quotes docs/coder-eval.md (whitespace and line breaks aside)."""
    if not difference or difference.startswith(UNDOCUMENTED):
        return False
    return " ".join(difference.split()) in docs


def tools_agree(result: dict) -> bool:
    """Same verdict and, when both ran the file, the same outcomes."""
    ce, es = result["coder_eval"], result["evalsite"]
    if ce["verdict"] != es["verdict"]:
        return False
    return "outcomes" not in ce or "outcomes" not in es or outcomes_agree(ce["outcomes"], es["outcomes"])


def judge(result: dict, difference: str | None, docs: str) -> str:
    if tools_agree(result):
        return "agree"
    return "documented" if documented(difference, docs) else "MISMATCH"


def outcome_text(side: dict) -> str:
    if side["verdict"] == "refused":
        return f"refused ({side['stage']})"
    if "outcomes" not in side:
        return "accepted"
    parts = []
    for o in side["outcomes"]:
        score = "" if o["score"] is None else f" {o['score']:.3g}"
        parts.append(f"{o['row'] + ':' if o['row'] else ''}{o['status']}{score}")
    return "accepted: " + ", ".join(parts)


def print_table(names: list[str], results: dict, verdicts: dict) -> None:
    rows = [
        (
            name,
            outcome_text(results[name]["coder_eval"]),
            outcome_text(results[name]["evalsite"]),
            verdicts[name],
        )
        for name in names
    ]
    rows.insert(0, ("file", "coder-eval", "evalsite", "verdict"))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[3])


def record(names: list[str], results: dict, expected: dict) -> None:
    for name in names:
        # `agree` is recorded so the fast test need not repeat the comparison (and its status
        # mapping, which lives in runs_app) to know which files need a documented difference.
        difference = (expected.get(name) or {}).get("difference")
        entry = {**results[name], "agree": tools_agree(results[name]), "difference": difference}
        expected[name] = entry
    EXPECTED.write_text(json.dumps(dict(sorted(expected.items())), indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {EXPECTED.relative_to(ROOT)} ({len(names)} files recorded)")


def main() -> None:
    args = parse_args()
    exe = args.coder_eval or (Path(found) if (found := shutil.which("coder-eval")) else None)
    if exe is None or not exe.exists():
        print("coder-eval not found: give --coder-eval PATH (coder-eval 0.12.16) or put it on PATH")
        sys.exit(2)
    names = corpus_files(args.only)
    expected = json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}
    docs = " ".join(DOCS.read_text().split())
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="evalsite-parity-") as tmp:
        scratch = Path(tmp)
        (scratch / "home").mkdir()
        if not os.environ.get("DATABASE_URL"):
            os.environ["SQLITE_PATH"] = str(scratch / "parity.sqlite3")
        if not os.environ.get("CELERY_BROKER_URL"):
            os.environ["BROKER_DIR"] = str(scratch / "broker")
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")
        import django

        django.setup()
        from django.core.management import call_command

        # The filesystem broker warns about its missing hostname on every connection.
        logging.getLogger("kombu").setLevel(logging.ERROR)

        call_command("migrate", verbosity=0)

        results: dict[str, dict] = {name: {"coder_eval": {}, "evalsite": {}} for name in names}
        to_run = {name for name in names if agentless(name)} if not args.no_run else set()

        def coder_eval_side(name: str) -> None:
            side = coder_eval_plan(exe, name, scratch)
            if side["verdict"] == "accepted" and name in to_run:
                refused, outcomes = coder_eval_run(exe, name, scratch)
                if refused:
                    side.update(verdict="refused", stage="run", error=refused)
                else:
                    side["outcomes"] = outcomes
            results[name]["coder_eval"] = side

        with ThreadPoolExecutor(max_workers=2) as pool:  # 2 cores: two coder-eval processes at once
            list(pool.map(coder_eval_side, names))
        print(f"coder-eval: {len(names)} files in {time.perf_counter() - started:.0f} s")

        accepted = []
        for name in names:
            results[name]["evalsite"], _ = evalsite_verdict(name)
            if results[name]["evalsite"]["verdict"] == "accepted" and name in to_run:
                accepted.append(name)
        if accepted:
            for name, outcomes in evalsite_outcomes(accepted, scratch).items():
                results[name]["evalsite"]["outcomes"] = outcomes
        print(
            f"evalsite: {len(names)} files, {len(accepted)} run, {time.perf_counter() - started:.0f} s in all"
        )
        print()

    verdicts = {
        name: judge(results[name], (expected.get(name) or {}).get("difference"), docs) for name in names
    }
    print_table(names, results, verdicts)
    counts = {kind: sum(v == kind for v in verdicts.values()) for kind in ("agree", "documented", "MISMATCH")}
    ran = sum("outcomes" in r["coder_eval"] and "outcomes" in r["evalsite"] for r in results.values())
    print()
    print(
        f"{len(names)} files: {counts['agree']} agree, {counts['documented']} documented differences, "
        f"{counts['MISMATCH']} MISMATCH; {ran} run by both"
    )
    for name in names:
        if verdicts[name] == "MISMATCH":
            difference = (expected.get(name) or {}).get("difference") or "no difference recorded"
            print(f"  MISMATCH {name}: {difference}")
    if args.record:
        record(names, results, expected)
    sys.exit(1 if counts["MISMATCH"] else 0)


if __name__ == "__main__":
    main()
