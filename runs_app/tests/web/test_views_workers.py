"""The workers page: whether each worker runs containers, and why not."""

import pytest
from django.urls import reverse
from django.utils import timezone

from runs_app.models import Worker


@pytest.mark.django_db
def test_the_workers_page_says_which_workers_run_containers_and_why_the_others_do_not(member_client):
    now = timezone.now()
    Worker.objects.create(
        name="w1@host-c", hostname="host-c", last_seen_at=now,
        capabilities={"containers": True, "engine": "docker 20.10.24+dfsg1",
                      "images": ["evalsite/busybox"], "missing": ["debian:bookworm-slim"]},
    )  # fmt: skip
    Worker.objects.create(
        name="w1@host-n", hostname="host-n", last_seen_at=now,
        capabilities={"containers": False, "reason": "EVALSITE_CONTAINER_ENGINE=none: no container trials"},
    )  # fmt: skip
    Worker.objects.create(name="w1@host-old", hostname="host-old", last_seen_at=now)

    page = member_client.get(reverse("worker_list")).content.decode()

    cells = page.split('data-testid="containers">')[1:]
    assert [cell.split("</td>")[0] for cell in cells] == [
        '<span class="nowrap">yes: docker 20.10.24+dfsg1</span><br><span class="muted">missing images: '
        "debian:bookworm-slim (make containers)</span>",
        'no: <span class="muted">EVALSITE_CONTAINER_ENGINE=none: no container trials</span>',
        "—",
    ]
