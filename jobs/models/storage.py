from django.db import models


class StorageDeletion(models.Model):
    """Objects to delete: written in the same transaction as the row that owned them (a job, a
    file), so a crash after the commit never leaves them behind. The retention sweep deletes
    the objects again until every transfer URL that could still write there has expired."""

    key = models.CharField(max_length=500, help_text="An object key, or a folder ending in '/'.")
    reason = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)
    last_purged_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.key} ({self.reason})"
