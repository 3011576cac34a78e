import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs.services.accounts.audit import Actor
from jobs.services.serving.servers import server_register


class Command(BaseCommand):
    help = (
        "Register inference server NAME at URL (vLLM with --enable-lora and runtime LoRA "
        "updating and `python -m gpu_worker serve-loader` beside it at --loader-url, or "
        "`python -m gpu_worker serve`) for jobs whose base model is BASE_MODEL; "
        "registering a name again updates it and puts it back online. The server's API key, "
        "if it has one, is read from standard input (--api-key-stdin) and stored encrypted."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("url", help="its base URL, e.g. http://10.0.0.5:8000 (no /v1)")
        parser.add_argument("--base-model", required=True, help="the jobs' base model it serves")
        parser.add_argument("--served-name", help="what the server calls it (default: the same)")
        parser.add_argument("--max-adapters", type=int, default=4)
        parser.add_argument(
            "--loader-url",
            default="",
            help="where adapters are loaded, when not at URL: vLLM's serve-loader beside it",
        )
        parser.add_argument("--api-key-stdin", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        url, loader_url = options["url"], options["loader_url"]
        for given in filter(None, (url, loader_url)):
            if not given.startswith(("http://", "https://")):
                raise CommandError(f"URLs must start with http:// or https:// (got {given!r})")
        key = sys.stdin.readline().strip() if options["api_key_stdin"] else None
        server = server_register(
            name=options["name"],
            url=url,
            base_model=options["base_model"],
            served_name=options["served_name"] or options["base_model"],
            api_key=key or None,
            max_adapters=options["max_adapters"],
            loader_url=loader_url,
            actor=Actor.command("register_server"),
        )
        self.stdout.write(f"Inference server '{server.name}' registered for {server.base_model}.")
