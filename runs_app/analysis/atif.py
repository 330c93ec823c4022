"""A trial's transcript as an ATIF trajectory (the Agent Trajectory Interchange Format that Harbor
and coder-eval 0.12.16 write), and ATIF files read back into a trial's review page.

The models follow ATIF v1.7 as coder-eval 0.12.16 vendors it (`harbor/atif_models.py`) with
Harbor's own rule that only agent steps carry tool calls, metrics and reasoning. A file that
breaks a rule is refused with the step and field named.

Export (`trial_trajectory`) builds the steps from the trial's events: the prompt as step 1
(user), then one agent step per agent message, its tool calls and their results as the step's
`tool_calls` and `observation`; a simulated user's reply is a user step. An imported trajectory is
kept as it was read (normalised: no null fields), so exporting that trial gives the same JSON
back; its steps are also written as the trial's events, which the transcript shows.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any, Literal, Self

from django.db import transaction
from django.utils import timezone
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

import evalsite
from runs_app.models import Trial, TrialEvent

SCHEMA_VERSION = "ATIF-v1.7"
MAX_TEXT = 200_000  # one event's text, as the coder-eval importer keeps it
MAX_EVENTS = 5000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ContentPart(_Strict):
    type: Literal["text", "image"]
    text: str | None = None
    source: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _text_needs_text(self) -> Self:
        if self.type == "text" and self.text is None:
            raise ValueError("a 'text' part needs 'text'")
        return self


class ToolCall(_Strict):
    tool_call_id: str
    function_name: str
    arguments: dict[str, Any]
    extra: dict[str, Any] | None = None


class SubagentTrajectoryRef(_Strict):
    trajectory_id: str | None = None
    session_id: str | None = None
    trajectory_path: str | None = None
    extra: dict[str, Any] | None = None


class ObservationResult(_Strict):
    source_call_id: str | None = None
    content: str | list[ContentPart] | None = None
    subagent_trajectory_ref: list[SubagentTrajectoryRef] | None = None
    extra: dict[str, Any] | None = None


class Observation(_Strict):
    results: list[ObservationResult]


class Metrics(_Strict):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cost_usd: float | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    extra: dict[str, Any] | None = None


class FinalMetrics(_Strict):
    total_prompt_tokens: int | None = None
    total_completion_tokens: int | None = None
    total_cached_tokens: int | None = None
    total_cost_usd: float | None = None
    total_steps: int | None = None
    extra: dict[str, Any] | None = None


class Agent(_Strict):
    name: str
    version: str
    model_name: str | None = None
    tool_definitions: list[dict[str, Any]] | None = None
    extra: dict[str, Any] | None = None


# Harbor's Step refuses these on a user or system step.
AGENT_ONLY = ("tool_calls", "metrics", "reasoning_content", "reasoning_effort", "model_name")


class Step(_Strict):
    step_id: int = Field(ge=1)
    timestamp: str | None = None
    source: Literal["system", "user", "agent"]
    model_name: str | None = None
    reasoning_effort: str | float | None = None
    message: str | list[ContentPart]
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    observation: Observation | None = None
    metrics: Metrics | None = None
    is_copied_context: bool | None = None
    llm_call_count: int | None = None
    extra: dict[str, Any] | None = None


class Trajectory(_Strict):
    schema_version: str = Field(default=SCHEMA_VERSION, pattern=r"^ATIF-v1\.\d+$")
    session_id: str | None = None
    trajectory_id: str | None = None
    agent: Agent
    steps: list[Step] = Field(min_length=1)
    notes: str | None = None
    final_metrics: FinalMetrics | None = None
    continued_trajectory_ref: str | None = None
    extra: dict[str, Any] | None = None
    subagent_trajectories: list[Trajectory] | None = None

    @model_validator(mode="after")
    def _steps_follow_the_rules(self) -> Self:
        problems = [
            problem for index, step in enumerate(self.steps) for problem in _step_problems(index, step)
        ]
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _step_problems(index: int, step: Step) -> list[str]:
    where = f"steps[{index}] (step_id {step.step_id})"
    problems = []
    if step.step_id != index + 1:
        problems.append(f"{where}: step_id must be {index + 1} (step ids count 1, 2, 3… in order)")
    if step.source != "agent":
        problems += [
            f"{where}: {name} is only allowed on an agent step (this step's source is {step.source!r})"
            for name in AGENT_ONLY
            if getattr(step, name) is not None
        ]
    call_ids = {call.tool_call_id for call in step.tool_calls or []}
    for number, result in enumerate(step.observation.results if step.observation else []):
        if result.source_call_id is not None and result.source_call_id not in call_ids:
            problems.append(
                f"{where}: observation.results[{number}].source_call_id {result.source_call_id!r} "
                "names no tool call of this step (an observation answers a call of its own step)"
            )
    return problems


class AtifError(ValueError):
    """The file is not a valid ATIF trajectory; `problems` names each field (and step)."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def read_trajectory(text: str | bytes, name: str = "trajectory.json") -> Trajectory:
    """Parse and validate one ATIF file, or raise AtifError naming the file, field and step."""
    try:
        document = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise AtifError([f"{name}: not JSON ({exc}): give an ATIF trajectory.json"]) from None
    except RecursionError:
        raise AtifError([f"{name}: the JSON is nested too deeply to be a trajectory"]) from None
    if not isinstance(document, dict):
        raise AtifError([f"{name}: an ATIF trajectory is a JSON object with schema_version, agent, steps"])
    try:
        return Trajectory.model_validate(document)
    except ValidationError as exc:
        raise AtifError([f"{name}: {_problem(error, document)}" for error in exc.errors()]) from None


def _problem(error: Any, document: dict) -> str:
    """One pydantic error as `field (step_id N): what is wrong`."""
    loc = list(error["loc"])
    if not loc:  # a rule over the whole trajectory: its message names the step already
        return str(error["msg"]).removeprefix("Value error, ")
    # A union's member name (`str`, `list[ContentPart]`) in a location says nothing to a reader.
    path = "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}"
        for part in loc
        if not (isinstance(part, str) and ("[" in part or part in ("str", "int", "float")))
    ).lstrip(".")
    where = path
    if loc[0] == "steps" and len(loc) > 1 and isinstance(loc[1], int):
        steps = document.get("steps") or []
        step = steps[loc[1]] if loc[1] < len(steps) and isinstance(steps[loc[1]], dict) else {}
        where = f"{path} (step_id {step.get('step_id', '?')})"
    message = "is required" if error["type"] == "missing" else str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}"


def dump(trajectory: Trajectory) -> dict[str, Any]:
    """The one serialised form: JSON types, no null fields (as coder-eval and Harbor write it)."""
    return trajectory.model_dump(mode="json", exclude_none=True)


# ---------------------------------------------------------------- export


def trial_trajectory(trial: Trial) -> dict[str, Any]:
    """The trial as an ATIF trajectory (an imported one as it was imported)."""
    stored = (trial.trajectory or {}).get("atif") if isinstance(trial.trajectory, dict) else None
    if stored:
        return stored
    events = list(trial.events.order_by("seq"))
    agent = (trial.config or {}).get("agent") or {}
    # The graded calls hold each call's outcome (an agent may report it on the call itself).
    recorded = (trial.trajectory or {}).get("tool_calls") or []
    statuses = {str(c.get("id")): c.get("status") for c in recorded if isinstance(c, dict)}
    steps = _steps(trial.prompt, events, agent.get("model"), statuses)
    trajectory = Trajectory(
        session_id=f"evalsite-run-{trial.run_id}/trial-{trial.pk}",
        agent=Agent(
            name=str(agent.get("type") or "unknown"),
            version=agent_version(trial),
            model_name=agent.get("model"),
        ),
        steps=steps,
        final_metrics=FinalMetrics(
            total_prompt_tokens=trial.input_tokens + trial.cache_read_tokens + trial.cache_creation_tokens,
            total_completion_tokens=trial.output_tokens,
            total_cached_tokens=trial.cache_read_tokens,
            total_cost_usd=trial.cost_usd,
            total_steps=len(steps),
        ),
        extra={"evalsite": {"version": evalsite.__version__, "run": trial.run_id, "trial": trial.pk}},
    )
    return dump(trajectory)


def agent_version(trial: Trial) -> str:
    """The version the agent's CLI reported (the trial's agent component), else 'unknown'."""
    value = str(((trial.components or {}).get("agent") or {}).get("value") or "")
    kind = str(((trial.config or {}).get("agent") or {}).get("type") or "")
    version = value.removeprefix(kind).strip() if value else ""
    return version or "unknown"


def _steps(prompt: str, events: list[TrialEvent], model: str | None, statuses: dict[str, Any]) -> list[Step]:
    steps: list[Step] = [Step(step_id=1, source="user", message=prompt)]
    calls: dict[str, Step] = {}  # tool call id -> the step that made it

    def agent_step(at: datetime) -> Step:
        step = Step(
            step_id=len(steps) + 1, source="agent", message="", timestamp=at.isoformat(), model_name=model
        )
        steps.append(step)
        return step

    for event in events:
        data = event.data if isinstance(event.data, dict) else {}
        last = steps[-1]
        if event.kind == TrialEvent.Kind.MESSAGE and data.get("role") == "user":
            steps.append(
                Step(
                    step_id=len(steps) + 1,
                    source="user",
                    message=str(data.get("text") or ""),
                    timestamp=event.at.isoformat(),
                )
            )
        elif event.kind == TrialEvent.Kind.MESSAGE and (data.get("thinking") or data.get("reasoning")):
            # Thinking comes before the reply it leads to: a step of its own until that reply.
            step = agent_step(event.at)
            step.reasoning_content = str(data.get("text") or "")
        elif event.kind == TrialEvent.Kind.MESSAGE:
            text = str(data.get("text") or "")
            if last.source == "agent" and last.reasoning_content and not last.message and not last.tool_calls:
                last.message = text
            else:
                agent_step(event.at).message = text
        elif event.kind == TrialEvent.Kind.TOOL_CALL:
            step = last if last.source == "agent" and not last.observation else agent_step(event.at)
            call_id = str(data.get("id") or f"call_{event.seq}")
            arguments = (
                data.get("input") if isinstance(data.get("input"), dict) else {"input": data.get("input")}
            )
            status = data.get("status") or statuses.get(call_id)
            step.tool_calls = [
                *(step.tool_calls or []),
                ToolCall(
                    tool_call_id=call_id,
                    function_name=str(data.get("name") or "tool"),
                    arguments=arguments,
                    extra={"result_status": status} if status in ("success", "error") else None,
                ),
            ]
            calls[call_id] = step
        elif event.kind == TrialEvent.Kind.TOOL_RESULT:
            call_id = str(data.get("id") or "")
            step = calls.get(call_id)
            if step is None:
                continue  # a result whose call the transcript does not hold: nothing to answer
            output = data.get("output")
            result = ObservationResult(
                source_call_id=call_id,
                content=output if isinstance(output, str) else json.dumps(output, default=str),
                extra={"is_error": True} if data.get("is_error") else None,
            )
            existing = step.observation.results if step.observation else []
            step.observation = Observation(results=[*existing, result])
            # A result may carry the call's outcome (an imported coder-eval command does).
            status = data.get("status")
            for call in step.tool_calls or []:
                if call.tool_call_id == call_id and call.extra is None and status in ("success", "error"):
                    call.extra = {"result_status": status}
    return steps


# ---------------------------------------------------------------- import


class ImportRefused(Exception):
    def __init__(self, message: str, *, forbidden: bool = False):
        self.forbidden = forbidden
        super().__init__(message)


def ensure_may_import(trial: Trial, user) -> None:
    """The one rule: a trajectory goes only into a trial of an imported (historical) run, whose
    agent ran elsewhere; a trial that ran here keeps the transcript it recorded. Staff, or the
    person who imported the run (None: the command line)."""
    run = trial.run
    if user is not None and not (
        user.is_staff or (run.started_by_id is not None and run.started_by_id == user.pk)
    ):
        raise ImportRefused(
            "only the person who imported this run, or staff, may import a trajectory into it", forbidden=True
        )
    if not run.historical:
        raise ImportRefused(
            f"trial {trial.pk} ran here and keeps the transcript it recorded: import a trajectory into a "
            "trial of an imported run (manage.py import_coder_eval_run)"
        )


def may_import(trial: Trial, user) -> bool:
    """Whether `ensure_may_import` lets `user` import into `trial` (the trial page's form)."""
    try:
        ensure_may_import(trial, user)
    except ImportRefused:
        return False
    return True


def import_trajectory(trial: Trial, text: str | bytes, *, user=None, name: str = "trajectory.json") -> int:
    """Replace the trial's transcript with the steps of one ATIF file. Returns the events written."""
    ensure_may_import(trial, user)
    trajectory = read_trajectory(text, name)
    document = dump(trajectory)
    at = trial.started_at or trial.finished_at or timezone.now()
    agent = trajectory.agent
    note = f"imported ATIF trajectory {name}: {agent.name} {agent.version}, {len(trajectory.steps)} steps"
    items: list[tuple[str, dict]] = [(TrialEvent.Kind.SYSTEM, {"text": note}), *step_events_of(trajectory)]
    events = [
        TrialEvent(trial=trial, seq=seq, at=at, kind=kind, data=data)
        for seq, (kind, data) in enumerate(items[:MAX_EVENTS], start=1)
    ]
    with transaction.atomic():
        trial.events.all().delete()
        TrialEvent.objects.bulk_create(events, batch_size=1000)
        trial.trajectory = {**(trial.trajectory or {}), "atif": document}
        trial.save(update_fields=["trajectory"])
    return len(events)


def step_events_of(trajectory: Trajectory) -> list[tuple[str, dict]]:
    return [item for step in trajectory.steps for item in step_events(step)]


def step_events(step: Step) -> list[tuple[str, dict]]:
    """One ATIF step as transcript events (kinds and fields the transcript view already shows)."""
    text = _text(step.message)[:MAX_TEXT]
    marker = {"atif_step": step.step_id}
    if step.source == "system":
        return [(TrialEvent.Kind.SYSTEM, {"subtype": "system prompt", "text": text, **marker})]
    if step.source == "user":
        return [(TrialEvent.Kind.MESSAGE, {"role": "user", "text": text, **marker})]
    items: list[tuple[str, dict]] = []
    if step.reasoning_content:
        items.append(
            (TrialEvent.Kind.MESSAGE, {"thinking": True, "text": step.reasoning_content[:MAX_TEXT], **marker})
        )
    if text or not step.tool_calls:
        items.append((TrialEvent.Kind.MESSAGE, {"text": text, **marker}))
    names = {}
    for call in step.tool_calls or []:
        names[call.tool_call_id] = call.function_name
        status = (call.extra or {}).get("result_status")
        items.append(
            (
                TrialEvent.Kind.TOOL_CALL,
                {
                    "id": call.tool_call_id,
                    "name": call.function_name,
                    "input": call.arguments,
                    "status": status,
                    **marker,
                },
            )
        )
    for result in step.observation.results if step.observation else []:
        call_id = result.source_call_id or ""
        error = bool((result.extra or {}).get("is_error"))
        items.append(
            (
                TrialEvent.Kind.TOOL_RESULT,
                {
                    "id": call_id,
                    "name": names.get(call_id, "tool"),
                    "output": _text(result.content)[:MAX_TEXT],
                    "is_error": error,
                    **marker,
                },
            )
        )
    return items


def _text(content: str | list[ContentPart] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.text or "" if part.type == "text" else "[image]" for part in content)


def trajectory_uuid(trial: Trial) -> str:
    """A stable id for the trial's exported files (the same export twice gives the same ids)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"evalsite:trial:{trial.pk}"))
