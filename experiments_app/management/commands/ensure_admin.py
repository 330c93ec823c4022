import secrets
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the admin account with a generated password (printed once), unless it exists."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")
        parser.add_argument(
            "--password-file",
            type=Path,
            help="write the new password there (mode 0600) instead of printing it: `make run` prints it "
            "last, beside the site's address, and removes the file",
        )

    def handle(self, *args, username: str, password_file: Path | None = None, **options):
        User = get_user_model()
        if User.objects.filter(username=username).exists():
            self.stdout.write(
                f"Admin account '{username}' already exists "
                f"(reset its password with: .venv/bin/python manage.py changepassword {username})"
            )
            return
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, email="", password=password)
        if password_file is not None:
            password_file.parent.mkdir(parents=True, exist_ok=True)
            password_file.write_text(f"{username} {password}\n")  # (0600: settings' umask)
            self.stdout.write(f"Created admin account {username!r}: its password is shown as the site starts")
            return
        self.stdout.write(self.style.SUCCESS(f"Created admin account: {username} / {password}"))
        self.stdout.write("This password is shown only once.")
