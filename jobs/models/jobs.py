from django.conf import settings
from django.db import models

from jobs.models.ids import new_artifact_id, new_export_id, new_job_id
from jobs.states import EndReason, JobCapacity, JobStatus
from providers import registry
from providers.base import CapacityType


class TrainingJob(models.Model):
    """A fine-tuning request. Its status is written only by ``services.jobs.job_transition``."""

    public_id = models.CharField(max_length=40, unique=True, default=new_job_id, editable=False)
    project = models.ForeignKey("jobs.Project", on_delete=models.CASCADE, related_name="jobs")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    model = models.CharField(max_length=300)
    training_file = models.ForeignKey(
        "jobs.TrainingFile", on_delete=models.PROTECT, related_name="training_jobs"
    )
    validation_file = models.ForeignKey(
        "jobs.TrainingFile",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="validation_jobs",
    )
    method = models.CharField(
        max_length=16, default="supervised", help_text="supervised or dpo (spec.METHODS)"
    )
    # Lineage (jobs.services.core.lineage): the fine-tuned model this job continues, as the
    # client named it, and the exact bytes it resolved to when the job was created.
    parent_job = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    parent_model = models.CharField(max_length=500, blank=True, help_text="ft:… as requested")
    parent_step = models.PositiveIntegerField(
        null=True, blank=True, help_text="the parent checkpoint's step; empty: its final adapter"
    )
    parent_key = models.CharField(max_length=500, blank=True, editable=False)
    parent_sha256 = models.CharField(max_length=64, blank=True, editable=False)
    # Graded checkpoints (gpu_worker.grading): eval items, the grader, and which checkpoint
    # becomes the adapter.
    evals_file = models.ForeignKey(
        "jobs.TrainingFile",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="eval_jobs",
    )
    grader = models.JSONField(default=dict, blank=True, help_text="OpenAI's grader object")
    eval_max_tokens = models.PositiveIntegerField(default=64)
    checkpoint_selection = models.CharField(max_length=16, default="last")
    adapter = models.JSONField(help_text="spec.AdapterSpec as a dict, defaults filled in.")
    hyperparameters = models.JSONField(help_text="spec.Hyperparameters, defaults filled in.")
    seed = models.PositiveIntegerField(default=42)
    suffix = models.CharField(max_length=64, blank=True)
    target = models.CharField(max_length=32)
    max_runtime_seconds = models.PositiveIntegerField()
    max_attempts = models.PositiveSmallIntegerField(default=3)
    # Placement on the own fleet (jobs.gpu_needs): GPU needs and label selectors, any node if empty.
    gpu = models.JSONField(default=dict, blank=True, help_text="{count, min_vram_gb, name glob}")
    node_selector = models.JSONField(default=dict, blank=True, help_text="{label: glob}")
    max_price_per_hour = models.DecimalField(
        max_digits=10,
        decimal_places=4,
        null=True,
        blank=True,
        help_text="USD per hour a rented machine may cost at most (offers above are skipped).",
    )
    capacity = models.CharField(
        max_length=16,
        choices=[(c.value, c.value) for c in JobCapacity],
        default=JobCapacity.ON_DEMAND.value,
        help_text="Rented machines: on_demand, spot (interruptible), or any (the cheaper).",
    )
    # Preempted attempts forgiven (not counted against max_attempts) since the last manual retry,
    # up to max_preemptions; later preemptions count like any lost attempt.
    max_preemptions = models.PositiveSmallIntegerField(default=5)
    preemptions = models.PositiveSmallIntegerField(default=0)
    # Sums over the attempts (services.costs): the most the attempts could cost at their quoted
    # rates and max runtime, what ended attempts did cost (billed rate x time rented), and what
    # that machine time would have cost on demand (equal to cost without spot attempts).
    estimated_cost = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    cost = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    on_demand_cost = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    priority = models.SmallIntegerField(default=0, help_text="Higher is dispatched first.")
    waiting_reason = models.CharField(
        max_length=1000, blank=True, help_text="Why a queued job is not placed yet."
    )
    # Attempts numbered above this count against max_attempts; a manual retry moves it up.
    attempt_budget_start = models.PositiveSmallIntegerField(default=0)
    status = models.CharField(
        max_length=20,
        choices=[(s.value, s.value) for s in JobStatus],
        default=JobStatus.VALIDATING_FILES,
    )
    error_code = models.CharField(max_length=32, blank=True)
    error_message = models.TextField(blank=True)
    metadata = models.JSONField(
        default=dict,
        blank=True,
        help_text="Client key-value pairs (OpenAI metadata: up to 16 string keys ≤64 chars, "
        "string values ≤512 chars).",
    )
    trained_tokens = models.BigIntegerField(null=True, blank=True)
    latest_metrics = models.JSONField(default=dict, blank=True)
    event_counter = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # When the retention sweep last removed this job's checkpoint and unverified bundles; a
    # retry that finishes again (a later finished_at) makes it due again.
    storage_swept_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["project", "-id"], name="job_project_recent"),
            models.Index(fields=["project", "status", "-id"], name="job_project_status"),
            models.Index(fields=["project", "target", "-id"], name="job_project_target"),
            models.Index(fields=["status", "id"], name="job_status_queue"),
            models.Index(
                fields=["-priority", "id"],
                condition=models.Q(status="queued"),
                name="job_dispatch_order",
            ),
        ]

    def __str__(self) -> str:
        return self.public_id

    @property
    def is_terminal(self) -> bool:
        from jobs.states import TERMINAL

        return self.status in TERMINAL

    def attempts_counted(self, newest_attempt: int) -> int:
        """Attempts up to ``newest_attempt`` that count against ``max_attempts``: those
        numbered above ``attempt_budget_start`` (which a retry, a pause and a forgiven
        preemption move up)."""
        return max(0, newest_attempt - self.attempt_budget_start)

    @property
    def fine_tuned_model_name(self) -> str:
        """OpenAI's ``ft:<base>:<org>:<suffix>:<id>`` name of the job's adapter."""
        job_suffix = self.public_id.removeprefix("ftjob-")
        return f"ft:{self.model}:{self.project.slug}:{self.suffix}:{job_suffix}"


class JobAttempt(models.Model):
    """One try at running a job on one machine. The lease says it is still alive."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveSmallIntegerField()
    target = models.CharField(max_length=32)
    provider_instance_id = models.CharField(max_length=200, blank=True)
    provider_job_id = models.CharField(max_length=200, blank=True)
    node_name = models.CharField(max_length=200, blank=True)
    ssh_host = models.CharField(max_length=255, blank=True)
    ssh_port = models.PositiveIntegerField(null=True, blank=True)
    ssh_host_key = models.TextField(blank=True, help_text="Trusted on first use, then required.")
    # Encrypted (jobs.crypto); this attempt's own key pair, so no key outlives its machine.
    ssh_private_key_ciphertext = models.TextField(blank=True, editable=False)
    events_offset = models.BigIntegerField(
        default=0, help_text="Bytes of the remote events file already read (SSH executors)."
    )
    next_poll_at = models.DateTimeField(null=True, blank=True)
    polled_at = models.DateTimeField(null=True, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    # Set by a pause: the attempt stops after saving a checkpoint (its stop request says
    # "pause"); an SSH-driven machine gets services.stopping.PAUSE_GRACE_SECONDS to do so.
    pause_requested_at = models.DateTimeField(null=True, blank=True)
    launch_unconfirmed_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="A launch call failed after it may have reached the provider.",
    )
    # The priced offer placement chose ({target, offer_id, gpu_name, gpu_count, vram_gb,
    # price_per_hour, spot_price_per_hour, region, machine_id}); empty for targets without a
    # price list.
    offer = models.JSONField(default=dict, blank=True)
    # How the machine is rented ('' for the own fleet): spot bills the offer's spot price.
    capacity = models.CharField(
        max_length=16, blank=True, choices=[(c.value, c.value) for c in CapacityType]
    )
    on_demand_rate_per_hour = models.DecimalField(
        max_digits=10,
        decimal_places=4,
        null=True,
        blank=True,
        help_text="The offer's on-demand USD per hour (what a spot machine saves against).",
    )
    launched_at = models.DateTimeField(
        null=True, blank=True, help_text="When the provider accepted the launch (billing starts)."
    )
    estimated_cost = models.DecimalField(
        max_digits=12,
        decimal_places=4,
        null=True,
        blank=True,
        help_text="The offer's rate x the job's max runtime: the most this attempt should cost.",
    )
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # The stall watchdog's view (core.attempts.attempts_end_stalled): heartbeats keep the lease,
    # these say whether the run moves.
    progress_at = models.DateTimeField(
        null=True, blank=True, help_text="The executor's last event other than a heartbeat."
    )
    progress_step = models.PositiveIntegerField(
        null=True, blank=True, help_text="The last training step it reported."
    )
    step_at = models.DateTimeField(null=True, blank=True, help_text="When that step came.")
    step_seconds = models.FloatField(
        null=True, blank=True, help_text="The slowest training step seen (seconds a step)."
    )
    claimed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(
        max_length=32, blank=True, choices=[(r.value, r.value) for r in EndReason]
    )
    billed_rate_per_hour = models.DecimalField(
        max_digits=10,
        decimal_places=4,
        null=True,
        blank=True,
        help_text="USD per hour as the provider reports it after launch.",
    )
    cost = models.DecimalField(
        max_digits=12,
        decimal_places=4,
        null=True,
        blank=True,
        help_text="Billed (else quoted) rate x time from launch to end.",
    )
    on_demand_cost = models.DecimalField(
        max_digits=12,
        decimal_places=4,
        null=True,
        blank=True,
        help_text="The same machine time at the on-demand rate (= cost unless spot).",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="uniq_attempt_number"),
            # At most one live attempt per job: the guard against double-launching GPUs.
            models.UniqueConstraint(
                fields=["job"], condition=models.Q(ended_at__isnull=True), name="one_live_attempt"
            ),
        ]
        indexes = [
            models.Index(
                fields=["lease_expires_at"],
                condition=models.Q(ended_at__isnull=True),
                name="attempt_live_lease",
            ),
            models.Index(
                fields=["target", "next_poll_at"],
                condition=models.Q(ended_at__isnull=True),
                name="attempt_live_poll",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job.public_id}#a{self.number}"

    @property
    def on_own_fleet(self) -> bool:
        """Run by one of the operator's GPU nodes (not rented from a provider)."""
        return registry.is_own_fleet(self.target)


class JobEvent(models.Model):
    """Append-only. ``(job, attempt, seq)`` makes re-sent executor events harmless;
    ``number`` is the public, gap-free per-job order. Control-plane events use attempt 0."""

    class Level(models.TextChoices):
        DEBUG = "debug"
        INFO = "info"
        WARNING = "warning"
        ERROR = "error"

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="events")
    attempt = models.PositiveSmallIntegerField(default=0)
    seq = models.PositiveIntegerField()
    number = models.PositiveIntegerField()
    type = models.CharField(max_length=20)
    level = models.CharField(max_length=10, choices=Level.choices, default=Level.INFO)
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt", "seq"], name="uniq_event_seq"),
            models.UniqueConstraint(fields=["job", "number"], name="uniq_event_number"),
        ]

    def __str__(self) -> str:
        return f"{self.job_id}:{self.number} {self.type}"


class Artifact(models.Model):
    class Kind(models.TextChoices):
        ADAPTER = "adapter"
        CHECKPOINT = "checkpoint"
        LOGS = "logs"
        MERGED = "merged"  # an export: the adapter merged into its base (jobs.models.Export)

    public_id = models.CharField(
        max_length=40, unique=True, default=new_artifact_id, editable=False
    )
    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="artifacts")
    attempt = models.ForeignKey(
        JobAttempt, null=True, on_delete=models.SET_NULL, related_name="artifacts"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    storage_key = models.CharField(max_length=500)
    filename = models.CharField(max_length=255)
    size = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    reported_sha256 = models.CharField(max_length=64, blank=True)
    verified = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.public_id


class Export(models.Model):
    """A job's adapter in another form, made by the ``run_export`` task: ``merged_safetensors``
    is the adapter merged into its base. Its result is a verified ``merged`` artifact."""

    class Format(models.TextChoices):
        MERGED_SAFETENSORS = "merged_safetensors"

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    public_id = models.CharField(max_length=40, unique=True, default=new_export_id, editable=False)
    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="exports")
    format = models.CharField(max_length=32, choices=Format.choices)
    adapter_sha256 = models.CharField(max_length=64, help_text="of the adapter bundle merged")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    error = models.CharField(max_length=1000, blank=True)
    artifact = models.OneToOneField(
        Artifact, null=True, blank=True, on_delete=models.SET_NULL, related_name="export"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.public_id


class IdempotencyKey(models.Model):
    """A client's ``Idempotency-Key``: a retried create returns the first job."""

    project = models.ForeignKey("jobs.Project", on_delete=models.CASCADE)
    key = models.CharField(max_length=255)
    request_sha256 = models.CharField(max_length=64)
    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "key"], name="uniq_idempotency_key")
        ]

    def __str__(self) -> str:
        return f"{self.key} -> job {self.job_id}"
