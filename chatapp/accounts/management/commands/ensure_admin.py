"""Make sure someone can log in: create a first admin account if there is none.

The password is random and printed once; change it with `manage.py changepassword`.
"""

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Create the first admin account (password printed once) if none exists."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")

    def handle(self, *args: object, **options: object) -> None:
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            self.stdout.write("An admin account exists already; log in with it.")
            return
        username = str(options["username"])
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, email="", password=password)
        bar = "=" * 60
        self.stdout.write(
            f"{bar}\nCreated the first admin account. Shown once - keep it:\n"
            f"  username: {username}\n  password: {password}\n"
            f"(change it with: python manage.py changepassword {username})\n{bar}"
        )
