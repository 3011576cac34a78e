from django.db import models


class InferenceServer(models.Model):
    """A server answering vLLM's OpenAI-compatible API for one base model, loading adapters at
    run time: vLLM with ``--enable-lora`` or ``python -m gpu_worker serve``. Registered by an
    operator (``manage.py register_server``), or by a GPU node with the serving role (with its
    heartbeat: ``node`` is set, and the server lives and dies with the node). Its API key is
    encrypted at rest."""

    class Status(models.TextChoices):
        ONLINE = "online"
        OFFLINE = "offline"  # its last call failed: not chosen until an operator re-registers it

    name = models.CharField(max_length=100, unique=True)
    url = models.URLField(max_length=500, help_text="its base URL, without /v1")
    base_model = models.CharField(
        max_length=300, help_text="the model it serves, as jobs name their base model"
    )
    served_name = models.CharField(max_length=300, help_text="what the server calls its base")
    api_key_ciphertext = models.TextField(blank=True, editable=False)
    loader_url = models.URLField(
        max_length=500,
        blank=True,
        help_text="where adapters are loaded and unloaded, when not at url (a node's loader "
        "beside vLLM, which fetches and checks a bundle and hands vLLM its local path)",
    )
    node = models.ForeignKey(
        "jobs.GpuNode", null=True, blank=True, on_delete=models.CASCADE, related_name="servers"
    )
    # Which run of the server process: a new one has lost every adapter the last one held.
    instance = models.CharField(max_length=100, blank=True)
    max_adapters = models.PositiveSmallIntegerField(default=4)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ONLINE)
    status_detail = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    checked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.base_model})"


class Deployment(models.Model):
    """A succeeded job's adapter made callable by its ``fine_tuned_model`` name. ``server`` is
    where it is loaded now: None until placed, and again once the least recently used adapter
    made room for another there. ``undeployed_at`` ends it (OpenAI's delete of a fine-tuned
    model); the job stays."""

    class State(models.TextChoices):
        PENDING = "pending"  # not loaded anywhere yet (or unloaded to make room)
        LOADED = "loaded"
        FAILED = "failed"  # no server could load it: ``detail`` says why

    job = models.ForeignKey(
        "jobs.TrainingJob", on_delete=models.CASCADE, related_name="deployments"
    )
    name = models.CharField(max_length=500, help_text="the ft: name clients call")
    sha256 = models.CharField(max_length=64, help_text="of the adapter bundle it serves")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    detail = models.CharField(max_length=500, blank=True)
    server = models.ForeignKey(
        InferenceServer, null=True, blank=True, on_delete=models.SET_NULL, related_name="loaded"
    )
    loaded_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # Usage through trainhub's completions routes (api/live/inference.py), for the project.
    requests = models.PositiveIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    undeployed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job"],
                condition=models.Q(undeployed_at__isnull=True),
                name="one_live_deployment_per_job",
            )
        ]

    def __str__(self) -> str:
        return self.name


class InferenceCall(models.Model):
    """One completion through trainhub's relay (api/live/inference.py): a project's usage of a
    model, and the figures the admin shows per model. Pruned after
    ``TRAINHUB_INFERENCE_CALL_RETENTION_SECONDS``."""

    project = models.ForeignKey("jobs.Project", on_delete=models.CASCADE, related_name="+")
    model = models.CharField(max_length=500, help_text="as the caller named it")
    deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.SET_NULL, related_name="calls"
    )
    server = models.ForeignKey(
        InferenceServer, null=True, blank=True, on_delete=models.SET_NULL, related_name="calls"
    )
    streamed = models.BooleanField(default=False)
    status_code = models.PositiveSmallIntegerField(help_text="the server's answer; 0: cut off")
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    first_token_ms = models.PositiveIntegerField(null=True, blank=True, help_text="streamed")
    duration_ms = models.PositiveIntegerField()
    created_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.model} at {self.created_at:%Y-%m-%d %H:%M:%S}"
