from typing import Any

from django.core.management.base import BaseCommand

from jobs.services.accounts.projects import secrets_reencrypt


class Command(BaseCommand):
    help = (
        "Re-encrypt every stored secret (provider credentials, webhook endpoints' signing "
        "secrets, rented machines' SSH keys) under the first key of TRAINHUB_ENCRYPTION_KEYS. "
        "Rotation: prepend a new key everywhere, restart, run this, then drop the old key."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        for field, count in secrets_reencrypt().items():
            self.stdout.write(f"re-encrypted {count} {field}")
