from typing import Any

from django.core.management.base import BaseCommand

from jobs.services.accounts.projects import credentials_reencrypt


class Command(BaseCommand):
    help = (
        "Re-encrypt every stored provider credential under the first key of "
        "TRAINHUB_ENCRYPTION_KEYS. Rotation: prepend a new key, run this, then drop the old key."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        count = credentials_reencrypt()
        self.stdout.write(f"re-encrypted {count} credential(s)")
