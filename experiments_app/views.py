"""Experiment set-up, task set and task pages: what to evaluate.

The pages that show runs (the experiment list and page, launching) live in `runs_app.web`.
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from experiments_app import definitions
from experiments_app import forms as ef
from experiments_app.models import Experiment, Task, TaskSet
from experiments_app.specs.attachments import suggested_command

TASK_PAGE_SIZE = 100
SET_EDITOR_ROWS = 200  # tasks the set editor lists at once (search narrows them)
TASK_PREVIEW = 12


def _get_experiment_for_user(request: HttpRequest, slug: str) -> Experiment:
    # Every signed-in member may see, edit and launch every experiment (a team tool); this is
    # the one place to narrow that.
    return get_object_or_404(Experiment.objects.select_related("baseline"), slug=slug)


# --- experiment set-up ----------------------------------------------------------------------


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
    files = request.FILES if request.method == "POST" else None
    form = ef.ExperimentForm(data, files, initial=initial, editing=experiment)
    formset = ef.VariantFormSet(data, initial=variant_initials, prefix="variants")
    formset.extra = 0 if experiment else 2  # a new experiment compares two variants, usually
    if data is not None:
        # Every check in one pass: the fields', then the importer's on what could be read, so a
        # bad field does not hide the baseline or a duplicate variant until the next round.
        fields_ok = all([form.is_valid(), formset.is_valid()])
        saved = _save(request, form, formset, experiment, fields_ok)
        if saved is not None:
            messages.success(request, f"Saved experiment {saved.slug}.")
            return redirect(saved)
    return render(request, "experiments/experiment_form.html", _form_context(form, formset, experiment))


def _save(request: HttpRequest, form, formset, experiment: Experiment | None, fields_ok: bool = True):
    """Validate with the importer's spec and store; None when errors went onto the forms. With
    `fields_ok` false it only adds the spec's errors (reading each bad field as empty)."""
    if not fields_ok:
        ef.fill_unreadable(form)
        for variant_form in formset.forms:
            ef.fill_unreadable(variant_form)
    deleted = [f for f in formset.forms if f.cleaned_data.get("DELETE")]
    variant_forms = [f for f in formset.forms if f not in deleted and f.cleaned_data]
    data, sources = ef.spec_data(form, variant_forms)
    spec, issues = ef.validate_spec(data)
    attachment = form.cleaned_data.get("attachment") or {}
    issues += ef.command_issues(data)
    if spec is not None:
        issues += ef.file_reference_issues(spec, experiment, list(attachment))
    problems = ef.in_use_issues(experiment, sources, deleted) + _script_problems(
        form, data, sources, spec, experiment, list(attachment)
    )
    if spec is None or issues or problems or not fields_ok:
        ef.apply_issues(issues, form, formset, sources, skip_bad_fields=not fields_ok)
        return None
    name = form.cleaned_data["name"].strip()
    try:
        return definitions.save_experiment(
            spec, name=name, experiment=experiment, user=request.user, attachments=attachment
        )
    except definitions.NotAllowed as refusal:
        form.add_error(None, str(refusal))
        return None
    except definitions.ImportFailed as failed:
        for issue in failed.issues:
            form.add_error(None, f"its files cannot be bundled: {issue}")
        return None


def _script_problems(
    form, data: dict, sources, spec, experiment: Experiment | None, attached: list[str]
) -> int:
    """The attachment trap, on the fields that set it: a file attached that no variant uses, a
    command that would miss its script. Returns how many problems were found."""
    files = [*definitions.files_beside_yaml(experiment), *attached]
    found = 0
    for index, option, message in ef.script_issues(data, files):
        variant_form = sources[index].form
        variant_form.add_error(option if variant_form.cleaned_data.get(option) else "options", message)
        found += 1
    for message in ef.unused_attachment_issues(spec, attached) if spec is not None else []:
        form.add_error("attachment", message)
        found += 1
    return found


def _form_context(form, formset, experiment: Experiment | None) -> dict:
    selection = ef.TaskSelectionForm(form.data or None, initial=form.initial)
    problems = [
        *(f"{_label(form, name)}: {e}" for name, errors in form.errors.items() for e in errors),
        *(
            f"variant {i + 1} · {_label(vf, name)}: {e}"
            for i, vf in enumerate(formset.forms) for name, errors in vf.errors.items() for e in errors
        ),
        *(f"variants: {e}" for e in formset.non_form_errors()),
    ] if form.is_bound else []  # fmt: skip
    files = definitions.files_beside_yaml(experiment)
    return {
        "form": form,
        "formset": formset,
        "experiment": experiment,
        "problems": problems,
        "experiment_files": files,
        "command_suggestions": sorted({suggested_command(name) for name in files}),
        **_matching(selection),
    }


def _label(form, name: str) -> str:
    return str(form.fields[name].label or name.replace("_", " ")) if name in form.fields else "form"


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
    try:
        copy = definitions.duplicate_experiment(_get_experiment_for_user(request, slug), user=request.user)
    except definitions.ImportFailed as failed:
        messages.error(
            request, f"Not duplicated: its files cannot be bundled: {'; '.join(failed.issues[:5])}."
        )
        return redirect("experiment_detail", slug=slug)
    messages.success(request, f"Duplicated as {copy.slug}: rename it, change what you want to try, save.")
    return redirect("experiment_edit", slug=copy.slug)


@login_required
@require_GET
def experiment_yaml(request: HttpRequest, slug: str) -> HttpResponse:
    experiment = _get_experiment_for_user(request, slug)
    text = definitions.experiment_yaml(experiment)
    files = sorted(set(definitions.bundled_files(experiment)) - {experiment.yaml_path})
    if files:
        # The YAML alone names files it does not hold: say where the whole experiment is.
        url = request.build_absolute_uri(reverse("experiment_bundle", args=[experiment.slug]))
        text = f"# Names files this YAML does not hold ({', '.join(files[:5])}): {url} has them all.\n" + text
    response = HttpResponse(text, content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{experiment.slug}.yaml"'
    return response


@login_required
@require_GET
def experiment_bundle(request: HttpRequest, slug: str) -> HttpResponse:
    """The experiment and every file it names, in one zip that imports back to the same digest."""
    experiment = _get_experiment_for_user(request, slug)
    try:
        content = definitions.experiment_zip(experiment)
    except definitions.ImportFailed as failed:
        messages.error(request, f"{experiment.slug} cannot be bundled: {'; '.join(failed.issues[:5])}")
        return redirect(experiment)
    response = HttpResponse(content, content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="{experiment.slug}.zip"'
    return response


@login_required
@require_POST
def experiment_import(request: HttpRequest) -> HttpResponse:
    """Upload an experiment (its zip, or a YAML naming no files): checked as `import_experiment`
    checks a folder, nothing stored on error."""
    form = ef.ExperimentUploadForm(request.POST, request.FILES)
    if not form.is_valid():
        messages.error(request, "Choose an experiment's .zip (or a .yaml file) to upload.")
        return redirect("experiment_list")
    try:
        report = definitions.import_experiment_upload(
            form.cleaned_data["file"], user=request.user, replace=form.cleaned_data["replace"]
        )
    except definitions.ImportFailed as failed:
        for issue in failed.issues[:20]:
            messages.error(request, issue)
        messages.error(request, f"Nothing was imported: {len(failed.issues)} problem(s).")
        return redirect("experiment_list")
    for warning in report.warnings:
        messages.warning(request, warning)
    verb = "Imported" if report.created else "Replaced"
    messages.success(request, f"{verb} experiment {report.experiment.slug}.")
    return redirect(report.experiment)


# --- task sets and tasks --------------------------------------------------------------------


@login_required
@require_GET
def taskset_list(request: HttpRequest) -> HttpResponse:
    show_archived = request.GET.get("archived") == "1"
    task_sets = TaskSet.objects.annotate(task_count=Count("tasks", distinct=True)).order_by("name")
    if not show_archived:
        task_sets = task_sets.filter(archived=False)
    ctx = {"task_sets": task_sets, "show_archived": show_archived}
    return render(request, "experiments/taskset_list.html", ctx)


@login_required
@require_GET
def taskset_detail(request: HttpRequest, name: str) -> HttpResponse:
    task_set = get_object_or_404(TaskSet, name=name)
    ctx = {
        "task_set": task_set,
        "tasks": task_set.tasks.order_by("slug"),
        "experiments": task_set.experiments.order_by("slug"),
        "upload_form": ef.TaskUploadForm(),
    }
    return render(request, "experiments/taskset_detail.html", ctx)


def _staff_only(request: HttpRequest, what: str) -> None:
    if not request.user.is_staff:
        raise PermissionDenied(f"Only staff {what}.")


@login_required
@require_http_methods(["GET", "POST"])
def taskset_create(request: HttpRequest) -> HttpResponse:
    _staff_only(request, "create task sets")
    form = ef.TaskSetForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        task_set = form.save()
        messages.success(request, f"Created task set {task_set.name}: now add its tasks.")
        return redirect("taskset_edit", name=task_set.name)
    return render(request, "experiments/taskset_form.html", {"form": form, "task_set": None})


@login_required
@require_http_methods(["GET", "POST"])
def taskset_edit(request: HttpRequest, name: str) -> HttpResponse:
    """Rename, describe or archive a set; add or remove the ticked tasks of a searched list."""
    _staff_only(request, "edit task sets")
    task_set = get_object_or_404(TaskSet, name=name)
    form = ef.TaskSetForm(request.POST if "save" in request.POST else None, instance=task_set)
    members = ef.TaskSetMembersForm(request.POST if "action" in request.POST else None)
    if form.is_bound and form.is_valid():
        task_set = form.save()
        messages.success(request, f"Saved task set {task_set.name}.")
        return redirect("taskset_edit", name=task_set.name)
    if members.is_bound and members.is_valid():
        chosen, add = members.cleaned_data["tasks"], members.cleaned_data["action"] == "add"
        (task_set.tasks.add if add else task_set.tasks.remove)(*chosen)
        verb = "Added" if add else "Removed"
        messages.success(request, f"{verb} {len(chosen)} task(s) {'to' if add else 'from'} {task_set.name}.")
        return redirect(f"{reverse('taskset_edit', args=[task_set.name])}?{request.GET.urlencode()}")
    return render(request, "experiments/taskset_form.html", _set_editor_context(request, form, task_set))


def _set_editor_context(request: HttpRequest, form, task_set: TaskSet) -> dict:
    filters_form = ef.TaskFilterForm(request.GET)
    filters = filters_form.cleaned_data if filters_form.is_valid() else {}
    tasks = Task.objects.order_by("slug").defer("spec", "source_yaml", "prompt")
    if filters.get("q"):
        tasks = tasks.filter(Q(slug__icontains=filters["q"]) | Q(description__icontains=filters["q"]))
    if filters.get("tag"):
        tasks = tasks.with_tags([filters["tag"]], [])
    member_ids = set(task_set.tasks.values_list("pk", flat=True))
    shown = list(tasks[: SET_EDITOR_ROWS + 1])
    return {
        "form": form,
        "task_set": task_set,
        "filters_form": filters_form,
        "rows": [(task, task.pk in member_ids) for task in shown[:SET_EDITOR_ROWS]],
        "more": len(shown) > SET_EDITOR_ROWS,
        "member_count": len(member_ids),
    }


@login_required
@require_POST
def taskset_upload(request: HttpRequest, name: str) -> HttpResponse:
    """Import a task file or zip into this set, with the importer's checks and errors."""
    _staff_only(request, "upload tasks")
    task_set = get_object_or_404(TaskSet, name=name)
    form = ef.TaskUploadForm(request.POST, request.FILES)
    if not form.is_valid():
        messages.error(request, "Choose a task YAML file, or a .zip of YAML tasks or Harbor task folders.")
        return redirect("taskset_detail", name=task_set.name)
    try:
        report = definitions.import_upload(form.cleaned_data["file"], task_set.name)
    except definitions.ImportFailed as exc:
        for issue in exc.issues[:20]:
            messages.error(request, issue)
        messages.error(request, f"Nothing was imported: {len(exc.issues)} problem(s).")
    else:
        for warning in report.warnings:
            messages.warning(request, warning)
        messages.success(request, f"Imported into {task_set.name}: {report.summary()}")
    return redirect("taskset_detail", name=task_set.name)


@login_required
@require_GET
def taskset_export(request: HttpRequest, name: str) -> HttpResponse:
    _staff_only(request, "export task sets")
    task_set = get_object_or_404(TaskSet, name=name)
    response = HttpResponse(
        definitions.export_tasks_zip(task_set.tasks.all()), content_type="application/zip"
    )
    response["Content-Disposition"] = f'attachment; filename="{task_set.name}.zip"'
    return response


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
        "quarantine": task.quarantines.active().select_related("created_by").first(),
    }
    return render(request, "experiments/task_detail.html", ctx)
