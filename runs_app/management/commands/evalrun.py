"""`manage.py evalrun`: run tasks from a terminal or a CI job, with coder-eval's `run` flags.

The run is a normal Run (the dashboard shows it); the worker processes execute it. This command
imports the task files (coder-eval YAML and Harbor task folders alike), launches (or resumes) the
run, follows it, prints the comparison summary and writes the requested reports. Exit codes: 0
every trial passed, every gate holds and every dataset suite meets its thresholds, 1 a trial
failed or errored, a gate or a suite's thresholds failed or the run was cancelled (with `--plan`:
the design can detect no effect), 2 bad input; 130 on Ctrl-C (or SIGTERM).
"""

import contextlib
import json
import logging
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from experiments_app.definitions import ImportFailed, adhoc_experiment, import_experiment, import_tasks
from experiments_app.models import Experiment
from experiments_app.specs.resolve import OverrideError, parse_overrides
from runs_app import control, preflight
from runs_app.analysis import reports
from runs_app.analysis.load import comparison
from runs_app.analysis.stats import notes
from runs_app.launching import LaunchError, LaunchOptions, launch_run, preview_trials, run_plan
from runs_app.models import Run, Trial, TrialEvent

POLL_SECONDS = 0.25
# Event ids are read in pages that reach this far below the newest id seen: on PostgreSQL a
# lower id can commit after a higher one (two workers writing at once), and would be skipped.
EVENT_LOOKBACK = 500
WORKER_HINT_AFTER = 15.0
CANCEL_WAIT_SECONDS = 60.0
EXIT_BAD_INPUT = 2
EXIT_REFUSED_PLAN = 1  # `--plan` of a design that can detect no effect
PLAN_LINES = 30  # task × variant lines `--plan` prints before "and N more"
EXIT_INTERRUPTED = 130


def _csv(values: list[str] | None) -> list[str] | None:
    """-t a,b -t c → [a, b, c]; None when the flag was not given."""
    if values is None:
        return None
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def _printable(text: str) -> str:
    """Agent output shown on a terminal: control characters (escape sequences) made visible."""
    return "".join(ch if ch.isprintable() or ch == "\t" else repr(ch)[1:-1] for ch in text)


class Command(BaseCommand):
    help = "Run tasks against one or more agent variants and wait for the results (like coder-eval run)."

    def add_base_argument(self, parser, *args, **kwargs):
        # coder-eval's -v is a flag (debug logging), not Django's `-v LEVEL`.
        if "-v" in args:
            parser.add_argument("-v", "--verbose", dest="verbosity", action="count", default=1,
                                help="debug logging")  # fmt: skip
            return
        super().add_base_argument(parser, *args, **kwargs)

    def add_arguments(self, parser):
        parser.add_argument(
            "task_files", nargs="*", type=Path, metavar="TASK_FILES",
            help="task YAML files, Harbor task folders, or folders of them, imported first "
            "(default: examples/tasks)",
        )  # fmt: skip
        parser.add_argument("-e", "--experiment", help="experiment YAML path, or the slug of an experiment")
        parser.add_argument("--root", type=Path, help="folder the experiment YAML's paths may not leave")
        parser.add_argument("-t", "--tags", action="append", help="only tasks with any of these tags (a,b)")
        parser.add_argument("--exclude-tags", action="append", help="leave out tasks with these tags (a,b)")
        parser.add_argument("--include-skipped", action="store_true", help="also run tasks marked skip")
        parser.add_argument(
            "--lenient",
            action="store_true",
            help="unknown keys in task and experiment files warn instead of failing",
        )
        parser.add_argument("-T", "--type", dest="agent_type", help="agent type for every variant")
        parser.add_argument("-m", "--model", help="agent model for every variant")
        parser.add_argument(
            "-D", "--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
            help="override a config field, e.g. -D run_limits.max_turns=5 (repeatable)",
        )  # fmt: skip
        parser.add_argument("--repeats", type=int, help="trials per task and variant")
        parser.add_argument("-j", "--max-parallel", type=int, help="trials of this run running at once")
        parser.add_argument(
            "--sample", type=int,
            help="run N rows of each dataset task, drawn uniformly with a fixed seed (coder-eval's "
            "--sample: the same rows every run; it overrides sample_per_stratum)",
        )  # fmt: skip
        parser.add_argument("--sample-tasks", type=int, help="run only N tasks, chosen with --seed")
        parser.add_argument("--sample-per-stratum", type=int, help="dataset rows per stratum")
        parser.add_argument(
            "--seed", type=int,
            help="seed of --sample-tasks, and of --sample-per-stratum for a dataset without sample_seed",
        )  # fmt: skip
        parser.add_argument("--keep-artifacts", action="store_true", help="keep each trial's workspace")
        parser.add_argument(
            "--any-code-version", action="store_true",
            help="let workers of any code version run its trials (default: only this code's)",
        )  # fmt: skip
        parser.add_argument(
            "--variant", dest="variants", action="append", metavar="NAME",
            help="run only these variants of the experiment (a,b; repeatable)",
        )  # fmt: skip
        parser.add_argument(
            "--launch-anyway", action="store_true",
            help="launch even when the pre-flight check finds problems (a variant no live worker can run)",
        )  # fmt: skip
        parser.add_argument("--resume", type=int, metavar="RUN_ID", help="finish a crashed or cancelled run")
        parser.add_argument("--retry-errors", type=int, metavar="RUN_ID", help="rerun a run's errored trials")
        parser.add_argument("-s", "--stream", choices=["full", "minimal"], help="print trial events live")
        parser.add_argument("--no-wait", action="store_true", help="print the run's id and URL, then exit")
        parser.add_argument(
            "--plan", action="store_true",
            help="print the effect this run could detect, and start nothing (exit 1: it can detect none)",
        )  # fmt: skip
        parser.add_argument("--junit-xml", type=Path, metavar="PATH", help="write a JUnit XML report here")
        parser.add_argument("--report", type=Path, metavar="DIR", help="write report.md and report.json here")
        parser.add_argument("--log-file", type=Path, help="also write logs to this file")

    def handle(self, *args, **options):
        self._configure_logging(options["verbosity"], options["log_file"])
        for name in ("repeats", "max_parallel", "sample", "sample_tasks", "sample_per_stratum"):
            if options[name] is not None and options[name] < 1:
                raise CommandError(
                    f"--{name.replace('_', '-')} must be at least 1", returncode=EXIT_BAD_INPUT
                )
        if options["plan"]:
            self._plan(options)
            return
        try:
            run, first_event = self._start(options)
        except KeyboardInterrupt:
            sys.exit(EXIT_INTERRUPTED)  # while importing or launching: no run to follow yet
        url = settings.SITE_URL + run.get_absolute_url()
        self.stdout.write(f"run {run.pk}: {url}")
        self._warn_of_other_versions(run)
        if options["no_wait"]:
            return
        run = self._follow(run, options["stream"], first_event)
        report = reports.build_report(run)
        self._write_files(report, options["junit_xml"], options["report"])
        self._print_summary(report)
        code = self._exit_code(run)
        if code:
            sys.exit(code)

    # --- starting ---------------------------------------------------------------------------

    def _configure_logging(self, verbosity: int, log_file: Path | None) -> None:
        """Warnings on the terminal (everything with -v); INFO and up in --log-file."""
        verbose = verbosity >= 2
        root = logging.getLogger()
        root.setLevel(logging.DEBUG if verbose else logging.INFO)
        for handler in root.handlers:
            handler.setLevel(logging.DEBUG if verbose else logging.WARNING)
        if log_file:
            file_handler = logging.FileHandler(log_file)
            file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            root.addHandler(file_handler)
        # The filesystem broker warns about its missing hostname on every connection.
        logging.getLogger("kombu").setLevel(logging.DEBUG if verbose else logging.ERROR)

    def _start(self, options) -> tuple[Run, int]:
        """The run to follow and the first event id worth printing."""
        if options["resume"] and options["retry_errors"]:
            raise CommandError("give either --resume or --retry-errors", returncode=EXIT_BAD_INPUT)
        if options["resume"] or options["retry_errors"]:
            return self._restart(options)
        experiment, launch = self._prepare(options)
        self._preflight(experiment, launch, refuse=not options["launch_anyway"])
        try:
            return launch_run(experiment, options=launch), 0
        except LaunchError as exc:
            raise CommandError(
                self._problems("cannot start the run", exc.problems), returncode=EXIT_BAD_INPUT
            ) from None

    def _prepare(self, options) -> tuple[Experiment, LaunchOptions]:
        """Import the task files, find or make the experiment, and gather the launch options."""
        self._check_overrides(options)
        slugs = self._import_tasks(
            options["task_files"] or [settings.BASE_DIR / "examples" / "tasks"], options["lenient"]
        )
        experiment, adhoc = self._experiment(options)
        return experiment, LaunchOptions(
            overrides=options["overrides"], repeats=options["repeats"], max_parallel=options["max_parallel"],
            tags=_csv(options["tags"]), exclude_tags=_csv(options["exclude_tags"]),
            include_skipped=options["include_skipped"], task_slugs=slugs, sample=options["sample_tasks"],
            sample_rows=options["sample"], sample_per_stratum=options["sample_per_stratum"],
            seed=options["seed"],
            keep_artifacts=options["keep_artifacts"],
            any_code_version=options["any_code_version"], variants=_csv(options["variants"]),
            # An ad-hoc experiment already carries -T/-m in its one variant.
            agent_type=None if adhoc else options["agent_type"], model=None if adhoc else options["model"],
        )  # fmt: skip

    def _preflight(self, experiment: Experiment, launch: LaunchOptions, refuse: bool) -> None:
        """Say what the live workers lack to run each variant, with the fix; refuse to launch
        (exit 2) while there is anything, unless told to launch anyway."""
        report = preflight.check(experiment, launch)
        for row in report.problems:
            self.stderr.write(f"pre-flight: {row.line}")
        if report.problems and refuse:
            variants = ", ".join(report.variants_with_problems())
            raise CommandError(
                f"not launched: pre-flight found {len(report.problems)} problem(s) (above). Fix them, leave "
                f"{variants} out (--variant NAME for the variants to run), or pass --launch-anyway",
                returncode=EXIT_BAD_INPUT,
            )

    def _warn_of_other_versions(self, run: Run) -> None:
        """Live workers that all run other code would leave the run waiting (an edited checkout
        under a running `make run` worker, say)."""
        alive = list(control.live_workers())
        if alive and not any(control.may_take(run, worker) for worker in alive):
            versions = ", ".join(sorted({worker.code_version or "?" for worker in alive}))
            self.stderr.write(
                f"warning: no live worker runs this checkout's code (version {run.code_version}; they "
                f"run {versions}): its trials wait for one. Restart the workers, or launch with "
                "--any-code-version"
            )

    def _plan(self, options) -> None:
        """Print the trials a run would hold, per task × variant, and what it could detect;
        everything (the task import too) happens in a transaction that is rolled back."""
        with transaction.atomic():
            experiment, launch = self._prepare(options)
            try:
                trials = preview_trials(experiment, launch)
                plan = run_plan(experiment, launch)
                report = preflight.check(experiment, launch, trials)
            except LaunchError as exc:
                raise CommandError(
                    self._problems("cannot plan the run", exc.problems), returncode=EXIT_BAD_INPUT
                ) from None
            transaction.set_rollback(True)
        cells = Counter((trial.task_version.task.slug, trial.variant.slug) for trial in trials)
        rows: dict[tuple[str, str], set[str]] = {}
        for trial in trials:
            if trial.dataset_row_id:
                rows.setdefault((trial.task_version.task.slug, trial.variant.slug), set()).add(
                    trial.dataset_row_id
                )
        self.stdout.write(f"plan for {experiment.slug}: {len(trials)} trials (nothing was started or stored)")
        for (task, variant), count in list(cells.items())[:PLAN_LINES]:
            over = f" over {len(rows[(task, variant)])} dataset rows" if (task, variant) in rows else ""
            self.stdout.write(f"  {task} × {variant}: {count} trial{'s' if count != 1 else ''}{over}")
        if len(cells) > PLAN_LINES:
            self.stdout.write(f"  and {len(cells) - PLAN_LINES} more task × variant pairs")
        for line in plan.lines():
            self.stdout.write(f"  {line}")
        for row in report.rows:
            self.stdout.write(f"  pre-flight {row.level}: {row.line}")
        for note in report.notes:
            self.stdout.write(f"  pre-flight: {note}")
        if plan.refused:
            raise CommandError(
                "this design cannot show a difference between the variants (see above): add tasks",
                returncode=EXIT_REFUSED_PLAN,
            )

    def _problems(self, title: str, problems: list[str]) -> str:
        # (The loader's messages serve the web too, which has no --lenient: the flag is named here.)
        unknown = any("unknown key" in p for p in problems)
        hint = "\n--lenient keeps unknown keys as warnings" if unknown else ""
        return f"{title}: {len(problems)} problem(s)\n" + "\n".join(f"  {p}" for p in problems) + hint

    def _check_overrides(self, options) -> None:
        """Fail before importing anything when a -D (or -T/-m) is invalid or given twice."""
        items = list(options["overrides"])
        items += [f"agent.type={options['agent_type']}"] if options["agent_type"] else []
        items += [f"agent.model={options['model']}"] if options["model"] else []
        try:
            parse_overrides(items)
        except OverrideError as exc:
            raise CommandError(str(exc), returncode=EXIT_BAD_INPUT) from None

    def _import_tasks(self, paths: list[Path], lenient: bool) -> list[str]:
        missing = [str(p) for p in paths if not p.exists()]
        if missing:
            raise CommandError(self._problems("task files not found", missing), returncode=EXIT_BAD_INPUT)
        try:
            report = import_tasks(paths, lenient=lenient)
        except ImportFailed as exc:
            # Every problem of every file, never a silent skip of the broken ones.
            raise CommandError(
                self._problems("cannot load the task files", exc.issues), returncode=EXIT_BAD_INPUT
            ) from None
        for warning in report.warnings:
            self.stderr.write(f"warning: {warning}")
        if not report.task_slugs:
            raise CommandError(f"no task found in {', '.join(map(str, paths))}", returncode=EXIT_BAD_INPUT)
        self.stdout.write(f"tasks: {report.summary()}")
        return report.task_slugs

    def _experiment(self, options) -> tuple[Experiment, bool]:
        """The experiment to run and whether it is an ad-hoc one made from -T/-m."""
        given = options["experiment"]
        if not given:
            return adhoc_experiment(options["agent_type"], options["model"]), True
        path = Path(given)
        if path.suffix in (".yaml", ".yml") or path.exists():
            try:
                return import_experiment(
                    path, root=options["root"], lenient=options["lenient"]
                ).experiment, False
            except (ImportFailed, FileNotFoundError) as exc:
                issues = exc.issues if isinstance(exc, ImportFailed) else [str(exc)]
                raise CommandError(
                    self._problems("cannot load the experiment", issues), returncode=EXIT_BAD_INPUT
                ) from None
        experiment = Experiment.objects.filter(slug=given).first()
        if experiment is None:
            raise CommandError(
                f"no experiment {given!r}: give a YAML path or an experiment's slug",
                returncode=EXIT_BAD_INPUT,
            )
        return experiment, False

    def _restart(self, options) -> tuple[Run, int]:
        run_id = options["resume"] or options["retry_errors"]
        run = Run.objects.filter(pk=run_id).first()
        if run is None:
            raise CommandError(f"no run {run_id}", returncode=EXIT_BAD_INPUT)
        # Only events written from now on are news.
        first_event = (TrialEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0) + 1
        try:
            if options["resume"]:
                count = control.resume_run(run, control.COMMAND_LINE)
                self.stdout.write(f"resuming run {run.pk}: {count} trial(s) to run")
            else:
                count = control.retry_errors(run, control.COMMAND_LINE)
                self.stdout.write(f"retrying run {run.pk}: {count} errored trial(s)")
        except control.ControlRefused as refusal:
            raise CommandError(str(refusal), returncode=EXIT_BAD_INPUT) from None
        # With nothing left to run no trial will end, so no worker would finish the run: do it here.
        run = control.refresh_run(run.pk)
        return run, first_event

    # --- following --------------------------------------------------------------------------

    def _follow(self, run: Run, stream: str | None, first_event: int) -> Run:
        """Wait for the run to end, showing progress (and events); Ctrl-C cancels it."""
        interrupted: list[int] = []

        def on_sigint(signum, frame):
            if interrupted:
                raise KeyboardInterrupt  # a second Ctrl-C: stop waiting for the cancel
            interrupted.append(signum)

        # SIGTERM (a CI job's timeout, `kill`) as Ctrl-C: the run is cancelled, not left running.
        previous = {signum: signal.signal(signum, on_sigint) for signum in (signal.SIGINT, signal.SIGTERM)}
        try:
            return self._wait(run, stream, first_event, interrupted)
        except KeyboardInterrupt:
            self.stderr.write("\ninterrupted again: the run is cancelled, its running trials stop shortly")
            sys.exit(EXIT_INTERRUPTED)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _wait(self, run: Run, stream: str | None, first_event: int, interrupted: list[int]) -> Run:
        progress = _Progress(self.stdout, tty=self.stdout.isatty() and not stream)
        decisions = _Decisions(progress)
        events = _EventPrinter(self.stdout, run, stream, first_event) if stream else None
        started, cancel_deadline, hinted = time.monotonic(), None, False
        while True:
            run.refresh_from_db()
            if events:
                events.poll()
            # The run's n_running changes only when a trial ends; count the live ones.
            progress.show(
                run, Trial.objects.for_run(run).current().filter(status=Trial.Status.RUNNING).count()
            )
            if run.is_final:
                break
            decisions.check(run)
            if interrupted and cancel_deadline is None:
                self.stderr.write("\ncancelling the run (Ctrl-C again to stop waiting)…")
                with contextlib.suppress(control.ControlRefused):  # it may have ended just now
                    control.cancel_run(run, control.COMMAND_LINE)
                cancel_deadline = time.monotonic() + CANCEL_WAIT_SECONDS
            if cancel_deadline and time.monotonic() > cancel_deadline:
                break
            if (
                not hinted
                and run.status == Run.Status.QUEUED
                and time.monotonic() - started > WORKER_HINT_AFTER
            ):
                self.stderr.write("still queued: is a worker running? (make worker)")
                hinted = True
            time.sleep(POLL_SECONDS)
        progress.done()
        if interrupted:
            self.stderr.write(f"run {run.pk} cancelled; finish it later with: evalrun --resume {run.pk}")
            sys.exit(EXIT_INTERRUPTED)
        return run

    # --- results ----------------------------------------------------------------------------

    def _write_files(self, report: dict, junit: Path | None, folder: Path | None) -> None:
        if junit:
            junit.parent.mkdir(parents=True, exist_ok=True)
            junit.write_text(reports.render_junit(report))
            self.stdout.write(f"JUnit XML: {junit}")
        if folder:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "report.md").write_text(reports.render_markdown(report))
            (folder / "report.json").write_text(reports.render_json(report))
            self.stdout.write(f"reports: {folder / 'report.md'}, {folder / 'report.json'}")

    def _print_summary(self, report: dict) -> None:
        self.stdout.write("")
        self.stdout.write(reports.headline(report))
        self.stdout.write(reports.render_text_table(report))
        for line in reports.quarantine_lines(report):
            self.stdout.write(line)
        self.stdout.write("Anytime-valid intervals (valid however early the run stopped):")
        for row in report["variants"]:
            self.stdout.write(f"  {row['anytime']}")
        for gate in report["gates"]:
            verdict = self.style.SUCCESS("pass") if gate["passed"] else self.style.ERROR("FAIL")
            self.stdout.write(f"gate {verdict}: {gate['name']}: {gate['detail']}")
        for line in reports.suite_lines(report):
            style = self.style.SUCCESS if line.startswith("suite pass") else self.style.ERROR
            self.stdout.write(style(line))

    def _exit_code(self, run: Run) -> int:
        """1 unless every trial passed, every gate held and every dataset suite met its
        thresholds (coder-eval exits 1 on a failed suite gate too, its rows all passed or not)."""
        all_passed = run.status == Run.Status.FINISHED and run.n_trials == run.n_passed
        suites_held = all(suite.get("passed") for suite in run.suite_results)
        return 0 if all_passed and suites_held and run.gates_passed is not False else 1


class _Progress:
    """A one-line bar redrawn in place on a terminal; a plain line per change otherwise."""

    WIDTH = 30

    def __init__(self, out, tty: bool):
        self.out, self.tty, self.last = out, tty, None

    def note(self, text: str) -> None:
        """A line of its own, above the bar (which is drawn again after it)."""
        if self.tty and self.last is not None:
            self.out.write("")
        self.out.write(text)
        self.last = None

    def show(self, run: Run, running: int) -> None:
        state = (run.n_done, run.n_passed, run.n_failed, run.n_error, running)
        if state == self.last:
            return
        self.last = state
        text = (
            f"{run.n_done}/{run.n_trials} done: {run.n_passed} passed, {run.n_failed} failed, "
            f"{run.n_error} errors, {run.n_cancelled} cancelled, {running} running"
        )
        if self.tty:
            filled = self.WIDTH * run.n_done // max(run.n_trials, 1)
            self.out.write(f"\r[{'#' * filled}{'.' * (self.WIDTH - filled)}] {text}", ending="")
            self.out.flush()
        else:
            self.out.write(f"progress: {text}")

    def done(self) -> None:
        if self.tty:
            self.out.write("")


class _Decisions:
    """Says when a variant's anytime-valid interval of Δ decides it (or stops deciding it) while
    the run goes on: those intervals hold at every moment, so the run may be stopped there
    (Ctrl-C) without inflating its error rate. The comparison is computed at most every
    EVERY_SECONDS, and only after a trial has finished."""

    EVERY_SECONDS = 2.0

    def __init__(self, progress: _Progress):
        self.progress, self.seen, self.done, self.at = progress, {}, -1, 0.0

    def check(self, run: Run) -> None:
        if run.n_done == self.done or time.monotonic() - self.at < self.EVERY_SECONDS:
            return
        self.done, self.at = run.n_done, time.monotonic()
        summary = comparison([run], criteria=False)
        for arm in summary.others:
            decided = arm.versus.decided if arm.versus else ""
            if decided != self.seen.get(arm.key, ""):
                words = notes.anytime_words(arm, summary.baseline_label, summary.confidence)
                self.progress.note(f"anytime-valid: {words}")
            self.seen[arm.key] = decided


class _EventPrinter:
    """Prints the run's TrialEvents as the workers write them (minimal: phases and errors)."""

    MINIMAL_KINDS = (TrialEvent.Kind.PHASE, TrialEvent.Kind.ERROR)

    def __init__(self, out, run: Run, mode: str, first_event: int):
        self.out, self.run, self.mode = out, run, mode
        self.first = first_event  # older events belong to an earlier attempt of the run
        self.newest = first_event - 1
        self.seen: set[int] = set()
        self.labels: dict[int, str] = {}

    def poll(self) -> None:
        events = TrialEvent.objects.filter(trial__run=self.run, pk__gt=max(self.newest - EVENT_LOOKBACK, 0))
        if self.mode == "minimal":
            events = events.filter(kind__in=self.MINIMAL_KINDS)
        for event in events.exclude(pk__in=self.seen).order_by("pk")[:1000]:
            self.seen.add(event.pk)
            self.newest = max(self.newest, event.pk)
            if event.pk >= self.first:
                self.out.write(f"[{self._label(event.trial_id)}] {_printable(self._describe(event))}")
        self.seen = {pk for pk in self.seen if pk > self.newest - EVENT_LOOKBACK}
        self.out.flush()

    def _label(self, trial_id: int) -> str:
        if trial_id not in self.labels:
            trial = Trial.objects.select_related("variant", "task_version__task").get(pk=trial_id)
            row = f"[{trial.dataset_row_id}]" if trial.dataset_row_id else ""
            self.labels[trial_id] = (
                f"{trial.variant.slug} {trial.task_version.task.slug}{row}#{trial.replicate}"
            )
        return self.labels[trial_id]

    def _describe(self, event: TrialEvent) -> str:
        data = event.data or {}
        if event.kind == TrialEvent.Kind.PHASE:
            extra = " ".join(f"{k}={v}" for k, v in data.items() if k != "phase" and v not in ("", None))
            return f"phase {data.get('phase', '?')}{' ' + extra if extra else ''}"
        if event.kind == TrialEvent.Kind.TOOL_CALL:
            text = f"{data.get('name', '?')} {json.dumps(data.get('input'), default=str)}"
        else:
            text = data.get("text") or data.get("message") or json.dumps(data, default=str)
        text = " ".join(str(text).split())
        return f"{event.kind} {text[:300]}"
