import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the admin account with a generated password (printed once), unless it exists."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")

    def handle(self, *args, username: str, **options):
        User = get_user_model()
        if User.objects.filter(username=username).exists():
            self.stdout.write(
                f"Admin account '{username}' already exists "
                f"(reset its password with: .venv/bin/python manage.py changepassword {username})"
            )
            return
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, email="", password=password)
        self.stdout.write(self.style.SUCCESS(f"Created admin account: {username} / {password}"))
        self.stdout.write("This password is shown only once.")
