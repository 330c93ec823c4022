"""The experiment pages that show runs: the list (with each experiment's last run), one
experiment's page (its tasks, variants and runs) and launching a run of it.

Setting an experiment up (create, edit, duplicate, YAML) is experiments_app's.
"""

from collections import Counter

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from experiments_app.forms import ExperimentUploadForm, LaunchForm
from experiments_app.models import Experiment
from runs_app import preflight
from runs_app.launching import LaunchError, LaunchOptions, launch_run, preview_trials, run_plan
from runs_app.models import with_last_run
from runs_app.web.presenters import as_text, attach_last_run_rates, attach_variant_rates, config_for_kind

TASK_PREVIEW = 12


def get_experiment_for_user(request: HttpRequest, slug: str) -> Experiment:
    # Every signed-in member may see and launch every experiment (a team tool).
    return get_object_or_404(Experiment.objects.select_related("baseline"), slug=slug)


@login_required
@require_GET
def experiment_list(request: HttpRequest) -> HttpResponse:
    experiments = attach_last_run_rates(
        list(with_last_run(Experiment.objects.with_variants()).order_by("slug"))
    )
    ctx = {"experiments": experiments, "upload_form": ExperimentUploadForm()}
    return render(request, "experiments/experiment_list.html", ctx)


@login_required
@require_GET
def experiment_detail(request: HttpRequest, slug: str) -> HttpResponse:
    experiment = get_experiment_for_user(request, slug)
    tasks = experiment.selected_tasks()
    task_count = tasks.count()
    variants = list(experiment.variants.order_by("position", "pk"))
    plan = run_plan(experiment)
    trials, preview, problems = launch_preview(experiment)
    checked = preflight.check(experiment, trials=trials) if trials else None
    ctx = {
        "experiment": experiment,
        "variants": variants,
        "preflight": checked,
        "launch_without": _launch_without(variants, checked),
        # The launcher's own dry run: exactly the trials a launch without options makes.
        "trials_per_run": sum(count for _, count, _ in preview),
        "preview": preview,
        "preview_problems": problems,
        "plan": plan,
        "task_sets": experiment.task_sets.all(),
        "task_count": task_count,
        "task_preview": tasks[:TASK_PREVIEW],
        "task_more": max(0, task_count - TASK_PREVIEW),
        "runs": attach_variant_rates(
            list(experiment.runs.select_related("started_by").order_by("-created_at")[:20])
        ),
        "launch_form": LaunchForm(),
    }
    return render(request, "experiments/experiment_detail.html", ctx)


def launch_preview(experiment) -> tuple[list, list[tuple[str, int, str]], list[str]]:
    """The trials a launch would make; (variant, trials, resolved config of its first trial)
    per variant; or the problems that would stop the launch."""
    try:
        trials = preview_trials(experiment)
    except LaunchError as exc:
        return [], [], exc.problems[:10]
    counts = Counter(trial.variant.slug for trial in trials)
    first: dict[str, tuple[dict, dict]] = {}
    for trial in trials:
        first.setdefault(trial.variant.slug, (trial.config, trial.lineage))
    shown = [(slug, counts[slug], as_text(config_for_kind(*first[slug])[0])) for slug in first]
    return trials, shown, []


def _launch_without(variants: list, checked: preflight.Preflight | None) -> str:
    """The variants left once those with pre-flight problems are out ("" when none or all are)."""
    if checked is None or not checked.problems:
        return ""
    refused = set(checked.variants_with_problems())
    kept = [variant.slug for variant in variants if variant.slug not in refused]
    return ",".join(kept)


@login_required
@require_POST
def experiment_launch(request: HttpRequest, slug: str) -> HttpResponse:
    experiment = get_experiment_for_user(request, slug)
    form = LaunchForm(request.POST)
    if not form.is_valid():
        for field, errors in form.errors.items():
            messages.error(request, f"Launch: {field}: {' '.join(errors)}")
        return redirect(experiment)
    chosen = {k: v for k, v in form.cleaned_data.items() if v not in (None, []) and k != "confirm"}
    options = LaunchOptions(**chosen)
    if not form.cleaned_data["confirm"] and _preflight_refuses(request, experiment, options):
        return redirect(experiment)
    try:
        run = launch_run(experiment, user=request.user, options=options)
    except LaunchError as exc:
        for problem in exc.problems[:20]:
            messages.error(request, f"Cannot launch: {problem}")
        return redirect(experiment)
    messages.success(request, f"Launched run #{run.pk}: {run.n_trials} trials.")
    return redirect(run)


def _preflight_refuses(request: HttpRequest, experiment: Experiment, options: LaunchOptions) -> bool:
    """Whether pre-flight found problems (each said as a message, with its fix): nothing is
    launched until they are fixed, their variants left out, or "Launch anyway" is chosen."""
    found = preflight.check(experiment, options).problems
    for row in found[:20]:
        messages.warning(request, f"Pre-flight: {row.line}")
    if found:
        messages.error(
            request,
            f"Not launched: pre-flight found {len(found)} problem{'s' if len(found) != 1 else ''} (above). "
            "Fix them, launch without their variants, or launch anyway.",
        )
    return bool(found)
