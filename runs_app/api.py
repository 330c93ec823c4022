"""The HTTP API (django-ninja), described to its users by DESCRIPTION (the OpenAPI schema at
/api/openapi.json, the docs at /api/docs, linked from every page's navigation).

Authentication is a personal token only (`Authorization: Bearer <token>`, `runs_app.tokens`):
no session, so browser cookies never authorise an API call and CSRF does not apply. Who may
cancel or retry is `control.ensure_controllable`'s rule. A comparison is `records.comparison_record`,
the one serialisation the comparison page's JSON download uses too. Every error is JSON,
`{"detail": message, "field": name or null}`, with a 4xx status.
"""

from datetime import UTC, date, datetime, time, timedelta
from functools import wraps
from typing import Annotated, Any, Literal

from django.contrib.auth.views import redirect_to_login
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.request import RawPostDataException
from django.urls import reverse
from django.utils import timezone
from ninja import Field, File, Form, NinjaAPI, Path, Query, Schema, Status
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.files import UploadedFile
from ninja.security import HttpBearer
from pydantic import AfterValidator, ConfigDict, StringConstraints

from experiments_app.definitions import ImportFailed, experiment_zip, import_experiment_upload
from experiments_app.models import Experiment
from experiments_app.specs import agent_kinds
from experiments_app.specs.resolve import OverrideError, parse_overrides
from runs_app import control, preflight
from runs_app.analysis import exports
from runs_app.analysis.load import compare_runs, comparison, loaded
from runs_app.analysis.stats import records
from runs_app.analysis.stats.comparison import CLUSTERINGS
from runs_app.launching import LaunchError, LaunchOptions, launch_run
from runs_app.models import Run, Trial
from runs_app.tokens import verify_token

# Database integers are signed 64-bit; a larger id in a URL must be a 4xx, not an overflow.
MAX_ID = 2**63 - 1
MAX_REPEATS = 100
MAX_COMPARED_RUNS = 10  # as the comparison page
SLUG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"
TAG_PATTERN = r"^[a-z0-9]+(-[a-z0-9]+)*(:[a-z0-9]+(-[a-z0-9]+)*)?$"


# --------------------------------------------------------------------------- errors


class ApiError(Exception):
    """A 4xx answer: `{"detail": detail, "field": field}`."""

    def __init__(self, status: int, detail: str, field: str | None = None):
        self.status, self.detail, self.field = status, detail, field
        super().__init__(detail)


def _no_control_characters(value: str) -> str:
    # NUL cannot be stored by PostgreSQL (text or jsonb); other control characters are never
    # meaningful in an override, tag or model name.
    if any(ord(ch) < 32 and ch not in "\t" for ch in value):
        raise ValueError("must not contain control characters")
    return value


Text = Annotated[str, StringConstraints(max_length=1000), AfterValidator(_no_control_characters)]
AgentKindName = Annotated[str, StringConstraints(max_length=200), AfterValidator(agent_kinds.check_kind)]
Tag = Annotated[str, StringConstraints(pattern=TAG_PATTERN, max_length=100)]
ModelName = Annotated[
    str, StringConstraints(min_length=1, max_length=200), AfterValidator(_no_control_characters)
]


class TokenAuth(HttpBearer):
    """Bearer token auth; the result (request.auth) is the token's user."""

    def __call__(self, request: HttpRequest) -> Any:
        scheme, _, raw = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            raise AuthenticationError(message="send your API token as 'Authorization: Bearer <token>'")
        return self.authenticate(request, raw.strip())

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        found = verify_token(token)
        if found is None:
            raise AuthenticationError(message="invalid or revoked API token")
        return found.user


def _docs_for_members(view: Any) -> Any:
    """The interactive docs are a page like any other: sign-in required. The schema itself
    (/api/openapi.json) describes endpoints, never data, and stays at a stable public URL for
    pipelines and code generators; every endpoint it lists still needs a token."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.path.endswith(".json") or request.user.is_authenticated:
            return view(request, *args, **kwargs)
        return redirect_to_login(request.get_full_path())

    return wrapper


# What the docs page says, in the words of the people who call it.
DESCRIPTION = """Everything the site shows, for scripts and CI jobs: list experiments, check a launch
and start runs, follow them, read their trials and their comparisons, cancel and retry.

**Signing in.** Create a personal token on your account page (your name, top right of every page)
and send it with every request: `Authorization: Bearer evs_…`. A token acts as you; being signed in
to the site in a browser does not authorise API calls. The same token also opens the site's
downloads: a comparison's `?format=json` or `?format=csv`, a trial's workspace, an experiment's
YAML or zip.

**Who may do what.** Everyone signed in sees every experiment and every run, and may launch.
A run can be cancelled or retried by the person who started it, or by staff. Runs imported from
coder-eval are read-only.

**Numbers.** A comparison here is exactly what the comparison page shows and downloads: per
variant (arm), the pass rate with its 95% interval (errors counted apart, never as fails), the
rate if every error were a fail, mean score, pass@k, tokens, cost and cost per passed trial; and
each variant against the baseline: the difference in pass rate over the tasks both ran, its
interval, the smallest difference the run could detect, and a paired test (Holm-adjusted).
Tasks quarantined as broken are left out, and listed.

**Errors** are JSON, `{"detail": "what went wrong", "field": "the field concerned, or null"}`,
with a 4xx status: 400 bad input, 401 no or bad token, 403 not yours to change, 404 not found,
409 not now (a run that has ended, a launch that pre-flight refuses), 422 a field out of range.
"""


class _Api(NinjaAPI):
    def get_openapi_operation_id(self, operation: Any) -> str:
        # The endpoint's name ("list_runs"), not the module path it lives in.
        return operation.view_func.__name__


api = _Api(
    title="evalsite API",
    version="1",
    description=DESCRIPTION,
    urls_namespace="api",
    auth=TokenAuth(),
    docs_decorator=_docs_for_members,
)


def _error(request: HttpRequest, status: int, detail: str, field: str | None = None) -> HttpResponse:
    response = api.create_response(request, {"detail": detail, "field": field}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = "Bearer"
    return response


@api.exception_handler(ApiError)
def _api_error(request: HttpRequest, exc: ApiError) -> HttpResponse:
    return _error(request, exc.status, exc.detail, exc.field)


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    return _error(request, exc.status_code, str(exc))


@api.exception_handler(ValidationError)
def _validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    if request.method in ("POST", "PUT", "PATCH") and _no_body(request):
        return _error(request, 400, "the request needs a JSON body (Content-Type: application/json)")
    problems = [(_field_name(err.get("loc", ())), str(err.get("msg", "invalid"))) for err in exc.errors]
    detail = "; ".join(f"{field}: {msg}" if field else msg for field, msg in problems) or "invalid request"
    return _error(request, 422, detail, problems[0][0] if problems else None)


def _no_body(request: HttpRequest) -> bool:
    try:
        return not request.body
    except RawPostDataException:  # a form upload, already read as its fields: it had one
        return False


def _field_name(loc: tuple | list) -> str | None:
    """`("body", "payload", "repeats")` -> "repeats"; `("query", "page")` -> "page"."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header", "cookie", "form", "file"):
        parts = parts[1:]
    if parts and parts[0] == "payload":  # the body as a whole: no field to name
        parts = parts[1:]
    return ".".join(parts) or None


@api.exception_handler(control.ControlRefused)
def _control_refused(request: HttpRequest, exc: control.ControlRefused) -> HttpResponse:
    return _error(request, 403 if exc.forbidden else 409, str(exc))


@api.exception_handler(LaunchError)
def _launch_error(request: HttpRequest, exc: LaunchError) -> HttpResponse:
    return _error(request, 400, "the run cannot start: " + "; ".join(exc.problems), "overrides")


# --------------------------------------------------------------------------- schemas


class ErrorOut(Schema):
    detail: str
    field: str | None = None


class VariantOut(Schema):
    slug: str
    description: str
    agent: dict[str, Any]


class ExperimentOut(Schema):
    slug: str
    name: str
    description: str
    baseline: str | None
    repeats: int
    variants: list[VariantOut]
    url: str


class ExperimentImportOut(Schema):
    created: bool = Field(description="false: it replaced an experiment of the same ID")
    warnings: list[str]
    experiment: ExperimentOut


class LaunchIn(Schema):
    model_config = ConfigDict(extra="forbid")

    overrides: list[Text] = Field(default_factory=list, max_length=100, description='"path=value" items')
    repeats: int | None = Field(None, ge=1, le=MAX_REPEATS)
    max_parallel: int | None = Field(None, ge=1, le=1000)
    tags: list[Tag] | None = Field(None, max_length=100, description="replaces the experiment's tags")
    exclude_tags: list[Tag] | None = Field(None, max_length=100)
    sample: int | None = Field(None, ge=1, le=100_000, description="run this many tasks, chosen with seed")
    seed: int | None = Field(None, ge=0, le=MAX_ID)
    agent_type: AgentKindName | None = Field(None, description="agent kind for every variant")
    model: ModelName | None = Field(None, description="model for every variant")
    any_code_version: bool | None = Field(
        None, description="let workers of any code version run its trials (default: only the web's own)"
    )
    variants: list[Annotated[str, StringConstraints(pattern=SLUG_PATTERN, max_length=200)]] | None = Field(
        None, max_length=100, description="run only these variants (default: all of them)"
    )
    launch_anyway: bool = Field(
        False,
        description="launch even when the pre-flight check finds problems (by default such a launch is "
        "refused with 409 and each problem)",
    )


class PreflightCheckOut(Schema):
    variant: str
    check: str
    need: str
    level: Literal["ok", "warn", "fail", "unchecked"]
    detail: str
    fix: str


class PreflightOut(Schema):
    ok: bool = Field(description="true when nothing stops a launch")
    workers: list[str] = Field(description="the live workers that would run its trials")
    notes: list[str]
    refused: list[str] = Field(description="why a launch would be refused outright")
    checks: list[PreflightCheckOut]


class CountsOut(Schema):
    trials: int
    done: int
    queued: int
    running: int
    passed: int
    failed: int
    errors: int
    cancelled: int


class GatesOut(Schema):
    passed: bool | None
    gates: list[Any]
    results: list[Any]


class RunOut(Schema):
    id: int
    experiment: str
    status: str
    historical: bool
    cancel_requested: bool
    started_by: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    overrides: list[Any]
    counts: CountsOut
    gates: GatesOut
    summary: dict[str, Any]
    url: str
    trials_url: str


class RetryOut(Schema):
    retried: int
    run: RunOut


class TrialOut(Schema):
    id: int
    run: int
    variant: str
    task: str
    task_version: int
    replicate: int
    dataset_row_id: str
    status: str
    attempt: int
    host: str
    score: float | None
    duration_seconds: float | None
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_creation_tokens: int
    cost_usd: float | None  # None: not a finite number (docs/schema.md)
    answerer_cost_usd: float | None
    judge_cost_usd: float | None
    turns: int
    timed_out: bool
    budget_exceeded: str
    error_category: str
    error_message: str
    config_fingerprint: str
    started_at: datetime | None
    finished_at: datetime | None
    label: str
    url: str


class TrialPage(Schema):
    count: int
    page: int
    page_size: int
    next_page: int | None
    items: list[TrialOut]


class TrialQuery(Schema):
    page: int = Field(1, ge=1, le=1_000_000)
    page_size: int = Field(100, ge=1, le=500)
    format: Literal["json", "csv"] = Field("json", description="csv: every trial of the run, one file")
    status: Literal[tuple(Trial.Status.values)] | None = Field(None, description="only trials in this state")
    variant: str | None = Field(None, max_length=200, pattern=SLUG_PATTERN, description="only this variant's")


class RunItemOut(Schema):
    id: int
    experiment: str
    status: str
    historical: bool
    started_by: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    counts: CountsOut
    gates_passed: bool | None = Field(description="null: the run has no gates, or has not ended")
    url: str
    comparison_url: str


class RunPage(Schema):
    count: int
    page: int
    page_size: int
    next_page: int | None
    items: list[RunItemOut]


class RunQuery(Schema):
    experiment: str | None = Field(
        None, max_length=200, pattern=SLUG_PATTERN, description="only the runs of this experiment (its ID)"
    )
    status: Literal[tuple(Run.Status.values)] | None = None
    since: datetime | date | None = Field(None, description="launched at or after (a date or a time)")
    until: datetime | date | None = Field(None, description="launched before (a date: before that day ends)")
    page: int = Field(1, ge=1, le=1_000_000)
    page_size: int = Field(50, ge=1, le=500)


CLUSTER_NAMES = tuple(CLUSTERINGS)


class ComparisonQuery(Schema):
    baseline: str | None = Field(
        None, max_length=400, description="the arm the others are compared with (default: the run's baseline)"
    )
    tag: list[Tag] = Field(
        default_factory=list, max_length=100, description="only tasks with any of these tags"
    )
    cluster: Literal[CLUSTER_NAMES] = Field(
        "unit",
        description="what the intervals and tests treat as independent: "
        + "; ".join(f"{key}: {words}" for key, words in CLUSTERINGS.items()),
    )


class RunsComparisonQuery(ComparisonQuery):
    runs: list[Annotated[int, Field(ge=1, le=MAX_ID)]] = Field(
        default_factory=list,
        max_length=MAX_COMPARED_RUNS,
        description=f"the runs to compare (at most {MAX_COMPARED_RUNS}); default: its latest two",
    )


ERRORS = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut, 422: ErrorOut}
RunId = Path(..., ge=1, le=MAX_ID, description="the run's number (#12 on the site)")
Slug = Path(..., max_length=200, pattern=SLUG_PATTERN, description="the experiment's ID (its experiment_id)")


# --------------------------------------------------------------------------- endpoints


@api.get("/experiments", response={200: list[ExperimentOut], **ERRORS}, summary="List experiments")
def list_experiments(request: HttpRequest):
    experiments = Experiment.objects.with_variants().order_by("slug")
    return [_experiment_out(experiment) for experiment in experiments]


@api.get(
    "/experiments/{slug}/bundle",
    response={200: None, **ERRORS},
    summary="Download an experiment with every file it names, as one zip",
    description="The zip uploads (POST /api/experiments) or imports back to the same experiment, with the "
    "same digest of its files.",
    openapi_extra={"responses": {200: {"content": {"application/zip": {"schema": {"type": "string"}}}}}},
)
def experiment_bundle(request: HttpRequest, slug: str = Slug):
    experiment = _get_experiment(slug)
    try:
        content = experiment_zip(experiment)
    except ImportFailed as exc:
        raise ApiError(409, f"{slug} cannot be bundled: " + "; ".join(exc.issues), "slug") from None
    response = HttpResponse(content, content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="{slug}.zip"'
    return response


@api.post(
    "/experiments",
    response={201: ExperimentImportOut, **ERRORS},
    summary="Upload an experiment: its zip (YAML and files), or a YAML naming no files",
    description="Checked as an import checks a folder; nothing is stored when anything is wrong (400, "
    "every problem in the detail). An experiment of the same ID is replaced only with replace=true.",
)
def upload_experiment(request: HttpRequest, file: File[UploadedFile], replace: Form[bool] = False):
    try:
        report = import_experiment_upload(file, user=request.auth, replace=replace)
    except ImportFailed as exc:
        raise ApiError(400, "nothing was imported: " + "; ".join(exc.issues), "file") from None
    experiment = Experiment.objects.with_variants().get(pk=report.experiment.pk)
    out = {"created": report.created, "warnings": report.warnings, "experiment": _experiment_out(experiment)}
    return Status(201, out)


@api.post(
    "/experiments/{slug}/runs", response={201: RunOut, **ERRORS}, summary="Start a run of an experiment"
)
def start_run(request: HttpRequest, payload: LaunchIn, slug: str = Slug):
    experiment = _get_experiment(slug)
    options = LaunchOptions(**payload.model_dump(exclude_none=True, exclude={"launch_anyway"}))
    try:
        _check_override_repeats(options.overrides)
        if not payload.launch_anyway:
            _refuse_on_preflight(experiment, options)
        run = launch_run(experiment, user=request.auth, options=options)
    except RecursionError:
        # A pathologically nested override value (YAML) is bad input, not a server fault.
        raise ApiError(400, "an override value is nested too deeply", "overrides") from None
    return Status(201, _run_out(_get_run(run.pk)))


@api.get(
    "/experiments/{slug}/preflight",
    response={200: PreflightOut, **ERRORS},
    summary="Check that the live workers can run each variant, before launching",
    description="For each variant: its agent's CLI (and the version the workers run), a key for each "
    "model API it calls (the workers say which APIs they hold a key for, never the keys), the "
    "capabilities its tasks need, and the files it names. Each problem comes with its fix.",
)
def get_preflight(request: HttpRequest, slug: str = Slug):
    return preflight.check(_get_experiment(slug)).to_dict()


@api.get(
    "/runs/{run_id}", response={200: RunOut, **ERRORS}, summary="A run's status, counts, gates and summary"
)
def get_run(request: HttpRequest, run_id: int = RunId):
    return _run_out(_get_run(run_id))


@api.get(
    "/runs/{run_id}/trials",
    response={200: TrialPage, **ERRORS},
    summary="A run's trials (the latest attempt of each), a page at a time; ?format=csv: all in one file",
    openapi_extra={"responses": {200: {"content": {"text/csv": {"schema": {"type": "string"}}}}}},
)
def list_trials(request: HttpRequest, query: Query[TrialQuery], run_id: int = RunId):
    run = _get_run(run_id)
    trials = _trials_of(run, query)
    if query.format == "csv":
        return _trials_csv(request, run, trials)
    total = trials.count()
    start = (query.page - 1) * query.page_size
    more = start + query.page_size < total
    return {
        "count": total,
        "page": query.page,
        "page_size": query.page_size,
        "next_page": query.page + 1 if more else None,
        "items": list(exports.trial_rows(trials[start : start + query.page_size])),
    }


@api.get(
    "/runs",
    response={200: RunPage, **ERRORS},
    summary="List runs, newest first: by experiment, status and launch date",
)
def list_runs(request: HttpRequest, query: Query[RunQuery]):
    runs = Run.objects.listed().select_related("started_by").order_by("-created_at", "-pk")
    if query.experiment:
        runs = runs.filter(experiment__slug=query.experiment)
    if query.status:
        runs = runs.filter(status=query.status)
    if query.since is not None:
        runs = runs.filter(created_at__gte=_moment(query.since, field="since"))
    if query.until is not None:
        runs = runs.filter(created_at__lt=_moment(query.until, end_of_day=True))
    total = runs.count()
    start = (query.page - 1) * query.page_size
    return {
        "count": total,
        "page": query.page,
        "page_size": query.page_size,
        "next_page": query.page + 1 if start + query.page_size < total else None,
        "items": [_run_item(run) for run in runs[start : start + query.page_size]],
    }


@api.get(
    "/runs/{run_id}/comparison",
    response={200: dict[str, Any], **ERRORS},
    summary="A run's comparison of its variants",
    description="The same numbers as the run's comparison page and its JSON download.",
)
def run_comparison(request: HttpRequest, query: Query[ComparisonQuery], run_id: int = RunId):
    return _comparison([_get_run(run_id)], query)


@api.get(
    "/experiments/{slug}/comparison",
    response={200: dict[str, Any], **ERRORS},
    summary="Compare several runs of an experiment: one arm per run and variant",
    description="The same numbers as the experiment's comparison page and its JSON download.",
)
def experiment_comparison(
    request: HttpRequest,
    query: Query[RunsComparisonQuery],
    slug: str = Slug,
):
    experiment = _get_experiment(slug)
    runs = Run.objects.filter(experiment=experiment).select_related("experiment")
    if not query.runs:
        return _comparison(sorted(runs.newest(2), key=lambda run: run.pk), query)
    found = {run.pk: run for run in runs.filter(pk__in=query.runs)}
    missing = [str(pk) for pk in query.runs if pk not in found]
    if missing:
        raise ApiError(404, f"not runs of {slug}: {', '.join(missing)}", "runs")
    return _comparison([found[pk] for pk in dict.fromkeys(query.runs)], query)


@api.post("/runs/{run_id}/cancel", response={200: RunOut, **ERRORS}, summary="Cancel a run")
def cancel(request: HttpRequest, run_id: int = RunId):
    run = _get_run(run_id)
    control.cancel_run(run, request.auth)
    return _run_out(_get_run(run.pk))


@api.post(
    "/runs/{run_id}/retry-errors", response={200: RetryOut, **ERRORS}, summary="Retry a run's errored trials"
)
def retry_errors(request: HttpRequest, run_id: int = RunId):
    run = _get_run(run_id)
    retried = control.retry_errors(run, request.auth)
    return {"retried": retried, "run": _run_out(_get_run(run.pk))}


# --------------------------------------------------------------------------- helpers


def _check_override_repeats(overrides: list[str]) -> None:
    """The `repeats` body field is capped at MAX_REPEATS; an override must not get around it
    (one typo would create millions of trials inside a web request)."""
    try:
        repeats = parse_overrides(overrides, validate=False).get("repeats")
    except OverrideError as exc:
        raise LaunchError([str(exc)]) from None
    if isinstance(repeats, int) and repeats > MAX_REPEATS:
        raise ApiError(400, f"repeats={repeats} is more than the API allows ({MAX_REPEATS})", "overrides")


def _get_experiment(slug: str) -> Experiment:
    experiment = Experiment.objects.select_related("baseline").filter(slug=slug).first()
    if experiment is None:
        raise ApiError(404, f"no experiment {slug!r}", "slug")
    return experiment


def _refuse_on_preflight(experiment: Experiment, options: LaunchOptions) -> None:
    problems = preflight.check(experiment, options).problems
    if problems:
        raise ApiError(
            409,
            "pre-flight found problems: "
            + "; ".join(row.line for row in problems)
            + ". Fix them, leave their variants out (variants), or send launch_anyway: true",
            "preflight",
        )


def _moment(value: datetime | date, end_of_day: bool = False, field: str = "until") -> datetime:
    """A date or a time as an aware time in UTC (a date is its day's start, or the next day's):
    the database takes offsets up to ±15:59 only, and Python's go to ±23:59."""
    try:
        if not isinstance(value, datetime):
            value = datetime.combine(value + timedelta(days=1) if end_of_day else value, time.min)
        aware = value if timezone.is_aware(value) else timezone.make_aware(value)
        return aware.astimezone(UTC)
    except (OverflowError, ValueError):
        raise ApiError(400, f"{value} is outside the dates runs can have", field) from None


def _comparison(runs: list[Run], query: ComparisonQuery) -> dict:
    """The comparison of `runs` as its page's JSON download gives it (`records.comparison_record`)."""
    data = loaded(runs)
    if query.baseline and query.baseline not in {arm.key for arm in data.arms}:
        keys = ", ".join(arm.key for arm in data.arms) or "none: nothing has run yet"
        raise ApiError(400, f"no arm {query.baseline!r} (arms: {keys})", "baseline")
    found = comparison(runs, baseline=query.baseline, tags=list(query.tag), cluster=query.cluster)
    return records.comparison_record(found)


def _get_run(run_id: int) -> Run:
    run = Run.objects.select_related("experiment", "started_by").filter(pk=run_id).first()
    if run is None:
        raise ApiError(404, f"no run {run_id}", "run_id")
    return run


def _experiment_out(experiment: Experiment) -> dict:
    return {
        "slug": experiment.slug,
        "name": experiment.name,
        "description": experiment.description,
        "baseline": experiment.baseline.slug if experiment.baseline else None,
        "repeats": experiment.repeats,
        "variants": [
            {"slug": v.slug, "description": v.description, "agent": v.agent}
            for v in experiment.variants.all()
        ],
        "url": experiment.get_absolute_url(),
    }


def _run_item(run: Run) -> dict:
    return {
        "id": run.pk,
        "experiment": run.experiment.slug,
        "status": run.status,
        "historical": run.historical,
        "started_by": run.started_by.get_username() if run.started_by else None,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "counts": exports.run_counts(run),
        "gates_passed": run.gates_passed,
        "url": run.get_absolute_url(),
        "comparison_url": reverse("api:run_comparison", args=[run.pk]),
    }


def _run_out(run: Run) -> dict:
    return {
        "id": run.pk,
        "experiment": run.experiment.slug,
        "status": run.status,
        "historical": run.historical,
        "cancel_requested": run.cancel_requested,
        # The username only: e-mail addresses and other account data stay private.
        "started_by": run.started_by.get_username() if run.started_by else None,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "overrides": run.overrides,
        "counts": exports.run_counts(run),
        "gates": {"passed": run.gates_passed, "gates": run.gates, "results": run.gate_results},
        "summary": run_summary(run),
        "url": run.get_absolute_url(),
        "trials_url": reverse("api:list_trials", args=[run.pk]),
    }


def run_summary(run: Run) -> dict:
    """The comparison page's summary in its one shape (`stats.records`, docs/schema.md): per
    variant (arm) counts, pass rate with its 95% interval (errors apart), mean score, tokens,
    cost; each arm against the baseline; warnings."""
    return records.comparison_record(compare_runs([run]))


def _trials_of(run: Run, query: TrialQuery):
    trials = (
        Trial.objects.for_run(run)
        .current()
        .order_by("variant__position", "task_version__task__slug", "dataset_row_id", "replicate", "pk")
    )
    if query.status:
        trials = trials.filter(status=query.status)
    if query.variant:
        trials = trials.filter(variant__slug=query.variant)
    return trials


def _trials_csv(request: HttpRequest, run: Run, trials) -> StreamingHttpResponse:
    lines = exports.trials_csv(trials, chunk_size=500)
    if isinstance(request, ASGIRequest):
        lines = exports.pulled(lines)
    response = StreamingHttpResponse(lines, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-trials.csv"'
    return response
