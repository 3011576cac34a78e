from django.conf import settings
from django.db import models

from jobs.models.ids import new_file_id


class TrainingFile(models.Model):
    class Status(models.TextChoices):
        UPLOADED = "uploaded"
        PROCESSING = "processing"
        PROCESSED = "processed"
        ERROR = "error"

    public_id = models.CharField(max_length=40, unique=True, default=new_file_id, editable=False)
    project = models.ForeignKey("jobs.Project", on_delete=models.CASCADE, related_name="files")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    purpose = models.CharField(max_length=32, default="fine-tune")
    filename = models.CharField(max_length=255)
    bytes = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    storage_key = models.CharField(max_length=500)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.UPLOADED)
    format = models.CharField(max_length=32, blank=True)
    example_count = models.PositiveIntegerField(default=0)
    token_estimate = models.BigIntegerField(default=0)
    errors = models.JSONField(default=list, blank=True, help_text="First 20 line-numbered errors.")
    error_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    processed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["project", "-id"], name="file_project_recent")]

    def __str__(self) -> str:
        return f"{self.public_id} {self.filename}"
