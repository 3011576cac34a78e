from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs.errors import ServiceError
from jobs.models import Project
from jobs.services.accounts.audit import Actor
from jobs.services.accounts.projects import api_key_create


class Command(BaseCommand):
    help = "Create an API key for USERNAME; the key is printed once, on the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--project", help="project slug (default: the user's default project)")
        parser.add_argument("--name", default="cli", help="a label for the key")

    def handle(
        self, *args: Any, username: str, project: str | None, name: str, **options: Any
    ) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user '{username}'. Create one with: manage.py createsuperuser")
        target = None
        if project:
            target = Project.objects.filter(slug=project).first()
            if target is None:
                raise CommandError(f"No project '{project}'.")
        try:
            key, raw = api_key_create(
                user=user, name=name, project=target, actor=Actor.command("create_api_key")
            )
        except ServiceError as exc:
            raise CommandError(exc.message) from None
        self.stderr.write(f"API key '{key.name}' for {username} in project {key.project.slug}:")
        self.stdout.write(raw)
