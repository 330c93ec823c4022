from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from experiments_app.models import Experiment


@login_required
@require_GET
def experiment_list(request: HttpRequest) -> HttpResponse:
    experiments = Experiment.objects.prefetch_related("variants").order_by("slug")
    return render(request, "experiments/experiment_list.html", {"experiments": experiments})


@login_required
@require_GET
def experiment_detail(request: HttpRequest, slug: str) -> HttpResponse:
    experiment = get_object_or_404(Experiment, slug=slug)
    return render(
        request,
        "experiments/experiment_detail.html",
        {
            "experiment": experiment,
            "variants": experiment.variants.all(),
            "task_count": experiment.selected_tasks().count(),
            "runs": experiment.runs.order_by("-created_at")[:20],
        },
    )
