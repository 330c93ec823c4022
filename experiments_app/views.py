"""Experiment, task set and task pages: set up an experiment in the browser and launch it."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count, OuterRef, Q, Subquery
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from experiments_app import forms as ef
from experiments_app.models import Experiment, Task, TaskSet

TASK_PAGE_SIZE = 100
TASK_PREVIEW = 12


def _get_experiment_for_user(request: HttpRequest, slug: str) -> Experiment:
    # Every signed-in member may see, edit and launch every experiment (a team tool); this is
    # the one place to narrow that.
    return get_object_or_404(Experiment.objects.select_related("baseline"), slug=slug)


def _last_run(field: str) -> Subquery:
    from runs_app.models import Run  # runs_app depends on experiments_app, never the reverse at import

    newest = Run.objects.filter(experiment=OuterRef("pk")).order_by("-created_at", "-pk")
    return Subquery(newest.values(field)[:1])


def with_last_run(experiments):
    """Annotate each experiment with its newest run's id, status and counts (one query)."""
    names = ("pk", "status", "n_trials", "n_passed", "n_failed", "n_error", "created_at")
    return experiments.annotate(**{f"last_run_{name}": _last_run(name) for name in names})


# --- experiments --------------------------------------------------------------------------------


@login_required
@require_GET
def experiment_list(request: HttpRequest) -> HttpResponse:
    experiments = with_last_run(Experiment.objects.prefetch_related("variants")).order_by("slug")
    return render(request, "experiments/experiment_list.html", {"experiments": experiments})


@login_required
@require_GET
def experiment_detail(request: HttpRequest, slug: str) -> HttpResponse:
    experiment = _get_experiment_for_user(request, slug)
    tasks = experiment.selected_tasks()
    task_count = tasks.count()
    variants = list(experiment.variants.order_by("position", "pk"))
    ctx = {
        "experiment": experiment,
        "variants": variants,
        # Dataset tasks fan out into one trial per row, so this is a lower bound.
        "trials_per_run": task_count * sum(v.effective_repeats() for v in variants),
        "task_sets": experiment.task_sets.all(),
        "task_count": task_count,
        "task_preview": tasks[:TASK_PREVIEW],
        "task_more": max(0, task_count - TASK_PREVIEW),
        "runs": experiment.runs.select_related("started_by").order_by("-created_at")[:20],
        "launch_form": ef.LaunchForm(),
    }
    return render(request, "experiments/experiment_detail.html", ctx)


@login_required
@require_http_methods(["GET", "POST"])
def experiment_create(request: HttpRequest) -> HttpResponse:
    return _edit(request, None)


@login_required
@require_http_methods(["GET", "POST"])
def experiment_edit(request: HttpRequest, slug: str) -> HttpResponse:
    return _edit(request, _get_experiment_for_user(request, slug))


def _edit(request: HttpRequest, experiment: Experiment | None) -> HttpResponse:
    initial, variant_initials = ef.experiment_initial(experiment) if experiment else ({}, [])
    data = request.POST if request.method == "POST" else None
    form = ef.ExperimentForm(data, initial=initial, editing=experiment)
    formset = ef.VariantFormSet(data, initial=variant_initials, prefix="variants")
    formset.extra = 0 if experiment else 2  # a new experiment compares two variants, usually
    if data is not None and form.is_valid() and formset.is_valid():
        saved = _save(request, form, formset, experiment)
        if saved is not None:
            messages.success(request, f"Saved experiment {saved.slug}.")
            return redirect(saved)
    return render(request, "experiments/experiment_form.html", _form_context(form, formset, experiment))


def _save(request: HttpRequest, form, formset, experiment: Experiment | None) -> Experiment | None:
    """Validate with the importer's spec and store; None when errors went onto the forms."""
    deleted = formset.deleted_forms
    variant_forms = [f for f in formset.forms if f not in deleted and f.cleaned_data]
    data, sources = ef.spec_data(form, variant_forms)
    spec, issues = ef.validate_spec(data)
    if spec is not None:
        issues = ef.file_reference_issues(spec, experiment)
    problems = ef.in_use_issues(experiment, sources, deleted)
    if spec is None or issues or problems:
        ef.apply_issues(issues, form, formset, sources)
        return None
    name = form.cleaned_data["name"].strip()
    return ef.save_experiment(spec, name=name, experiment=experiment, user=request.user)


def _form_context(form, formset, experiment: Experiment | None) -> dict:
    selection = ef.TaskSelectionForm(form.data or None, initial=form.initial)
    return {
        "form": form,
        "formset": formset,
        "experiment": experiment,
        **_matching(selection),
    }


def _matching(selection: ef.TaskSelectionForm) -> dict:
    """The count and first few tasks of a task selection (the form's initial values when unbound)."""
    if selection.is_bound and not selection.is_valid():
        problems = [f"{name}: {error}" for name, errors in selection.errors.items() for error in errors]
        return {"task_count": None, "task_preview": [], "selection_errors": problems}
    values = selection.cleaned_data if selection.is_bound else selection.initial
    sets = [getattr(s, "name", s) for s in values.get("task_sets") or []]
    tasks = ef.matching_tasks(
        sets, ef.split_tags(values.get("include_tags") or ""), ef.split_tags(values.get("exclude_tags") or "")
    )
    return {"task_count": tasks.count(), "task_preview": tasks[:TASK_PREVIEW]}


@login_required
@require_GET
def experiment_matching_tasks(request: HttpRequest) -> HttpResponse:
    """The live "N tasks match" box of the experiment form."""
    ctx = _matching(ef.TaskSelectionForm(request.GET))
    return render(request, "experiments/experiment_form.html#task-count", ctx)


@login_required
@require_POST
def experiment_duplicate(request: HttpRequest, slug: str) -> HttpResponse:
    copy = ef.duplicate_experiment(_get_experiment_for_user(request, slug), user=request.user)
    messages.success(request, f"Duplicated as {copy.slug}: rename it, change what you want to try, save.")
    return redirect("experiment_edit", slug=copy.slug)


@login_required
@require_GET
def experiment_yaml(request: HttpRequest, slug: str) -> HttpResponse:
    experiment = _get_experiment_for_user(request, slug)
    response = HttpResponse(ef.experiment_yaml(experiment), content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{experiment.slug}.yaml"'
    return response


@login_required
@require_POST
def experiment_launch(request: HttpRequest, slug: str) -> HttpResponse:
    from runs_app.launching import LaunchError, LaunchOptions, launch_run

    experiment = _get_experiment_for_user(request, slug)
    form = ef.LaunchForm(request.POST)
    if not form.is_valid():
        for field, errors in form.errors.items():
            messages.error(request, f"Launch: {field}: {' '.join(errors)}")
        return redirect(experiment)
    options = LaunchOptions(**{k: v for k, v in form.cleaned_data.items() if v not in (None, [])})
    try:
        run = launch_run(experiment, user=request.user, options=options)
    except LaunchError as exc:
        for problem in exc.problems[:20]:
            messages.error(request, f"Cannot launch: {problem}")
        return redirect(experiment)
    messages.success(request, f"Launched run #{run.pk}: {run.n_trials} trials.")
    return redirect(run)


# --- task sets and tasks --------------------------------------------------------------------


@login_required
@require_GET
def taskset_list(request: HttpRequest) -> HttpResponse:
    task_sets = TaskSet.objects.annotate(task_count=Count("tasks", distinct=True)).order_by("name")
    return render(request, "experiments/taskset_list.html", {"task_sets": task_sets})


@login_required
@require_GET
def taskset_detail(request: HttpRequest, name: str) -> HttpResponse:
    task_set = get_object_or_404(TaskSet, name=name)
    ctx = {
        "task_set": task_set,
        "tasks": task_set.tasks.order_by("slug"),
        "experiments": task_set.experiments.order_by("slug"),
    }
    return render(request, "experiments/taskset_detail.html", ctx)


@login_required
@require_http_methods(["GET", "POST"])
def taskset_edit(request: HttpRequest, name: str) -> HttpResponse:
    if not request.user.is_staff:
        raise PermissionDenied("Only staff edit task sets.")
    task_set = get_object_or_404(TaskSet, name=name)
    form = ef.TaskSetForm(request.POST or None, instance=task_set)
    if request.method == "POST" and form.is_valid():
        task_set = form.save()
        messages.success(request, f"Saved task set {task_set.name}.")
        return redirect("taskset_detail", name=task_set.name)
    return render(request, "experiments/taskset_form.html", {"form": form, "task_set": task_set})


@login_required
@require_GET
def task_list(request: HttpRequest) -> HttpResponse:
    form = ef.TaskFilterForm(request.GET)
    filters = form.cleaned_data if form.is_valid() else {}
    tasks = Task.objects.prefetch_related("task_sets").order_by("slug")
    if filters.get("q"):
        tasks = tasks.filter(Q(slug__icontains=filters["q"]) | Q(description__icontains=filters["q"]))
    if filters.get("tag"):
        tasks = tasks.with_tags([filters["tag"]], [])
    page = Paginator(tasks.defer("spec", "source_yaml", "prompt"), TASK_PAGE_SIZE).get_page(
        filters.get("page")
    )
    return render(request, "experiments/task_list.html", {"form": form, "page": page})


@login_required
@require_GET
def task_detail(request: HttpRequest, slug: str) -> HttpResponse:
    task = get_object_or_404(Task, slug=slug)
    ctx = {
        "task": task,
        "versions": task.versions.order_by("-number").only("number", "created_at", "bundle_id", "task_id"),
        "task_sets": task.task_sets.all(),
        "criteria": task.spec.get("success_criteria", []),
    }
    return render(request, "experiments/task_detail.html", ctx)
