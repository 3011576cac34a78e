from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs.errors import ServiceError
from jobs.services.accounts.audit import Actor
from jobs.services.fleet.nodes import node_create, node_get, node_rotate_token


class Command(BaseCommand):
    help = (
        "Create GPU node NAME (or, with --rotate, give it a new token). The token is printed "
        "once, on the last line: start the node with TRAINHUB_NODE_TOKEN set to it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--rotate", action="store_true", help="new token for an existing node")

    def handle(self, *args: Any, name: str, rotate: bool, **options: Any) -> None:
        actor = Actor.command("create_node")
        try:
            if rotate:
                token = node_rotate_token(node=node_get(name=name), actor=actor)
            else:
                _, token = node_create(name=name, actor=actor)
        except ServiceError as exc:
            raise CommandError(exc.message) from None
        self.stderr.write(f"Token for GPU node '{name}' (shown once):")
        self.stdout.write(token)
