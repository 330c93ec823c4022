"""Parity with coder-eval 0.12.16: both tools read the same coder-eval-format files.

Usage: .venv/bin/python bench/coder_eval_parity.py [PATH ...] [--folder PATH ...]
       [--coder-eval PATH] [--only NAME ...] [--no-run] [--record]

PATH is a folder (or one file in it). With none, the project's corpora run:
experiments_app/tests/corpus/coder_eval/ and corpus/coder_eval_round2/. A folder's files are every
top-level *.yaml, every */task.yaml and every */experiment.yaml. An experiment (a file with an
`experiment_id`) runs over the other *.yaml files of its folder, which are not run alone. A
folder may hold an expected.json (the project's corpora do); per file it may give
- `args`: flags for both tools' run (`--sample N`, `--sample-per-stratum N`, `-D path=value`),
  since some behaviour is not in a YAML;
- `difference`: a quote of the docs/coder-eval.md entry that explains why the tools differ;
- `pending`: the fix the difference awaits (an issue item): it is reported apart, see below;
- `evalsite_expects`: `{"statuses": [...], "error": REGEX}`, what evalsite's trials must give,
  for behaviour of evalsite's own keys that coder-eval cannot show (hooks).

For each file:
1. coder-eval's verdict: `coder-eval plan [-e EXP] FILE...` (exit code, first error line; a
   variant's "resolution failed" counts as refused, since `run` would refuse it). A file it
   accepts whose agents are all `type: none` is then run, `coder-eval run ... --run-dir DIR`: its
   exit code, and its outcomes from DIR/**/task.json (final_status, weighted_score; one per
   variant and dataset row). A run that refuses the file before any task starts counts as
   refused, at "run".
2. evalsite's verdict: `import_tasks` (and `import_experiment`) then the launch checks
   (`preview_trials`), rolled back, as `evalrun --plan` does. The agentless files it accepts run
   through a real Celery worker (2 pool processes) started here, one run per file, so each has
   the exit code `evalrun` would give it.
3. Each file is
   - `agree`: same verdict and, where both ran it, the same outcomes and exit code (statuses
     mapped as `manage.py import_coder_eval_run` maps them);
   - `documented`: the tools differ and docs/coder-eval.md says why: expected.json's
     `difference` quotes it, or (for any folder) the difference matches a rule of
     KNOWN_DIFFERENCES below, each of which quotes the entry it stands for;
   - `pending`: an undocumented difference that expected.json marks as awaiting a fix;
   - `DIFFERENT`: an undocumented difference nobody expects.

Exit codes: 0 no difference left undocumented; 1 a DIFFERENT file; 3 only `pending` ones (the
fixes they await are listed); 2 coder-eval not found or a bad PATH.
--no-run compares verdicts only. --record rewrites each folder's expected.json from this run's
results, keeping `args`, `difference` and `pending` (dropping a `pending` that now agrees);
review the diff before committing it.

A scratch SQLite database and broker folder are used unless DATABASE_URL / CELERY_BROKER_URL
are set (then they must be scratch ones); trials run under SANDBOX_ROOT, as a worker's always
do. Nothing leaves the machine but a task's `env_packages` installs (from the package
registries); every command has a time limit.
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
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CORPORA = [
    ROOT / "experiments_app" / "tests" / "corpus" / "coder_eval",
    ROOT / "experiments_app" / "tests" / "corpus" / "coder_eval_round2",
]
DOCS = ROOT / "docs" / "coder-eval.md"
PLAN_TIMEOUT = 120
RUN_TIMEOUT = 600  # one coder-eval run (env_packages installs included)
EVALSITE_TIMEOUT = 900  # all of evalsite's runs
WORKER_START_TIMEOUT = 120
ERROR_CHARS = 300
UNDOCUMENTED = "UNDOCUMENTED"
# Lines of `coder-eval plan` that start its error.
ERROR_MARKS = ("Error:", "early-stop config error", "resolution failed", "Failed to load experiment")
VERDICTS = ("agree", "documented", "pending", "DIFFERENT")
EXIT_DIFFERENT, EXIT_NO_CODER_EVAL, EXIT_ONLY_PENDING = 1, 2, 3


@dataclass
class Rule:
    """A documented difference recognised in any folder: every given field must match.

    `docs` quotes the docs/coder-eval.md entry (whitespace aside); a test checks that it does.
    """

    name: str
    docs: str
    coder_eval: str = ""  # coder-eval's verdict: accepted / refused
    evalsite: str = ""  # evalsite's verdict
    coder_eval_error: str = ""  # a regex searched in coder-eval's error
    coder_eval_warning: str = ""  # a regex searched in coder-eval's warning
    evalsite_error: str = ""  # a regex searched in evalsite's error
    key: str = ""  # a top-level key of the file


KNOWN_DIFFERENCES = [
    Rule(
        "unknown top-level key", "evalsite refuses an unknown top-level task key",
        coder_eval="accepted", evalsite="refused", evalsite_error=r"^[^:]*:\d+: \w+: unknown key",
        coder_eval_warning=r"unknown top-level field",
    ),
    Rule(
        "gating", "A criterion's `gating` key is evalsite's own",
        coder_eval="refused", evalsite="accepted", coder_eval_error=r"\.gating Extra inputs",
    ),
    Rule(
        "base_url", "The agent option `base_url` is evalsite's own",
        coder_eval="refused", evalsite="accepted", coder_eval_error=r"agent\.base_url Extra inputs",
    ),
    Rule(
        "max_tool_calls", "`run_limits.max_tool_calls` is evalsite's own",
        coder_eval="refused", evalsite="accepted",
        coder_eval_error=r"run_limits\.max_tool_calls Extra inputs",
    ),
    Rule(
        "missing description", "A missing `description` (of the task or of a criterion) is accepted",
        coder_eval="refused", evalsite="accepted", coder_eval_error=r"description Field required",
    ),
    Rule(
        "paths leaving the workspace",
        "Paths of `starter_files` and `mock_path_dirs` that leave the workspace are refused at import",
        coder_eval="accepted", evalsite="refused",
        evalsite_error=r"starter file path must not contain '\.\.'|mock_path_dirs entry must stay inside",
    ),
    Rule(
        "criterion path outside", "criterion paths outside the workspace (`/etc/shadow`, `../x`)",
        coder_eval="accepted", evalsite="refused", evalsite_error=r"path must be relative to the workspace",
    ),
    Rule(
        "nested repeat", "regular expressions with a nested repeat (`(a+)+`)",
        coder_eval="accepted", evalsite="refused",
        evalsite_error=r"repeats a group that itself ends in a repeat",
    ),
    Rule(
        "sane limits", "limits beyond sane bounds (`task_timeout` ≤ 7 days, `max_usd` finite)",
        coder_eval="accepted", evalsite="refused",
        evalsite_error=r"run_limits\.(max_usd: expected a finite|task_timeout: expected less than or equal)",
    ),
    Rule(
        "task id dots", "They never hold two dots in a row, or a dot first or last",
        coder_eval="accepted", evalsite="refused", evalsite_error=r"task_id: task_id .* must be a slug",
    ),
    Rule(
        "option of another kind", "An option of another kind (`allowed_tools` on `codex`) is refused",
        coder_eval="accepted", evalsite="refused", evalsite_error=r"applies to [\w-]+, not to",
    ),
    Rule(
        "not built", "The criterion types, agent options and sandbox keys in the table above are refused",
        coder_eval="accepted", evalsite="refused", evalsite_error=r" is not built( in evalsite)?\b",
    ),
    Rule(
        "working_directory_preamble",
        "The agent option `working_directory_preamble: false` is evalsite's own",
        coder_eval="refused", evalsite="accepted",
        coder_eval_error=r"agent\.working_directory_preamble Extra inputs",
    ),
    Rule(
        "hooks", "`hooks` (trial and suite) are evalsite's own",
        coder_eval="accepted", key="hooks", coder_eval_warning=r"unknown top-level field 'hooks'",
    ),
    Rule(
        "hooks in an experiment", "`hooks` (trial and suite) are evalsite's own",
        coder_eval="refused", evalsite="accepted", coder_eval_error=r"hooks",
    ),
]  # fmt: skip


@dataclass
class Item:
    """One file to compare: its folder, its name there, and what its expected.json says."""

    folder: Path
    name: str
    expected: dict = field(default_factory=dict)
    tasks: list[str] = field(default_factory=list)  # an experiment's task files (names)

    @property
    def path(self) -> Path:
        return self.folder / self.name

    @property
    def key(self) -> str:
        return f"{self.folder.name}/{self.name}"

    @property
    def is_experiment(self) -> bool:
        return bool(self.tasks) or _is_experiment(self.path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, metavar="PATH", help="folders (or files) to compare")
    parser.add_argument("--folder", action="append", type=Path, default=[], help="a folder to compare")
    parser.add_argument(
        "--coder-eval", type=Path, help="coder-eval (default: `make coder-eval`'s, else on PATH)"
    )
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these files (names in their folder)")
    parser.add_argument("--no-run", action="store_true", help="compare verdicts only")
    parser.add_argument("--record", action="store_true", help="rewrite expected.json from this run")
    return parser.parse_args(argv)


# --- walking ---------------------------------------------------------------------------------


def _load_yaml(path: Path) -> object:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None  # the tools say what is wrong with it


def _is_experiment(path: Path) -> bool:
    data = _load_yaml(path)
    return isinstance(data, dict) and "experiment_id" in data


def folder_items(folder: Path) -> list[Item]:
    """The files of one folder: top-level *.yaml, */task.yaml, */experiment.yaml. An experiment
    takes the other *.yaml of its folder as its tasks, which are then not items of their own."""
    expected_path = folder / "expected.json"
    expected = json.loads(expected_path.read_text()) if expected_path.exists() else {}
    paths = sorted([*folder.glob("*.yaml"), *folder.glob("*/task.yaml"), *folder.glob("*/experiment.yaml")])
    experiments = [p for p in paths if _is_experiment(p)]
    taken: set[Path] = set()
    items = []
    for path in experiments:
        siblings = sorted(p for p in path.parent.glob("*.yaml") if p != path and not _is_experiment(p))
        taken.update(siblings)
        name = str(path.relative_to(folder))
        tasks = [str(p.relative_to(folder)) for p in siblings]
        items.append(Item(folder, name, expected.get(name) or {}, tasks))
    for path in paths:
        if path not in taken and path not in experiments:
            name = str(path.relative_to(folder))
            items.append(Item(folder, name, expected.get(name) or {}))
    return sorted(items, key=lambda item: item.name)


def collect(paths: list[Path], only: list[str] | None) -> list[Item]:
    """Items of the folders (a file stands for its folder, narrowed to that file)."""
    items: list[Item] = []
    for path in paths or CORPORA:
        path = path.resolve()
        if not path.exists():
            sys.exit(f"no such file or folder: {path}")
        folder = path if path.is_dir() else path.parent
        beside = (folder / "expected.json").exists()
        if path.is_file() and not beside and (folder.parent / "expected.json").exists():
            folder = folder.parent  # NAME/task.yaml of a folder with an expected.json
        found = folder_items(folder)
        if path.is_file():
            name = str(path.relative_to(folder))
            found = [item for item in found if item.name == name or name in item.tasks]
        items += [item for item in found if item.key not in {i.key for i in items}]
    if only:
        items = [item for item in items if item.name in only]
        missing = sorted(set(only) - {item.name for item in items})
        if missing:
            sys.exit(f"not found: {', '.join(missing)}")
    return items


def agentless(item: Item) -> bool:
    """Whether every agent that would run is coder-eval's `none` kind (the only ones run here)."""

    def agent_types(path: Path) -> list:
        data = _load_yaml(path)
        if not isinstance(data, dict):
            return ["?"]
        types = [data["agent"].get("type")] if isinstance(data.get("agent"), dict) else []
        for variant in data.get("variants") or []:
            agent = variant.get("agent") if isinstance(variant, dict) else None
            types.append(agent.get("type") if isinstance(agent, dict) else "?")
        return types

    # An experiment's variants name the agents that run; a task names its own.
    types = agent_types(item.path)
    return bool(types) and all(t == "none" for t in types)


def shown(text: str, folder: Path) -> str:
    """An error line without this machine's paths, cut to a readable length."""
    text = " ".join(text.replace(str(folder) + "/", "").split())
    return re.sub(r"\S*/evalsite-parity-[^/\s]+/", "SCRATCH/", text)[:ERROR_CHARS]  # this run's folder


def run_args(item: Item) -> argparse.Namespace:
    """The item's `args`: coder-eval `run` flags that evalsite's launch options also take."""
    parser = argparse.ArgumentParser(prog=f"{item.key} args", exit_on_error=False)
    parser.add_argument("--sample", type=int)
    parser.add_argument("--sample-per-stratum", type=int)
    parser.add_argument("-D", "--set", dest="overrides", action="append", default=[])
    return parser.parse_args(item.expected.get("args") or [])


# --- coder-eval ------------------------------------------------------------------------------


def coder_eval_env(home: Path) -> dict[str, str]:
    # Telemetry off, a scratch HOME, and wide lines so error messages are not wrapped.
    return {**os.environ, "TELEMETRY_ENABLED": "false", "HOME": str(home), "COLUMNS": "400", "NO_COLOR": "1"}


def coder_eval_files(item: Item) -> list[str]:
    """The command-line arguments naming the item's files."""
    if item.is_experiment:
        return ["-e", str(item.path), *(str(item.folder / name) for name in item.tasks)]
    return [str(item.path)]


def coder_eval_plan(exe: Path, item: Item, scratch: Path) -> dict:
    """coder-eval's load verdict: exit code and the first error it printed."""
    try:
        done = subprocess.run(
            [str(exe), "plan", *coder_eval_files(item)], cwd=scratch, env=coder_eval_env(scratch / "home"),
            capture_output=True, text=True, timeout=PLAN_TIMEOUT,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"verdict": "refused", "stage": "plan", "exit_code": None, "error": "plan timed out"}
    lines = (done.stdout + done.stderr).splitlines()
    error = ""
    for i, line in enumerate(lines):
        if any(mark in line for mark in ERROR_MARKS):
            # A pydantic error names the field on the next lines.
            error = shown(" ".join(lines[i : i + 3]).split("Error:", 1)[-1], item.folder)
            break
    refused = done.returncode != 0 or "resolution failed" in done.stdout
    # What coder-eval accepts but ignores (an unknown top-level key) it only warns of.
    warning = next((shown(line, item.folder) for line in lines if "unknown top-level field" in line), "")
    return {
        "verdict": "refused" if refused else "accepted",
        "stage": "plan" if refused else "",
        "exit_code": done.returncode,
        "error": error,
        **({"warning": warning} if warning else {}),
    }


def coder_eval_run(exe: Path, item: Item, scratch: Path) -> tuple[str | None, list[dict], int | None]:
    """(why the run refused the file, or None; the outcomes of its tasks; the run's exit code)."""
    run_dir = scratch / "runs" / item.key.replace("/", "_")
    args = run_args(item)
    flags = [f"--sample={args.sample}"] if args.sample else []
    flags += [f"--sample-per-stratum={args.sample_per_stratum}"] if args.sample_per_stratum else []
    flags += [arg for override in args.overrides for arg in ("-D", override)]
    try:
        done = subprocess.run(
            [str(exe), "run", *coder_eval_files(item), *flags, "--run-dir", str(run_dir),
             "--preservation-mode", "NONE"],
            cwd=scratch, env=coder_eval_env(scratch / "home"), capture_output=True, text=True,
            timeout=RUN_TIMEOUT,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"run timed out after {RUN_TIMEOUT} s", [], None
    outcomes = []
    for path in sorted(glob.glob(str(run_dir / "**" / "task.json"), recursive=True)):
        data = json.loads(Path(path).read_text())
        variant = data.get("variant_id") if item.is_experiment else None
        outcomes.append(
            _ce_outcome(
                data["task_id"], data["final_status"], data.get("weighted_score"), data.get("error_message"),
                variant, item.folder,
            )
        )  # fmt: skip
    if not outcomes and (run_dir / "run.json").exists():
        # A task that errors before its sandbox exists (e.g. no docker) has no task.json.
        summary = json.loads((run_dir / "run.json").read_text())
        for task in summary.get("task_results") or []:
            variant = task.get("variant_id") if item.is_experiment else None
            outcomes.append(
                _ce_outcome(
                    task["task_id"], task["status"], task.get("weighted_score"), task.get("error_message"),
                    variant, item.folder,
                )
            )  # fmt: skip
    if outcomes:
        return None, outcomes, done.returncode
    log = (done.stdout + done.stderr).splitlines()
    why = next((line.split("—", 1)[-1] for line in log if "Skipping task file" in line), "")
    why = why or next((line for line in reversed(log) if re.match(r"^\w+(Error|Exception)\b", line)), "")
    return shown(why or f"no task ran (exit {done.returncode})", item.folder), [], done.returncode


def _ce_outcome(
    task_id: str, status: str, score: float | None, error: str | None, variant: str | None, folder: Path
) -> dict:
    row = task_id.split("/", 1)[1] if "/" in task_id else None
    outcome = {"row": row, "status": status, "score": score}
    if variant:
        outcome["variant"] = variant
    return outcome | ({"error": shown(error, folder)} if error else {})


# --- evalsite --------------------------------------------------------------------------------


def _evalsite_import(item: Item):
    """(the experiment to run, the task slugs) for the item, imported for real."""
    from experiments_app.definitions import adhoc_experiment, import_experiment, import_tasks

    if item.is_experiment:
        slugs = import_tasks([item.folder / name for name in item.tasks]).task_slugs
        return import_experiment(item.path).experiment, slugs
    return adhoc_experiment(None, None), import_tasks([item.path]).task_slugs


def _launch_options(item: Item, slugs: list[str], **more):
    from runs_app.launching import LaunchOptions

    args = run_args(item)
    # coder-eval's --sample is N dataset rows, as evalrun's is.
    return LaunchOptions(
        task_slugs=slugs, overrides=args.overrides, sample_rows=args.sample,
        sample_per_stratum=args.sample_per_stratum, **more,
    )  # fmt: skip


def evalsite_verdict(item: Item) -> dict:
    """evalsite's verdict (what `evalrun FILE --plan` decides), rolled back."""
    from django.db import transaction

    from experiments_app.definitions import ImportFailed
    from runs_app.launching import LaunchError, preview_trials

    with transaction.atomic():
        try:
            experiment, slugs = _evalsite_import(item)
        except ImportFailed as exc:
            return {"verdict": "refused", "stage": "import", "error": shown(exc.issues[0], item.folder)}
        try:
            preview_trials(experiment, _launch_options(item, slugs))
            verdict = {"verdict": "accepted", "stage": "", "error": ""}
        except LaunchError as exc:
            verdict = {"verdict": "refused", "stage": "launch", "error": shown(exc.problems[0], item.folder)}
        transaction.set_rollback(True)
    return verdict


def evalsite_outcomes(items: list[Item], scratch: Path) -> dict[str, tuple[list[dict], int] | str]:
    """Import the items for real and run each in a run of its own, through a worker started
    here: {item key: (outcomes, the exit code evalrun would give that run), or why the launch
    refused it (a container task with no worker running containers, say)}."""
    from evalsite.celery import app
    from runs_app import control
    from runs_app.launching import LaunchError, launch_run
    from runs_app.management.commands.evalrun import Command as EvalRun
    from runs_app.models import Run, Trial

    app.control.purge()
    log_path = scratch / "worker.log"
    with log_path.open("w") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "evalsite", "worker", "-c", "2", "--loglevel=WARNING",
             "--without-gossip", "--without-mingle", "-n", "parity@%h"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    results: dict[str, tuple[list[dict], int] | str] = {}
    runs = {}
    try:
        # A launch checks the live workers (containers): wait until this one has said hello.
        deadline = time.monotonic() + WORKER_START_TIMEOUT
        while not control.live_workers().exists():
            if time.monotonic() > deadline:
                sys.exit(f"evalsite's worker did not start in {WORKER_START_TIMEOUT} s: see {log_path}")
            time.sleep(0.2)
        for item in items:
            experiment, slugs = _evalsite_import(item)
            try:
                runs[item.key] = launch_run(experiment, options=_launch_options(item, slugs, max_parallel=2))
            except LaunchError as exc:
                results[item.key] = shown(exc.problems[0], item.folder)
        deadline = time.monotonic() + EVALSITE_TIMEOUT
        while not all(Run.objects.get(pk=run.pk).is_final for run in runs.values()):
            if time.monotonic() > deadline:
                sys.exit(f"evalsite's runs did not finish in {EVALSITE_TIMEOUT} s: see {log_path}")
            time.sleep(0.2)
    finally:
        os.killpg(worker.pid, 9)
        worker.wait()
    by_key = {item.key: item for item in items}
    for key, run in runs.items():
        run = Run.objects.get(pk=run.pk)
        outcomes = []
        trials = Trial.objects.for_run(run).current().select_related("task_version__task", "variant")
        for trial in trials.order_by("task_version__task__slug", "variant__slug", "dataset_row_id"):
            outcome = {"row": trial.dataset_row_id or None, "status": trial.status, "score": trial.score}
            if by_key[key].is_experiment:
                outcome["variant"] = trial.variant.slug
            if trial.error_message:
                outcome["error"] = shown(trial.error_message, by_key[key].folder)
            outcomes.append(outcome)
        results[key] = (outcomes, EvalRun()._exit_code(run))
    return results


# --- comparing -------------------------------------------------------------------------------


def outcomes_agree(ce: list[dict], es: list[dict]) -> bool:
    from runs_app.importers.coder_eval import STATUSES

    if len(ce) != len(es):
        return False
    for a, b in zip(sorted(ce, key=_unit), sorted(es, key=_unit), strict=True):
        status = STATUSES.get(a["status"], ("?", ""))[0]
        if _unit(a) != _unit(b) or status != b["status"]:
            return False
        # An error has no grade: coder-eval writes 0.0, evalsite leaves it empty.
        if status != "error" and round(a["score"] or 0.0, 6) != round(b["score"] or 0.0, 6):
            return False
    return True


def _unit(outcome: dict) -> tuple[str, str]:
    return outcome.get("variant") or "", outcome["row"] or ""


def tools_agree(result: dict) -> bool:
    """Same verdict and, when both ran the file, the same outcomes and exit code."""
    ce, es = result["coder_eval"], result["evalsite"]
    if ce["verdict"] != es["verdict"]:
        return False
    if "outcomes" not in ce or "outcomes" not in es:
        return True
    # Both exit 1 on a failed or errored trial, 0 when all passed; coder-eval also on a failed
    # suite threshold.
    same_exit = ce.get("run_exit_code") is None or ce.get("run_exit_code") == es.get("run_exit_code")
    return same_exit and outcomes_agree(ce["outcomes"], es["outcomes"])


def quoted(difference: str | None, docs: str) -> bool:
    """Whether `difference` quotes docs/coder-eval.md (whitespace and line breaks aside)."""
    if not difference or difference.startswith(UNDOCUMENTED):
        return False
    return " ".join(difference.split()) in docs


def matching_rule(result: dict, data: object) -> Rule | None:
    """The rule of KNOWN_DIFFERENCES that explains how the tools differ on a file, if one does."""
    ce, es = result["coder_eval"], result["evalsite"]
    for rule in KNOWN_DIFFERENCES:
        if rule.coder_eval and rule.coder_eval != ce["verdict"]:
            continue
        if rule.evalsite and rule.evalsite != es["verdict"]:
            continue
        if rule.coder_eval_error and not re.search(rule.coder_eval_error, ce.get("error") or ""):
            continue
        if rule.evalsite_error and not re.search(rule.evalsite_error, es.get("error") or ""):
            continue
        if rule.coder_eval_warning and not re.search(rule.coder_eval_warning, ce.get("warning") or ""):
            continue
        if rule.key and not (isinstance(data, dict) and rule.key in data):
            continue
        return rule
    return None


def unmet_expectation(item: Item, result: dict) -> str:
    """What evalsite did against the file's `evalsite_expects` ({"statuses": [...], "error":
    regex}), for behaviour coder-eval cannot show (evalsite's own keys); "" when it holds."""
    expects, side = item.expected.get("evalsite_expects"), result["evalsite"]
    if not expects or "outcomes" not in side:
        return ""
    statuses = sorted(o["status"] for o in side["outcomes"])
    if "statuses" in expects and statuses != sorted(expects["statuses"]):
        return f"evalsite's trials are {statuses}, expected {sorted(expects['statuses'])}"
    if "error" in expects:
        errors = [o.get("error") or "" for o in side["outcomes"]]
        if not all(re.search(expects["error"], error) for error in errors):
            return f"evalsite's errors {errors} do not match {expects['error']!r}"
    return ""


def judge(item: Item, result: dict, docs: str) -> tuple[str, str]:
    """(the file's verdict, why): agree / documented / pending / DIFFERENT."""
    unmet = unmet_expectation(item, result)
    if unmet:
        return ("pending", item.expected["pending"]) if item.expected.get("pending") else ("DIFFERENT", unmet)
    if tools_agree(result):
        return "agree", ""
    difference = item.expected.get("difference")
    if quoted(difference, docs):
        return "documented", difference
    rule = matching_rule(result, _load_yaml(item.path))
    if rule and " ".join(rule.docs.split()) in docs:
        return "documented", f"rule {rule.name!r}: {rule.docs}"
    if item.expected.get("pending"):
        return "pending", item.expected["pending"]
    return "DIFFERENT", difference or "no difference recorded"


def outcome_text(side: dict) -> str:
    if side["verdict"] == "refused":
        return f"refused ({side['stage']})"
    if "outcomes" not in side:
        return "accepted"
    parts = []
    for o in side["outcomes"]:
        score = "" if o["score"] is None else f" {o['score']:.3g}"
        unit = ":".join(part for part in _unit(o) if part)
        parts.append(f"{unit + ':' if unit else ''}{o['status']}{score}")
    code = side.get("run_exit_code")
    return "accepted: " + ", ".join(parts) + ("" if code is None else f" (exit {code})")


def print_table(items: list[Item], results: dict, verdicts: dict) -> None:
    rows = [
        (item.key, outcome_text(results[item.key]["coder_eval"]), outcome_text(results[item.key]["evalsite"]))
        for item in items
    ]
    rows.insert(0, ("file", "coder-eval", "evalsite"))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    marks = ["verdict", *(verdicts[item.key][0] for item in items)]
    for row, mark in zip(rows, marks, strict=True):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) + "  " + mark)


def summary(items: list[Item], verdicts: dict, compared_fully: set[str] | None = None) -> int:
    """Print the totals and what is not agreed; return the exit code. A `pending` file is said to
    agree now only if it was `compared_fully` (run, when it is runnable; default: every file)."""
    counts = {kind: sum(verdicts[item.key][0] == kind for item in items) for kind in VERDICTS}
    print(
        f"{len(items)} files: {counts['agree']} agree, {counts['documented']} documented differences, "
        f"{counts['pending']} pending (undocumented, awaiting a fix), {counts['DIFFERENT']} DIFFERENT"
    )
    for kind in ("pending", "DIFFERENT"):
        for item in items:
            if verdicts[item.key][0] == kind:
                print(f"  {kind} {item.key}: {verdicts[item.key][1]}")
    for item in items:
        full = compared_fully is None or item.key in compared_fully
        if item.expected.get("pending") and verdicts[item.key][0] == "agree" and full:
            print(f"  no longer pending: {item.key} (--record drops its `pending`)")
    if counts["DIFFERENT"]:
        print("result: undocumented differences (exit 1)")
        return EXIT_DIFFERENT
    if counts["pending"]:
        print(f"result: only differences awaiting their fixes (exit {EXIT_ONLY_PENDING})")
        return EXIT_ONLY_PENDING
    print("result: no undocumented difference (exit 0)")
    return 0


def record(items: list[Item], results: dict) -> None:
    for folder in sorted({item.folder for item in items}):
        path = folder / "expected.json"
        expected = json.loads(path.read_text()) if path.exists() else {}
        recorded = [item for item in items if item.folder == folder]
        for item in recorded:
            result = results[item.key]
            old = expected.get(item.name) or {}
            # `agree` is recorded so the fast test need not repeat the comparison (and its status
            # mapping, which lives in runs_app) to know which files need a documented difference.
            entry = {key: old[key] for key in ("args", "evalsite_expects") if old.get(key)} | result
            entry |= {"agree": tools_agree(result), "difference": old.get("difference")}
            met = not unmet_expectation(item, result)
            if old.get("pending") and not (entry["agree"] and met):
                entry["pending"] = old["pending"]
            expected[item.name] = entry
        path.write_text(json.dumps(dict(sorted(expected.items())), indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {path} ({len(recorded)} files recorded)")


def compare(items: list[Item], exe: Path, scratch: Path, run: bool) -> dict[str, dict]:
    """Both tools' verdicts (and, with `run`, outcomes) per item key; Django is set up."""
    results: dict[str, dict] = {item.key: {"coder_eval": {}, "evalsite": {}} for item in items}
    to_run = {item.key for item in items if agentless(item)} if run else set()
    started = time.perf_counter()

    def coder_eval_side(item: Item) -> None:
        side = coder_eval_plan(exe, item, scratch)
        if side["verdict"] == "accepted" and item.key in to_run:
            refused, outcomes, code = coder_eval_run(exe, item, scratch)
            if refused:
                side.update(verdict="refused", stage="run", error=refused)
            else:
                side.update(outcomes=outcomes, run_exit_code=code)
        results[item.key]["coder_eval"] = side

    with ThreadPoolExecutor(max_workers=2) as pool:  # 2 cores: two coder-eval processes at once
        list(pool.map(coder_eval_side, items))
    print(f"coder-eval: {len(items)} files in {time.perf_counter() - started:.0f} s")

    accepted = []
    for item in items:
        results[item.key]["evalsite"] = evalsite_verdict(item)
        if results[item.key]["evalsite"]["verdict"] == "accepted" and item.key in to_run:
            accepted.append(item)
    if accepted:
        for key, ran in evalsite_outcomes(accepted, scratch).items():
            if isinstance(ran, str):
                results[key]["evalsite"].update(verdict="refused", stage="launch", error=ran)
            else:
                results[key]["evalsite"].update(outcomes=ran[0], run_exit_code=ran[1])
    print(f"evalsite: {len(items)} files, {len(accepted)} run, {time.perf_counter() - started:.0f} s in all")
    return results


def main() -> None:
    args = parse_args()
    if args.record and args.no_run:
        sys.exit("--record needs the runs: without them it would drop the recorded outcomes")
    installed = ROOT / ".agents" / "coder-eval" / "bin" / "coder-eval"
    found = str(installed) if installed.is_file() else shutil.which("coder-eval")
    exe = args.coder_eval or (Path(found) if found else None)
    if exe is None or not exe.exists():
        print("coder-eval not found: `make coder-eval`, or give --coder-eval PATH (coder-eval 0.12.16)")
        sys.exit(EXIT_NO_CODER_EVAL)
    items = collect([*args.paths, *args.folder], args.only)
    docs = " ".join(DOCS.read_text().split())
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
        results = compare(items, exe, scratch, run=not args.no_run)
        print()

    verdicts = {item.key: judge(item, results[item.key], docs) for item in items}
    print_table(items, results, verdicts)
    print()
    fully = {item.key for item in items if not args.no_run or not agentless(item)}
    code = summary(items, verdicts, fully)
    if len(fully) < len(items):
        print(f"--no-run: {len(items) - len(fully)} runnable files were compared by their load verdicts only")
    if args.record:
        record(items, results)
    sys.exit(code)


if __name__ == "__main__":
    main()
