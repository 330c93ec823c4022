"""`manage.py evalreport RUN_ID --format md|json|junit|html [-o FILE]`: a run's report."""

import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from evalsite.files import user_umask
from runs_app.analysis import reports
from runs_app.models import Run


class Command(BaseCommand):
    help = "Write a run's report: Markdown, JSON, JUnit XML, or one self-contained HTML file."
    # It only reads: the system checks (URLs, templates, security settings) are the server's
    # business, and cost half a second of a report's five.
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("run_id", type=int)
        parser.add_argument("-f", "--format", dest="fmt", choices=reports.FORMATS, default="md")
        parser.add_argument("-o", "--output", type=Path, help="write to this file (default: standard output)")

    def handle(self, *args, run_id: int, fmt: str, output: Path | None, **options):
        run = Run.objects.select_related("experiment").filter(pk=run_id).first()
        if run is None:
            raise CommandError(f"no run {run_id}", returncode=2)
        if fmt == "html":
            report = reports.build_report(run, figures=True, unsuccessful=reports.HTML_TRIAL_ROWS)
        else:
            report = reports.build_report(run)
        text = reports.render(report, fmt)
        if output is None:
            sys.stdout.write(text)
            return
        with user_umask():
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(text, encoding="utf-8")
        self.stderr.write(f"wrote {output} ({len(text.encode()):,} bytes)")
