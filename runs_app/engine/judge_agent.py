"""Running an `agent_judge`'s agent: the Claude Code CLI in the trial's sandbox, in a copy of the
finished workspace, its model calls through the trial's judge gateway (`roles.RoleClient`:
counted, priced and budgeted as the judge's). What it is asked and how its verdict is read are the
criterion's (`criteria.agent_judge`); this module only runs it.

1. The workspace is copied beside the trial's (symbolic links and the request's ignored names
   left out), the reference solution into its `_reference/` when asked, and the copy is mounted
   over the workspace for this one command: what the judge changes never reaches the trial.
2. The `submit_verdict` MCP server (`criteria/verdict_server.py`) is copied next to it and
   named by `--mcp-config` (with `--strict-mcp-config`: no other server).
3. The CLI runs with an empty HOME and /tmp of its own (nothing the agent left there), under the
   grading phase's limits and the criterion's `turn_timeout`; its stream is parsed as an agent's.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import stat
from pathlib import Path

from runs_app.engine import agents, gateway
from runs_app.engine.agents import base as agent_base
from runs_app.engine.criteria import agent_judge, verdict_server
from runs_app.engine.criteria.base import JudgeAgentRequest, JudgeAgentRun
from runs_app.engine.gateway import roles
from runs_app.engine.sandbox import Mount, Phase, workspace
from runs_app.engine.trial_sandbox import TrialSandbox, shim_interpreter


class JudgeAgentRunner:
    """`GradingContext.run_judge_agent` on a worker: one call per agent_judge criterion."""

    def __init__(self, box: TrialSandbox, client: roles.RoleClient, secret_values: list[str]) -> None:
        self.box, self.client, self.secret_values = box, client, secret_values
        self.runs = 0

    def __call__(self, request: JudgeAgentRequest) -> JudgeAgentRun:
        self.runs += 1
        folder = self.box.root / f"judge-agent-{self.runs}"
        try:
            return self._run(request, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _run(self, request: JudgeAgentRequest, folder: Path) -> JudgeAgentRun:
        copy = folder / "workspace"
        folder.mkdir()
        os.chmod(folder, 0o755)
        shutil.copytree(
            self.box.paths.workspace, copy, symlinks=True, ignore=_ignored(request.ignore_patterns)
        )
        if request.reference_dir is not None:
            shutil.copytree(
                request.reference_dir, copy / agent_judge.REFERENCE_MOUNT, symlinks=True, ignore=_ignored(())
            )
        server = folder / "verdict_server.py"
        shutil.copyfile(verdict_server.__file__, server)
        os.chmod(server, 0o644)
        uid = self.box.paths.uid
        if uid is not None:
            os.chown(copy, uid, uid)
            workspace.chown_tree(copy, uid, uid)
        mcp = {
            "mcpServers": {
                agent_judge.SERVER: {"type": "stdio", "command": shim_interpreter(), "args": [str(server)]}
            }
        }
        upstream = self.client.gateway.upstreams["anthropic"]
        options = {
            **request.options,
            "max_turns": request.max_turns,
            "base_url": upstream.sandbox_url,
            "extra_args": ["--mcp-config", json.dumps(mcp), "--strict-mcp-config"],
        }
        kind = agents.get_agent("claude-code")
        secrets = gateway.sandbox_variables([upstream], every_key=False)
        try:
            invocation = kind.prepare(request.prompt, copy, self.box.paths.home, options, secrets)
        except agents.AgentSetupError as exc:
            return JudgeAgentRun(error=f"the judge agent cannot start: {exc}")
        parser = kind.parser(options)
        result = self.box.run(
            invocation.argv or [],
            limits=self.box.limits(Phase.GRADING, request.timeout_seconds),
            env={**secrets, **invocation.env_extra},
            mounts=[Mount(self.box.paths.workspace, source=copy, writable=True), Mount(server)],
            via=self.client.gateway,
            stdin=invocation.stdin,
            on_stdout_line=parser.feed_line,
            fresh_home=True,
        )
        self.client.gateway.settle()
        outcome = kind.finish(result, parser, limit_hit=self.client.gateway.stop_reason())
        error = outcome.error if outcome.status == agent_base.ERROR else None
        if outcome.status == agent_base.LIMIT and outcome.limit != "timeout":
            error = f"the judge agent stopped at a limit ({outcome.limit})"
        return JudgeAgentRun(
            tool_calls=outcome.tool_calls,
            final_text=outcome.final_text,
            error=error,
            timed_out=result.timed_out,
            usage=outcome.usage.as_dict(),
        )


def _plain(path: str) -> bool:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    return stat.S_ISREG(mode) or stat.S_ISDIR(mode)


def _ignored(patterns: tuple[str, ...]):
    """A copytree `ignore`: symbolic links (a planted link must not copy the worker's files to a
    judge that runs Bash), FIFOs, sockets and devices (reading one would block or never end), and
    names matching `patterns` (fnmatch, as coder-eval's)."""

    def ignore(folder: str, names: list[str]) -> set[str]:
        return {
            name
            for name in names
            if not _plain(os.path.join(folder, name)) or any(fnmatch.fnmatch(name, p) for p in patterns)
        }

    return ignore
