"""The agent's phase of a trial: its gateway, its process (or the turns of a simulated
conversation, each resuming the session), the live parsing of its output and the limits that
stop it. `AgentPhase(box, context).run()` returns an `AgentResult`: the trial's outcome so far and
what grading reads of the agent's run; grading follows.
"""

import dataclasses
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from experiments_app.specs.agent_kinds import PREAMBLE_OPTION
from experiments_app.specs.claude_options import plugin_path
from experiments_app.specs.cli_recording import RECORD_CLI_DIR
from runs_app.engine import agents, criteria, gateway, grading, trial_container
from runs_app.engine.agents import base as agent_base
from runs_app.engine.context import TrialContext, stopped
from runs_app.engine.criteria import early_stop
from runs_app.engine.gateway import roles
from runs_app.engine.grading import AgentTrace
from runs_app.engine.outcome import AGENT_ERROR_CATEGORIES, Outcome, TrialAborted
from runs_app.engine.recording import redact
from runs_app.engine.sandbox import Limits, Mount, Phase, ProcessResult
from runs_app.engine.simulation import answerers, conversation
from runs_app.engine.trial_sandbox import TrialSandbox
from runs_app.engine.usage import Usage, budget_crossed, summed
from runs_app.models import Trial, TrialEvent

DEFAULT_TASK_TIMEOUT = 600
MAX_PARSED_BYTES = 64 << 20


@dataclass
class AgentResult:
    """How the agent's phase ended: the trial's outcome so far (graded next unless an error or a
    cancel), what grading reads of the agent's run, and the seconds its processes ran."""

    outcome: Outcome
    trace: AgentTrace
    process_seconds: float = 0.0


@dataclass
class AgentRun:
    """The agent's process for one trial: one run, or the turns of a conversation in one session."""

    kind: agents.AgentKind
    config: dict
    gateway: gateway.Gateway | None
    secrets: dict[str, str]
    limits: Limits
    session: str = ""
    budget: str = ""  # a role's budget that ended the conversation ("answerer.max_usd")
    turn_timed_out: str = ""  # coder-eval's message for the turn that ran past run_limits.turn_timeout
    turns: list[tuple[agent_base.AgentOutcome, ProcessResult | None]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    @property
    def last(self) -> agent_base.AgentOutcome:
        return self.turns[-1][0]

    @property
    def tool_calls(self) -> list[dict]:
        return [call for outcome, _ in self.turns for call in outcome.tool_calls]

    @property
    def seconds(self) -> float:
        return sum(result.duration_seconds for _, result in self.turns if result is not None)

    def add(self, outcome: agent_base.AgentOutcome, result: ProcessResult | None, session: str) -> None:
        self.turns.append((outcome, result))
        self.session = session or self.session

    def usage_with(self, current: Usage) -> Usage:
        """What the agent reported over its earlier turns, plus `current`."""
        return summed([*(outcome.usage for outcome, _ in self.turns), current])

    def limits_now(self, turn_timeout: float | None) -> tuple[Limits, bool]:
        """The next turn's limits, and whether `turn_timeout` is what bounds its clock. The task's
        wall clock covers the whole conversation; coder-eval's `turn_timeout` bounds each turn
        (each `communicate()`) on its own."""
        left = max(1.0, self.limits.wall_seconds - (time.monotonic() - self.started))
        by_turn = turn_timeout is not None and turn_timeout < left
        wall = float(turn_timeout) if by_turn and turn_timeout is not None else left
        return dataclasses.replace(self.limits, wall_seconds=wall), by_turn

    def outcome(self) -> agent_base.AgentOutcome:
        """The whole run as one outcome: how the last turn ended, every turn's tool calls and
        usage (the gateway's count when it saw calls: it counted every turn)."""
        usage = summed([outcome.usage for outcome, _ in self.turns])
        if self.gateway is not None and self.gateway.calls:
            usage = self.gateway.totals()
        denials = [denial for outcome, _ in self.turns for denial in outcome.permission_denials]
        return dataclasses.replace(
            self.last, tool_calls=self.tool_calls, usage=usage, permission_denials=denials
        )

    def result(self) -> ProcessResult | None:
        """How the last process ended, with every turn's output."""
        results = [result for _, result in self.turns if result is not None]
        if len(results) < 2:
            return results[0] if results else None
        return dataclasses.replace(
            results[-1],
            stdout="".join(result.stdout for result in results),
            stderr="".join(result.stderr for result in results),
            duration_seconds=self.seconds,
        )


class AgentPhase:
    def __init__(self, box: TrialSandbox, context: TrialContext) -> None:
        self.box = box
        self.context = context
        self.trace = AgentTrace()
        self.process_seconds = 0.0

    def run(self) -> AgentResult:
        return AgentResult(self._outcome(), self.trace, self.process_seconds)

    def _outcome(self) -> Outcome:
        kind_name = self.context.agent_kind()
        try:
            kind = agents.get_agent(kind_name)
        except (agents.UnknownAgentKind, agents.AgentSetupError) as exc:
            return Outcome(Trial.Status.ERROR, "setup", str(exc))
        try:
            agent_config = self._agent_config()
        except TrialAborted as exc:
            return Outcome(Trial.Status.ERROR, exc.category, str(exc))
        if refused := _refused_secrets(agent_config.get("secrets") or []):
            return refused
        model_gateway = self._gateway_for(kind, agent_config)
        try:
            return self._run_agent_process(kind, agent_config, model_gateway)
        finally:
            if model_gateway is not None:
                model_gateway.close()

    def _gateway_for(self, kind: agents.AgentKind, agent_config: dict) -> gateway.Gateway | None:
        """The trial's model gateway, for kinds that call a model API: the agent gets placeholder
        keys and the gateway's URLs; the real keys stay in this process."""
        apis = kind.apis(agent_config)
        if not apis:
            return None
        upstreams = []
        for api in apis:
            base_url = (len(apis) == 1 and agent_config.get("base_url")) or ""
            upstream = gateway.upstream(api, os.environ, str(base_url), str(agent_config.get("region") or ""))
            upstreams.append(upstream)
            if upstream.key:
                self.context.secret_values.append(upstream.key)
        box = self.context.config.get("sandbox") or {}
        return gateway.Gateway(
            gateway.socket_path_for(self.box.root),
            upstreams,
            limits=self.context.config.get("run_limits") or {},
            prices=agent_config.get("prices"),
            allowed_hosts=list(box.get("allowed_hosts") or []),
        ).start()

    def _sandbox_secrets(
        self, kind: agents.AgentKind, agent_config: dict, model_gateway: gateway.Gateway | None
    ) -> dict[str, str]:
        """What `prepare` may read as the worker's environment: the gateway's placeholders for the
        model keys it holds, and the other agent secrets (AGENT_SECRET_NAMES) themselves."""
        values = {name: os.environ[name] for name in settings.AGENT_SECRET_NAMES if os.environ.get(name)}
        if model_gateway is not None:
            apis = kind.apis(agent_config)
            for name in gateway.worker_variables(apis):  # the gateway holds them
                values.pop(name, None)
            values |= gateway.sandbox_variables(
                [model_gateway.upstreams[api] for api in apis], every_key=False
            )
        return values

    def _run_agent_process(
        self, kind: agents.AgentKind, agent_config: dict, model_gateway: gateway.Gateway | None
    ) -> Outcome:
        box_secrets = self._sandbox_secrets(kind, agent_config, model_gateway)
        if model_gateway is not None and len(kind.apis(agent_config)) == 1:
            agent_config = {
                **agent_config,
                "base_url": model_gateway.upstreams[kind.apis(agent_config)[0]].sandbox_url,
            }
        run = AgentRun(kind, agent_config, model_gateway, box_secrets, self._agent_limits())
        simulation = self._simulation()
        if simulation is None:
            failure = self._agent_turn(run, self.context.trial.prompt)
        else:
            failure = self._converse(run, simulation)
        if failure is not None:
            return failure
        agent = run.outcome()
        self.context.recorder.add(TrialEvent.Kind.USAGE, agent.usage.as_dict())
        upstream_failed = model_gateway is not None and model_gateway.upstream_failures > 0
        outcome = self._agent_outcome(agent, run.result(), upstream_failed)
        if run.turn_timed_out and outcome.status == Trial.Status.RUNNING:
            # coder-eval 0.12.16: a turn past `turn_timeout` is a terminal agent timeout, the
            # task's status `error` (not graded); the task's own `task_timeout` is graded instead.
            outcome.status, outcome.error_category = Trial.Status.ERROR, "timeout"
            outcome.error_message, outcome.timed_out = run.turn_timed_out, True
        if run.budget and outcome.status == Trial.Status.RUNNING and not outcome.budget_exceeded:
            outcome.budget_exceeded = run.budget  # graded, flagged: the answerer's budget ran out
        return outcome

    def _agent_turn(self, run: "AgentRun", prompt: str, turn: int = 1) -> Outcome | None:
        """One run of the agent's process: its first (`prepare`) or a later turn of a conversation
        (`resume`, in the session the last turn reported). None when it ran (`run` holds how it
        ended), else the error that kept it from starting."""
        kind, model_gateway = run.kind, run.gateway
        cwd, home = self.box.paths.workspace, self.box.paths.home
        prompt = with_preamble(prompt, self.box.working_directory(), run.config)
        try:
            if turn == 1:
                invocation = kind.prepare(prompt, cwd, home, run.config, run.secrets)
            else:
                config = {**run.config, "turn": turn}
                invocation = kind.resume(prompt, run.session, cwd, home, config, run.secrets)
        except agents.AgentSetupError as exc:
            return Outcome(Trial.Status.ERROR, "setup", str(exc))
        if refused := _refused_secrets(invocation.secrets_needed):
            return refused
        secrets = {name: run.secrets[name] for name in invocation.secrets_needed if run.secrets.get(name)}
        self.context.secret_values += [
            value for value in secrets.values() if value != gateway.PLACEHOLDER_KEY
        ]
        agent_base.write_files(invocation)
        self.box.give_workspace_to_sandbox()
        parser = kind.parser(run.config)
        run_limits = self.context.config.get("run_limits") or {}
        state: dict[str, Any] = {"limit": None, "parsed": 0, "parse_stopped": False}
        watcher = early_stop.Watcher.for_config(self.context.config)
        recorder = self.context.recorder

        def record_calls() -> None:
            if model_gateway is not None:
                for call in model_gateway.drain():
                    recorder.add(TrialEvent.Kind.USAGE, call)

        def on_line(line: str) -> None:
            # A hostile agent may print gigabytes: past this much, lines are not parsed (the
            # process still runs, bounded by its wall clock; its stored output is capped).
            state["parsed"] += len(line)
            if state["parsed"] > MAX_PARSED_BYTES:
                if not state["parse_stopped"]:
                    state["parse_stopped"] = True
                    recorder.add(TrialEvent.Kind.SYSTEM, {"text": "output too large: parsing stopped"})
                return
            events = parser.feed_line(line)
            for event in events:
                recorder.add(event.kind, event.data)
            if state["limit"] is None:  # what the agent itself reports counts too, over every turn
                state["limit"] = budget_crossed(run.usage_with(parser.usage), run_limits)
            if state["limit"] is None and any(e.kind in ("tool_call", "tool_result") for e in events):
                calls = [*run.tool_calls, *parser.tool_calls]
                state["limit"] = self._tool_call_limit(calls, run_limits, watcher)

        def should_stop() -> str | None:
            recorder.flush_if_due()  # the agent's phase and what it printed
            record_calls()
            if model_gateway is not None and state["limit"] is None:
                state["limit"] = model_gateway.stop_reason()
            if state["limit"] is None and self.box.disk_exceeded():
                state["limit"] = "disk"
            lease = self.context.heartbeat.stop_reason() if self.context.heartbeat is not None else None
            return lease or (state["limit"] and "budget") or (parser.fatal and "fatal")

        result = None
        limits, by_turn = run.limits_now(run_limits.get("turn_timeout"))
        if invocation.argv is not None:
            result = self.box.run(
                invocation.argv,
                limits=limits,
                env={**secrets, **self._mock_path(), **invocation.env_extra},
                mounts=self._agent_mounts(run.config),
                via=model_gateway,
                stdin=invocation.stdin,
                on_stdout_line=on_line,
                should_stop=should_stop,
                # Output is acted on as it comes (see sandbox.process.run); the clock is for the
                # rest: cancel, a lost lease, the gateway's budget, the disk. A tenth of a second
                # cost a worker of 256 agents a core in wakeups.
                poll_interval=1.0,
            )
        if model_gateway is not None:
            model_gateway.settle()
        record_calls()
        if model_gateway is not None and state["limit"] is None:
            state["limit"] = model_gateway.stop_reason()
        if state["limit"] is None and result is not None:
            state["limit"] = _resource_limit(result)
        if by_turn and result is not None and result.timed_out:
            # coder-eval's `format_timeout_reason`, with the turn as its iteration.
            run.turn_timed_out = f"Agent turn timed out after {limits.wall_seconds:.0f}s (iteration {turn})"
            recorder.add(TrialEvent.Kind.SYSTEM, {"text": run.turn_timed_out})
        run.add(kind.finish(result, parser, limit_hit=state["limit"]), result, parser.session_id)
        self.process_seconds = run.seconds
        return None

    def _simulation(self) -> dict | None:
        simulation = self.context.config.get("simulation") or {}
        return simulation if simulation.get("enabled") else None

    def _converse(self, run: "AgentRun", simulation: dict) -> Outcome | None:
        """A simulated user's conversation with the agent (`conversation.converse`); None when it
        ran to its end (graded next), else the error that ended the trial."""
        name = simulation.get("answerer") or ("scripted" if simulation.get("answers") else "persona")
        try:
            answerer = answerers.get_answerer(name)
        except answerers.UnknownAnswerer as exc:
            return Outcome(Trial.Status.ERROR, "setup", str(exc))
        if not run.kind.can_resume:
            return Outcome(
                Trial.Status.ERROR, "setup",
                f"agent kind {self.context.agent_kind()} cannot resume a session, which a simulation needs",
            )  # fmt: skip
        client = None
        if answerer.needs_model:
            try:
                _, upstream = roles.endpoint(os.environ, "EVALSITE_ANSWERER_PROVIDER")
            except roles.ModelCallError as exc:
                return Outcome(Trial.Status.ERROR, "setup", f"the {name} answerer cannot call a model: {exc}")
            self.context.secret_values.append(upstream.key)
            client = roles.RoleClient(
                "answerer", self.box.root / "answerer.sock", upstream, self.context.budget("answerer")
            )
        details = {
            **simulation,
            "model": simulation.get("model") or os.environ.get("EVALSITE_ANSWERER_MODEL") or None,
            "description": self.context.config.get("description") or "",
        }
        failures: list[Outcome] = []

        def take_turn(prompt: str, turn: int) -> conversation.TurnEnd:
            failure = self._agent_turn(run, prompt, turn)
            if failure is not None:
                failures.append(failure)
                return conversation.TurnEnd("", completed=False)
            return conversation.TurnEnd(run.last.final_text, run.last.status == agent_base.COMPLETED)

        def tokens_used() -> int:
            return run.outcome().usage.total_tokens + (client.totals().total_tokens if client else 0)

        try:
            ending = conversation.converse(
                details, self.context.trial.prompt or None, take_turn, answerer, client,
                self.context.recorder.add, passed_now=lambda: self._passes_now(run), tokens_used=tokens_used,
            )  # fmt: skip
        finally:
            if client is not None:
                client.close()
                self.context.account(client)
        self.context.recorder.add(TrialEvent.Kind.SYSTEM, ending.event())
        self.trace.dialog = [{"role": m.role, "text": m.text} for m in ending.messages]
        self.trace.conversation_end = {"reason": ending.reason, "turns": ending.turns}
        if failures:
            return failures[0]
        if ending.error:
            return Outcome(Trial.Status.ERROR, "answerer", ending.error)
        run.budget = ending.budget
        return None

    def _passes_now(self, run: "AgentRun") -> bool:
        """The criteria judged on the workspace as it is between two turns (`check_criteria`)."""
        agent = run.outcome()
        trace = dataclasses.replace(self.trace, tool_calls=agent.tool_calls, final_text=agent.final_text)
        return grading.passes_now(self.box, self.context, trace)

    def _tool_call_limit(
        self, calls: list[dict], run_limits: dict, watcher: early_stop.Watcher | None
    ) -> str | None:
        """`max_tool_calls` crossed, or an armed criterion decided the trial (coder-eval's early
        stop): either stops the agent, which is then graded."""
        most = run_limits.get("max_tool_calls")
        if most is not None and len(calls) > most:
            return "max_tool_calls"
        if watcher is not None and (stop := watcher.observe(criteria.graded_calls(calls))):
            self.trace.early_stop = stop
            self.context.recorder.add(TrialEvent.Kind.SYSTEM, stop.event())
            return "early_stop"
        return None

    def _agent_outcome(
        self, agent: agent_base.AgentOutcome, result: ProcessResult | None, upstream_failed: bool
    ) -> Outcome:
        self.trace.tool_calls, self.trace.final_text = agent.tool_calls, agent.final_text
        secret_values = self.context.secret_values
        cap = settings.AGENT_OUTPUT_CAP_BYTES
        outcome = Outcome(
            Trial.Status.RUNNING,
            visible_turns=len(agent.tool_calls) + (1 if agent.final_text else 0),
            usage=agent.usage,
            exit_code=agent.exit_code,
            stdout=redact(result.stdout[:cap], secret_values) if result else "",
            stderr=redact(result.stderr[:cap], secret_values) if result else "",
        )
        if agent.status == agent_base.CANCELLED or (result and result.stop_reason == "lease_lost"):
            lost = result is not None and result.stop_reason == "lease_lost"
            ended = stopped("lease_lost" if lost else "cancelled")
            outcome.status = ended.status
            outcome.error_category, outcome.error_message = ended.error_category, ended.error_message
            return outcome
        if agent.status == agent_base.ERROR:
            outcome.status = Trial.Status.ERROR
            outcome.error_category = agent.error_category or "agent_error"
            outcome.error_message = redact(agent.error or "the agent failed", secret_values)
            if outcome.error_category not in AGENT_ERROR_CATEGORIES and not upstream_failed:
                # What the agent's own stream says is not evidence: an agent (or a command it ran,
                # writing to its stream) could claim the API failed to leave the pass rate. Only
                # a failure its gateway saw makes it an infrastructure error.
                outcome.error_message += (
                    f" (reported as {outcome.error_category}, but the gateway saw no failure of the "
                    "model's API: counted as the agent's error)"
                )
                outcome.error_category = "agent_error"
        elif agent.status == agent_base.LIMIT and agent.limit == "early_stop":
            outcome.stopped_early = self.trace.early_stop.reason if self.trace.early_stop else "early_stop"
        elif agent.status == agent_base.LIMIT:
            outcome.timed_out = agent.limit == "timeout"
            outcome.budget_exceeded = "" if agent.limit == "timeout" else (agent.limit or "")
        return outcome

    def _agent_config(self) -> dict:
        trial = self.context.trial
        config = dict(self.context.config.get("agent") or {})
        row = f"/{trial.dataset_row_id}" if trial.dataset_row_id else ""
        config["task_id"] = trial.task_version.task.slug + row
        reference = self.box.reference_dir()
        if reference is not None:
            config["reference_path"] = str(reference)
            script = (self.context.config.get("reference") or {}).get("script")
            if script and self.box.container:  # Harbor's solution/solve.sh, run at /solution
                config["reference_script"] = str(trial_container.SOLUTION / script)
                config["reference_env"] = dict((self.context.config.get("reference") or {}).get("env") or {})
        max_turns = (self.context.config.get("run_limits") or {}).get("max_turns")
        if max_turns and "max_turns" not in config:
            config["max_turns"] = max_turns
        if config.get("script"):
            bundle_dir, yaml_dir = self.box.origin("agent.script")
            script = (bundle_dir / yaml_dir / config["script"]).resolve()
            if not script.is_relative_to(bundle_dir.resolve()) or not script.is_file():
                raise TrialAborted("setup", f"agent.script {config['script']!r} is not a file in the bundle")
            config["script_path"] = str(script)
            command = config.get("command")
            if isinstance(command, list):
                config["command"] = [part.replace("{script}", str(script)) for part in command]
            elif isinstance(command, str):
                config["command"] = command.replace("{script}", str(script))
        if config.get("plugins"):
            # coder-eval's Claude Code plugins: folders of the bundle, mounted read-only for the agent.
            bundle_dir, yaml_dir = self.box.origin("agent.plugins")
            placed = []
            for plugin in config["plugins"]:
                folder = (bundle_dir / yaml_dir / plugin_path(str(plugin.get("path", "")))).resolve()
                if not folder.is_relative_to(bundle_dir.resolve()) or not folder.is_dir():
                    raise TrialAborted(
                        "setup", f"agent.plugins path {plugin.get('path')!r} is not a folder in the bundle"
                    )
                placed.append({**plugin, "path": str(folder)})
            config["plugins"] = placed
        if config.get("system_prompt_file"):
            # coder-eval: the file's text is the system prompt (the two are mutually exclusive).
            bundle_dir, yaml_dir = self.box.origin("agent.system_prompt_file")
            prompt_file = (bundle_dir / yaml_dir / config.pop("system_prompt_file")).resolve()
            if not prompt_file.is_relative_to(bundle_dir.resolve()) or not prompt_file.is_file():
                raise TrialAborted("setup", "agent.system_prompt_file is not a file in the bundle")
            config["system_prompt"] = prompt_file.read_text(encoding="utf-8")
        return config

    def _agent_limits(self) -> Limits:
        run_limits = self.context.config.get("run_limits") or {}
        box = (self.context.config.get("sandbox") or {}).get("limits") or {}
        wall = float(run_limits.get("task_timeout") or DEFAULT_TASK_TIMEOUT)
        if box.get("timeout"):  # the sandbox's own hard limit, when a layer sets one
            wall = min(wall, float(box["timeout"]))
        return self.box.limits(Phase.AGENT, wall)

    def _agent_mounts(self, agent_config: dict) -> list[Mount]:
        """The agent's script (agent.script) and plugin folders (agent.plugins), read-only:
        nothing else of the bundles; in a container, the worker's runtimes its CLI runs with, and
        the reference for its script."""
        script = agent_config.get("script_path")
        plugins = [Mount(Path(plugin["path"])) for plugin in agent_config.get("plugins") or []]
        mounts = ([Mount(Path(script))] if script else []) + plugins
        if agent_config.get("reference_script"):
            reference = Path(agent_config["reference_path"])
            mounts += trial_container.reference_script_mounts(self.box, reference)
        return [*self.box.runtime_mounts, *mounts]

    def _mock_path(self) -> dict[str, str]:
        """coder-eval's `sandbox.mock_path_dirs`: workspace folders whose plain files become
        executables first on the agent's PATH (missing folders are skipped, as there), after the
        `record_cli` shims' folder."""
        dirs = []
        workspace_dir = self.box.workspace
        box = self.context.config.get("sandbox") or {}
        if box.get("record_cli"):  # the recording shims come first (coder-eval's order)
            dirs.append(str(workspace_dir / RECORD_CLI_DIR))
        for relative in box.get("mock_path_dirs") or []:
            folder = (workspace_dir / relative).resolve()
            if not folder.is_relative_to(workspace_dir.resolve()) or not folder.is_dir():
                continue
            for entry in folder.iterdir():
                if entry.is_file() and not entry.is_symlink():
                    entry.chmod(entry.stat().st_mode | 0o111)
            dirs.append(str(folder))
        if not dirs:
            return {}
        if self.box.container:
            # In the image's folder the host's copy is not what runs: the container's own
            # folder is (its files keep the modes the task gave them).
            if self.box.in_image:
                dirs = [
                    str(self.box.command_folder(Path(d).relative_to(workspace_dir.resolve()))) for d in dirs
                ]
            return {"PATH": os.pathsep.join([*dirs, self.box.container_path_variable()])}
        return {"PATH": os.pathsep.join([*dirs, os.environ.get("PATH", os.defpath)])}


def with_preamble(prompt: str, workspace: Path, config: dict) -> str:
    """The prompt as the agent gets it: coder-eval 0.12.16 prefixes every prompt it sends (each
    turn of a conversation too) with the agent's working directory and a blank line; a variant
    sends the bare prompt with `working_directory_preamble: false`."""
    if config.get(PREAMBLE_OPTION, True) is False:
        return prompt
    return f"Your working directory is: {workspace}\n\n{prompt}"


def _resource_limit(result: ProcessResult) -> str | None:
    """The resource cap that ended the agent, if one did (recorded on the trial like a budget)."""
    if result.memory_exhausted:
        return "memory"
    if result.signal is None:
        return None
    return {signal.SIGXCPU: "cpu", signal.SIGXFSZ: "file_size"}.get(signal.Signals(result.signal))


def _refused_secrets(names: list[str]) -> Outcome | None:
    """A variant (or a launch override) names the variables it wants; only those the worker's
    operator declared as agent secrets may leave the worker's environment."""
    refused = sorted({str(name) for name in names} - set(settings.AGENT_SECRET_NAMES))
    if not refused:
        return None
    return Outcome(
        Trial.Status.ERROR,
        "setup",
        f"the agent asks for {', '.join(refused)}, which this worker does not hand to agents: "
        "add the name to AGENT_SECRET_NAMES in the worker's environment if it is an agent's key",
    )
