"""cli_called and the recording shims of `sandbox.record_cli` (coder-eval 0.12.16's, no Django).

`write_recorders(workspace, entries, interpreter)` writes, before the agent runs, one shim per
shadowed tool into `cli_mocks/` (the runner puts that folder first on the agent's PATH) and an
empty `cli_mocks/calls.jsonl`. A shim answers each call from its entry (or the first response
rule whose `when` matches, through `argv_match`, written beside it when a rule needs it) and
appends a record: `{"ts", "tool", "argv", "exit"}`, plus `rule` (the index of the rule that
answered), `rule_error` (a rule raised) or `sidecar_error` (the matcher did not load). A failed
write leaves `calls.jsonl.error` beside the log.

`cli_called` counts the records matching its pattern and scores 1.0 when the count is within
[min_count, max_count], else 0.0. Every way the log cannot be trusted fails the check (never an
error: the agent can write the log): the log missing, an `.error` file, a record with
`sidecar_error` or `rule_error`, a line that is not a record with an `argv` list of strings.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from experiments_app.specs import argv_match
from experiments_app.specs.cli_recording import (
    RECORD_CLI_DIR,
    RECORD_CLI_LOG_NAME,
    SIDECAR_MODULE,
    RecordedCli,
)
from experiments_app.specs.criteria import CliCalled
from runs_app.engine.criteria.base import (
    ROW_PLACEHOLDER,
    CriterionConfigError,
    CriterionType,
    GradingContext,
    read_text,
)

SHIM = '''#!{interpreter}
"""Recording shim for {tool!r}, written by evalsite (sandbox.record_cli): nothing real runs."""
import json, os, sys, time

TOOL = {tool!r}
EXIT_CODE, STDOUT, STDERR = {exit_code!r}, {stdout!r}, {stderr!r}
RULES = {rules!r}
HERE = os.path.dirname(os.path.abspath(__file__))
LOG = os.path.join(HERE, {log!r})
select_rule, SIDECAR_ERROR = None, None
if RULES:
    # Loaded by path, with this agent-writable folder off sys.path, so no file planted here
    # can stand in for the matcher or for a module it imports.
    sys.dont_write_bytecode = True
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != os.path.realpath(HERE)]
    try:
        import importlib.util
        spec = importlib.util.spec_from_file_location("_evalsite_argv_match", os.path.join(HERE, {sidecar!r}))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        select_rule = module.select_rule
    except Exception as exc:
        SIDECAR_ERROR = repr(exc)


def answer(argv):
    if not RULES or select_rule is None:
        return EXIT_CODE, STDOUT, STDERR, None, None
    try:
        chosen = select_rule(RULES, argv)
    except Exception as exc:
        return EXIT_CODE, STDOUT, STDERR, None, repr(exc)
    if chosen is None:
        return EXIT_CODE, STDOUT, STDERR, None, None
    index, rule = chosen
    return rule["exit"], rule["stdout"], rule["stderr"], index, None


def main():
    argv = sys.argv[1:]
    code, out, err, rule, rule_error = answer(argv)
    record = {{"ts": round(time.time(), 3), "tool": TOOL, "argv": argv, "exit": code}}
    if rule is not None:
        record["rule"] = rule
    if rule_error is not None:
        record["rule_error"] = rule_error
    if SIDECAR_ERROR is not None:
        record["sidecar_error"] = SIDECAR_ERROR
    try:
        with open(LOG, "a", encoding="utf-8") as log:
            log.write(json.dumps(record) + "\\n")
    except OSError as exc:
        try:
            with open(LOG + ".error", "a", encoding="utf-8") as sentinel:
                sentinel.write("%r %r\\n" % (exc, argv))
        except OSError:
            pass
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code


sys.exit(main())
'''


def render_shim(entry: RecordedCli, interpreter: str) -> str:
    rules = [
        {"when": response.when.match_spec, "exit": response.exit_code, "stdout": response.stdout,
         "stderr": response.stderr}
        for response in entry.responses
    ]  # fmt: skip
    return SHIM.format(
        interpreter=interpreter, tool=entry.tool, exit_code=entry.exit_code, stdout=entry.stdout,
        stderr=entry.stderr, rules=rules, log=RECORD_CLI_LOG_NAME, sidecar=SIDECAR_MODULE,
    )  # fmt: skip


def write_recorders(workspace: Path, entries: list[dict], interpreter: str, mock_dirs: list[Path]) -> Path:
    """The recorder folder, written afresh: a shim per entry, the matcher when a rule needs it,
    an empty log. A tool a `mock_path_dirs` folder already provides is refused (which of the two
    ran would depend on PATH order)."""
    parsed = [RecordedCli.model_validate(entry) for entry in entries]
    for folder in mock_dirs:
        for entry in parsed:
            if (folder / entry.tool).exists():
                raise ValueError(
                    f"record_cli would write a {entry.tool!r} shim, but the mock_path_dirs folder "
                    f"{folder.name!r} already provides one: keep one of the two"
                )
    folder = workspace / RECORD_CLI_DIR
    if folder.is_symlink() or folder.is_file():
        folder.unlink()
    folder.mkdir(exist_ok=True)
    for stale in folder.iterdir():
        if stale.is_file() or stale.is_symlink():
            stale.unlink()
    (folder / RECORD_CLI_LOG_NAME).write_text("", encoding="utf-8")
    for entry in parsed:
        shim = folder / entry.tool
        shim.write_text(render_shim(entry, interpreter), encoding="utf-8")
        shim.chmod(0o755)
    if any(entry.responses for entry in parsed):
        (folder / SIDECAR_MODULE).write_text(
            Path(argv_match.__file__).read_text(encoding="utf-8"), encoding="utf-8"
        )
    return folder


def parse_log(text: str) -> tuple[list[tuple[list[str], dict[str, Any]]], int]:
    """The usable records (argv, record), and how many lines are not one."""
    usable, unusable = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            unusable += 1
            continue
        argv = record.get("argv") if isinstance(record, dict) else None
        if isinstance(argv, list) and all(isinstance(item, str) for item in argv):
            usable.append((argv, record))
        else:
            unusable += 1
    return usable, unusable


def _criterion(params: dict) -> CliCalled:
    try:
        return CliCalled.model_validate({"type": "cli_called", **params})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise CriterionConfigError(f"cli_called: {where + ': ' if where else ''}{first['msg']}") from None


def check_cli_called(params: dict) -> None:
    known = set(CliCalled.model_fields) - {"type", "description", "weight", "pass_threshold", "gating",
                                           "suite_thresholds"}  # fmt: skip
    unknown = sorted(set(params) - known)
    if unknown:
        raise CriterionConfigError(
            f"cli_called: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}"
        )
    if ROW_PLACEHOLDER not in json.dumps(params, default=str):  # a dataset row's is checked once filled in
        _criterion(params)


def evaluate_cli_called(params: dict, ctx: GradingContext) -> tuple[float, dict]:
    criterion = _criterion(params)
    details: dict[str, Any] = {"log": criterion.log}
    text, problem = read_text(ctx, criterion.log)
    if text is None:
        return 0.0, details | {"problem": f"the invocation log {criterion.log!r} cannot be read: {problem}"}
    sentinel, _ = read_text(ctx, criterion.log + ".error")
    if sentinel is not None:
        lines = sentinel.strip().splitlines()
        return 0.0, details | {
            "problem": f"the recorder could not write {len(lines)} record(s) to the log, so it is "
            "incomplete; "
            f"first: {lines[0] if lines else '?'}"
        }
    usable, unusable = parse_log(text)
    mine = [
        (argv, record)
        for argv, record in usable
        if criterion.tool is None or record.get("tool") == criterion.tool
    ]
    for key, what in (
        ("sidecar_error", "could not load its matcher"),
        ("rule_error", "could not evaluate its rules"),
    ):
        broken = [record for _, record in mine if record.get(key) is not None]
        if broken:
            return 0.0, details | {
                "problem": f"the recorder {what} on {len(broken)} call(s), so the agent saw answers the task "
                f"did not describe; first: {broken[0][key]!r}"
            }
    if unusable:
        return 0.0, details | {
            "problem": f"{unusable} line(s) of the log are not records with an argv list of strings: the log "
            "cannot be trusted"
        }
    spec = criterion.match_spec
    count = sum(1 for argv, _ in mine if argv_match.argv_matches(spec, argv))
    low, high = criterion.min_count, criterion.max_count
    score = 1.0 if count >= low and (high is None or count <= high) else 0.0
    details |= {"match_count": count, "min_count": low, "max_count": high, "recorded": len(usable)}
    if score == 0.0 and count < low:
        details["examples"] = [shlex.join(argv)[:120] for argv, _ in usable[:3]]
    if score == 1.0 and count == 0 and high == 0:
        details["note"] = "no call matched: a typo in the verb, tool or flags would match nothing too"
    return score, details


CRITERIA = [CriterionType("cli_called", check_cli_called, evaluate_cli_called)]
