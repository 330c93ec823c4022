"""coder-eval 0.12.16 and evalsite grade the same agent's work with the criteria a suite uses.

Usage: .venv/bin/python bench/criteria_side_by_side.py --coder-eval PATH [--keep]

One scripted model (runs_app/tests/mock_servers.AnthropicMock, on 127.0.0.1) plays both the agent
and the `agent_judge`'s model. The agent writes solution.py, calls a `record_cli` shim twice and
engages a skill; the judge reads a file and submits a verdict. The same task YAML is then run
by both tools with the Claude Code CLI (coder-eval: its SDK's bundled CLI, with
ANTHROPIC_BASE_URL pointing at the mock; evalsite: the project's CLI through a real Celery worker
and the trial's gateway), and every criterion's score is printed side by side:

    criterion                     coder-eval  evalsite  agree

The criteria: reference_comparison (ast, token, complexity), commands_efficiency (under and over
budget), skill_triggered (a positive and a distractor), cli_called (a verb with a flag, a
must-not guard, a verb_any_of), command_executed, agent_judge. Exit code 0 when every score
agrees, 1 otherwise, 2 when coder-eval cannot be run. About a minute on 2 cores.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runs_app.tests.mock_servers import AnthropicMock, Turn, text, tool_use  # noqa: E402

VERDICT_TOOLS = {
    "evalsite": "mcp__evalsite_judge__submit_verdict",
    "coder-eval": "mcp__coder_eval_judge__submit_verdict",
}
SOLUTION = "def add(a, b):\n    total = a + b\n    if total < 0:\n        return 0\n    return total\n"
REFERENCE = "def add(a, b):\n    return a + b\n"
TASK = """
task_id: side-by-side
description: the criteria a suite uses, graded by both tools
initial_prompt: Write solution.py, list the projects with uip, then use the pdf skill.
agent: {type: claude-code, model: claude-sonnet-4-6, allowed_tools: [Bash, Write, Skill]}
reference: {directory: ref}
run_limits: {max_turns: 10}
sandbox:
  python: null
  record_cli:
    - tool: uip
      stderr: "not configured"
      responses:
        - when: {verb: projects list}
          stdout: '[{"id": "proj-1"}]'
success_criteria:
  - {type: reference_comparison, agent_file: solution.py, reference_file: solution.py, description: ref ast}
  - {type: reference_comparison, agent_file: solution.py, reference_file: solution.py,
     comparison_method: token, description: ref token}
  - {type: reference_comparison, agent_file: solution.py, reference_file: solution.py,
     comparison_method: complexity, description: ref complexity}
  - {type: commands_efficiency, expected_commands: 2, description: efficiency over budget}
  - {type: commands_efficiency, expected_commands: 9, description: efficiency under budget}
  - {type: skill_triggered, skill_name: pdf, expected_skill: pdf, description: skill positive}
  - {type: skill_triggered, skill_name: docx, expected_skill: pdf, description: skill distractor}
  - {type: cli_called, tool: uip, verb: projects list, flags: {format: json}, value_flags: [format],
     description: cli verb and flag}
  - {type: cli_called, tool: uip, verb: projects delete, min_count: 0, max_count: 0, description: cli guard}
  - {type: cli_called, verb_any_of: [projects get, projects show], description: cli verb_any_of}
  - {type: cli_called, tool: uip, verb: projects, min_count: 2, description: cli two calls}
  - {type: command_executed, tool_name: Bash, command_pattern: "uip projects", description: bash ran}
  # coder-eval runs as root here, where the CLI refuses its default bypassPermissions.
  - {type: agent_judge, prompt: "Is add() right?", files: [solution.py],
     agent: {type: claude-code, permission_mode: acceptEdits}, description: agent judge}
"""


def script(body: dict, verdict_tool: str) -> Turn:
    """The agent's or the judge's next answer: step = tool results in the conversation so far."""
    step = sum(
        1
        for message in body.get("messages") or []
        if isinstance(message.get("content"), list)
        for block in message["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    )
    if "strict code reviewer" in json.dumps(body.get("system", "")):
        judge = [
            Turn([tool_use("Bash", {"command": "cat solution.py"})]),
            Turn([tool_use(verdict_tool, {"score": 0.75, "rationale": "Mostly right.", "findings": ["ok"]})]),
        ]
        return judge[step] if step < len(judge) else Turn([text("Verdict submitted.")])
    if not body.get("tools"):
        return Turn([text("ok")])  # the CLI's side requests (titles, summaries)
    agent = [
        Turn([tool_use("Write", {"file_path": "solution.py", "content": SOLUTION})]),
        Turn([tool_use("Bash", {"command": "uip projects list --format json"})]),
        Turn([tool_use("Bash", {"command": "uip projects get proj-1"})]),
        Turn([tool_use("Skill", {"skill": "pdf"})]),
    ]
    return agent[step] if step < len(agent) else Turn([text("Done.")])


def write_task(folder: Path) -> Path:
    (folder / "ref").mkdir(parents=True)
    (folder / "ref" / "solution.py").write_text(REFERENCE)
    task = folder / "task.yaml"
    task.write_text(TASK)
    return task


def coder_eval_scores(exe: Path, scratch: Path) -> dict[str, float | None]:
    folder = scratch / "coder-eval"
    task = write_task(folder)
    home = scratch / "ce-home"
    home.mkdir()
    with AnthropicMock(responder=lambda body: script(body, VERDICT_TOOLS["coder-eval"])) as api:
        env = {
            **os.environ, "HOME": str(home), "TELEMETRY_ENABLED": "false",
            "ANTHROPIC_API_KEY": "sk-test-mock", "ANTHROPIC_BASE_URL": api.url,
        }  # fmt: skip
        done = subprocess.run(
            [str(exe), "run", str(task), "--run-dir", str(folder / "run"), "--preservation-mode", "NONE"],
            cwd=folder, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    found = glob.glob(str(folder / "run" / "**" / "task.json"), recursive=True)
    if not found:
        sys.exit(
            f"coder-eval wrote no task.json (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}"
        )
    data = json.loads(Path(found[0]).read_text())
    results = {}
    for result in data.get("success_criteria_results") or []:
        results[result["description"]] = (
            None if result.get("error") and result["criterion_type"].endswith("judge") else result["score"]
        )
    return results


def evalsite_scores(scratch: Path) -> tuple[dict[str, float | None], dict[str, str]]:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")
    if not os.environ.get("DATABASE_URL"):
        os.environ["SQLITE_PATH"] = str(scratch / "side-by-side.sqlite3")
    if not os.environ.get("CELERY_BROKER_URL"):
        os.environ["BROKER_DIR"] = str(scratch / "broker")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from experiments_app.definitions import adhoc_experiment, import_tasks
    from runs_app.launching import LaunchOptions, launch_run
    from runs_app.models import CriterionResult, Run, Trial

    task = write_task(scratch / "evalsite")
    slugs = import_tasks([task]).task_slugs
    with AnthropicMock(responder=lambda body: script(body, VERDICT_TOOLS["evalsite"])) as api:
        env = {**os.environ, "ANTHROPIC_API_KEY": "sk-test-mock", "ANTHROPIC_BASE_URL": api.url,
               "EVALSITE_JUDGE_PROVIDER": "anthropic"}  # fmt: skip
        log = (scratch / "worker.log").open("w")
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "evalsite", "worker", "-c", "1", "--loglevel=WARNING",
             "--without-gossip", "--without-mingle", "-n", "side-by-side@%h"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            run = launch_run(adhoc_experiment(None, None), options=LaunchOptions(task_slugs=slugs))
            deadline = time.monotonic() + 600
            while not Run.objects.get(pk=run.pk).is_final:
                if time.monotonic() > deadline:
                    sys.exit(f"evalsite's run did not finish: see {scratch / 'worker.log'}")
                time.sleep(0.3)
        finally:
            os.killpg(worker.pid, 9)
            worker.wait()
    trial = Trial.objects.get(run=run)
    results, errors = {}, {}
    for row in CriterionResult.objects.filter(trial=trial):
        results[row.description] = None if row.error else row.score
        if row.error:
            errors[row.description] = row.error
    if trial.error_message and not errors:
        errors["trial"] = trial.error_message
    return results, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coder-eval", type=Path, required=True, help="the coder-eval 0.12.16 executable")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args()
    if not args.coder_eval.exists():
        sys.exit(2)
    scratch = Path(tempfile.mkdtemp(prefix="criteria-sbs-"))
    started = time.monotonic()
    ce = coder_eval_scores(args.coder_eval, scratch)
    es, errors = evalsite_scores(scratch)
    names = [name for name in ce if name in es] + [name for name in es if name not in ce]
    print(f"{'criterion':<28}{'coder-eval':>12}{'evalsite':>10}  agree")
    disagree = 0
    for name in names:
        a, b = ce.get(name), es.get(name)
        same = a is not None and b is not None and round(a, 6) == round(b, 6)
        disagree += not same
        shown = [f"{v:.6f}" if isinstance(v, float) else str(v) for v in (a, b)]
        print(f"{name:<28}{shown[0]:>12}{shown[1]:>10}  {'yes' if same else 'NO'}")
    for name, error in errors.items():
        print(f"  evalsite error, {name}: {error[:300]}")
    seconds = time.monotonic() - started
    print(f"{len(names)} criteria: {len(names) - disagree} agree, {disagree} differ ({seconds:.0f} s)")
    if not args.keep:
        subprocess.run(["rm", "-rf", str(scratch)], check=False)
    sys.exit(1 if disagree else 0)


if __name__ == "__main__":
    main()
