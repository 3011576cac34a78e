from django.db import models


class GpuNode(models.Model):
    """One of the operator's GPU machines, consuming its own Celery queue ``gpu.node.<name>``.

    ``status`` is derived, and written only by ``services.nodes``: offline without a recent
    heartbeat (or when retired), else draining when asked to, else busy while it holds an attempt, else idle.
    Only a SHA-256 of the node's token is kept.
    """

    class Status(models.TextChoices):
        IDLE = "idle"
        BUSY = "busy"
        DRAINING = "draining"
        OFFLINE = "offline"

    name = models.CharField(max_length=100, unique=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OFFLINE)
    draining = models.BooleanField(
        default=False, help_text="Finish the current job, take no new one."
    )
    ephemeral = models.BooleanField(
        default=False, help_text="Reported by the node: exits after one job."
    )
    retired = models.BooleanField(
        default=False,
        help_text="Offline until a new process registers: the node stopped cleanly, or an "
        "ephemeral node has had its job.",
    )
    token_sha256 = models.CharField(max_length=64)
    labels = models.JSONField(default=dict, blank=True)
    capabilities = models.JSONField(
        default=dict,
        blank=True,
        help_text="Reported by the node: gpu_count, gpus [{name, vram_mb}], cuda/driver, backend.",
    )
    cached_models = models.JSONField(
        default=list,
        blank=True,
        help_text="Reported by the node: base models it holds complete on disk (hub ids and "
        "local paths); placement prefers a node that has the job's model.",
    )
    models_reported_at = models.DateTimeField(
        null=True, blank=True, help_text="When the node last reported its cached models."
    )
    celery_hostname = models.CharField(max_length=255, blank=True)
    process = models.CharField(
        max_length=100, blank=True, help_text="The reporting worker process (host, pid, start)."
    )
    current_attempt = models.OneToOneField(
        "jobs.JobAttempt", null=True, blank=True, on_delete=models.SET_NULL, related_name="node"
    )
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    registered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class NodeEvent(models.Model):
    """Audit trail of a node: created, registered, drained, token rotated, deleted, offline."""

    node = models.ForeignKey(
        GpuNode, null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    node_name = models.CharField(max_length=100)
    kind = models.CharField(max_length=32)
    message = models.TextField()
    actor = models.CharField(max_length=150, blank=True, help_text="User, or empty for the node.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["node_name", "-id"], name="node_event_recent")]

    def __str__(self) -> str:
        return f"{self.node_name} {self.kind}"
