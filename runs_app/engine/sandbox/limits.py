"""The one recipe for a command's resource limits, by the phase it runs in (pure Python).

A trial's caps (`Caps`: memory, processes, disk) come from its task's `sandbox.limits` over the
host's defaults; each phase turns them into one command's `Limits`:

- `agent`: the agent's process tree for the task's wall clock, CPU up to 4x the wall clock, no
  address-space cap (agent CLIs reserve tens of GB of virtual memory), larger output;
- `suite`: a run's suite sandbox, held for the run (a week at most), no CPU cap;
- every other phase (`setup`, `pre_run`, `hook`, `grading`, `post_run`): a shell command of
  the task, CPU up to 2x its timeout, 4 GB of address space, 256 processes.

Every phase has the trial's memory cap, its process cap and a 1 GB file-size cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from runs_app.engine.sandbox.base import Limits

MAX_FILE_BYTES = 1 << 30
COMMAND_ADDRESS_SPACE = 4 << 30
COMMAND_PROCESSES = 256
SUITE_SECONDS = 7 * 24 * 3600


class Phase(StrEnum):
    SETUP = "setup"  # template sources (a repo's git), the task's environment
    PRE_RUN = "pre_run"
    HOOK = "hook"  # hooks.trial.before / after
    AGENT = "agent"
    GRADING = "grading"  # run_command criteria
    POST_RUN = "post_run"
    SUITE = "suite"


@dataclass(frozen=True)
class Caps:
    """A trial's caps, whatever the phase."""

    memory_bytes: int
    disk_bytes: int
    max_processes: int = 512
    max_inodes: int = 100_000
    # The agent's stdout is kept up to 4x this (it is parsed), its stderr up to this.
    agent_output_bytes: int = 1 << 20


def phase_limits(phase: Phase, caps: Caps, wall_seconds: float) -> Limits:
    """The limits of one command of `phase` that may run `wall_seconds`."""
    if phase == Phase.AGENT:
        return Limits(
            wall_seconds=wall_seconds, cpu_seconds=int(wall_seconds * 4), memory_bytes=caps.memory_bytes,
            max_processes=caps.max_processes, max_file_bytes=MAX_FILE_BYTES,
            stdout_cap_bytes=caps.agent_output_bytes * 4, stderr_cap_bytes=caps.agent_output_bytes,
        )  # fmt: skip
    if phase == Phase.SUITE:
        return Limits(
            wall_seconds=SUITE_SECONDS, memory_bytes=caps.memory_bytes, max_processes=caps.max_processes,
            max_file_bytes=MAX_FILE_BYTES,
        )  # fmt: skip
    return Limits(
        wall_seconds=wall_seconds, cpu_seconds=max(1, int(wall_seconds * 2)), memory_bytes=caps.memory_bytes,
        address_space_bytes=COMMAND_ADDRESS_SPACE, max_processes=min(COMMAND_PROCESSES, caps.max_processes),
        max_file_bytes=MAX_FILE_BYTES, stdout_cap_bytes=1 << 20,
    )  # fmt: skip
