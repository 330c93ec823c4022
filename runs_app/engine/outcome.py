"""How a trial ended, as the runner stores it (and what makes it end early in setup)."""

from dataclasses import dataclass, field

from runs_app.engine.usage import Usage

# `Trial.error_category` values that mean the agent failed, not the harness around it: the agent
# kinds' own (engine.agents) and those of imported coder-eval runs (timeout, token budget). The
# pass rate counts them as fails (`analysis.stats.tally`); any other category is left out of it.
AGENT_ERROR_CATEGORIES = frozenset(
    {
        "agent_error",
        "crash",
        "no_result",
        "max_turns",
        "max_usd",
        "prompt_too_long",
        "timeout",
        "token_budget_exceeded",
    }
)


class TrialAborted(Exception):
    """Setup failed in a way that makes the trial `error` (message says what to fix)."""

    def __init__(self, category: str, message: str):
        self.category = category
        super().__init__(message)


@dataclass
class Outcome:
    status: str
    error_category: str = ""
    error_message: str = ""
    score: float | None = None
    timed_out: bool = False
    budget_exceeded: str = ""
    stopped_early: str = ""
    tampered: str = ""
    image_digest: str = ""
    visible_turns: int = 0
    trajectory: dict | None = None
    usage: Usage = field(default_factory=Usage)
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    diff: str = ""
    diff_truncated: bool = False
    criteria: list = field(default_factory=list)
    artifact: str = ""
    timings: dict[str, float] = field(default_factory=dict)


STEP_OUTPUT_CHARS = 500


def step_failure(step: str, command: str, exit_code: int | None, timed_out: bool, output: str) -> str:
    """What a failed step (pre_run, post_run, a hook) says in a trial's or a run's error: its
    exit code and the end of its own output, so the reason reads without opening the transcript
    (the output is the step's, never the agent's; the message is redacted where it is stored)."""
    why = "timed out" if timed_out else f"exited with {exit_code}"
    tail = output.strip()[-STEP_OUTPUT_CHARS:].strip()
    return f"{step} `{command}` {why}: {tail}" if tail else f"{step} `{command}` {why} (no output)"
