from django.contrib.auth.decorators import login_required
from django.db.models import Case, IntegerField, Value, When
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from experiments_app.models import Experiment
from runs_app.models import Run, Trial


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    running_first = Case(
        When(status__in=[Run.Status.RUNNING, Run.Status.QUEUED], then=Value(0)),
        default=Value(1),
        output_field=IntegerField(),
    )
    runs = Run.objects.select_related("experiment").order_by(running_first, "-created_at")[:20]
    experiments = Experiment.objects.order_by("slug")[:50]
    return render(request, "runs/home.html", {"runs": runs, "experiments": experiments})


@login_required
@require_GET
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(Run.objects.select_related("experiment"), pk=run_id)
    trials = (
        Trial.objects.for_run(run)
        .latest()
        .select_related("variant", "task_version__task")
        .order_by("variant__position", "task_version__task__slug", "replicate")
    )
    return render(request, "runs/run_detail.html", {"run": run, "trials": trials})


@login_required
@require_GET
def trial_detail(request: HttpRequest, run_id: int, trial_id: int) -> HttpResponse:
    trial = get_object_or_404(
        Trial.objects.select_related("run__experiment", "variant", "task_version__task"),
        pk=trial_id,
        run_id=run_id,
    )
    return render(
        request,
        "runs/trial_detail.html",
        {
            "trial": trial,
            "criteria": trial.criterion_results.all(),
            "events": trial.events.all()[:2000],
        },
    )
