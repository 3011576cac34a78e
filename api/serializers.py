"""The API's request and response bodies as OpenAPI components (drf-spectacular reads these).

They describe; they do not validate: every body is validated once, by the service that takes it
(``services.jobs._parse_job``, ``trainhub_contract.spec``), so the rules live in one place and the
error messages name OpenAI's fields. Keep a serializer in step with its presenter
(``api.presenters``); tests/jobs/test_api_schema.py checks real responses against this
schema, and schemathesis fuzzes it.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema_field
from rest_framework import serializers as s

from gpu_worker.agent.model_cache import MAX_MODELS, MAX_NAME
from jobs.models.webhooks import EVENT_TYPES as WEBHOOK_EVENT_TYPES
from jobs.states import JobCapacity, JobStatus
from providers.registry import CREDENTIAL_KINDS
from trainhub_contract.spec_schema import ADAPTER_SCHEMA, HYPERPARAMETERS_SCHEMA

_OBJECT = {"type": "object", "additionalProperties": True}
# Each serializer here describes a JSON object: the dict a presenter builds, or a request body.
Body = s.Serializer[dict[str, Any]]


def _auto_or(**schema: Any) -> dict[str, Any]:
    return {"oneOf": [{"const": "auto"}, schema]}


def _enum(choices: list[str], **kwargs: Any) -> s.CharField:
    """A string from ``choices``, its enum written inline (named enum components would collide:
    many objects have an ``object`` or a ``type`` field of their own)."""
    field: type[s.CharField] = type("Enum", (s.CharField,), {})
    return extend_schema_field({"type": "string", "enum": list(choices)})(field)(**kwargs)


# --- errors and lists -------------------------------------------------------------------------


class ErrorDetail(Body):
    message = s.CharField(help_text="What was wrong and what to do about it.")
    type = _enum(
        [
            "invalid_request_error",
            "authentication_error",
            "permission_error",
            "not_found_error",
            "rate_limit_error",
            "server_error",
        ]
    )
    param = s.CharField(allow_null=True, help_text="The field at fault (dotted path), if any.")
    code = s.CharField(allow_null=True, help_text="A stable machine-readable code.")


class Error(Body):
    error = ErrorDetail()


class Deleted(Body):
    id = s.CharField()
    object = s.CharField()
    deleted = s.BooleanField()


def page_of(item: type[Body], name: str) -> type[Body]:
    """``{"object": "list", "data": [...], "has_more": bool}`` of ``item``."""
    return type(
        name,
        (s.Serializer,),
        {
            "object": _enum(["list"]),
            "data": item(many=True),
            "has_more": s.BooleanField(),
        },
    )


# --- files ------------------------------------------------------------------------------------


@extend_schema_field({"type": "string", "minLength": 1, "contentMediaType": "application/jsonl"})
class DatasetPart(s.JSONField):
    pass


class FileUpload(Body):
    file = DatasetPart(
        help_text="JSONL (chat messages, alpaca, prompt/completion or text): a file part, or "
        "the text itself"
    )
    purpose = _enum(["fine-tune"], required=False, default="fine-tune")


class File(Body):
    id = s.CharField(help_text="file-… (uploads), file-metrics-… / file-adapter-… (results)")
    object = _enum(["file"])
    bytes = s.IntegerField(allow_null=True)
    created_at = s.IntegerField(allow_null=True, help_text="Unix seconds")
    filename = s.CharField()
    purpose = _enum(["fine-tune", "fine-tune-results"])
    status = _enum(["uploaded", "processed", "error"])
    sha256 = s.CharField(allow_null=True)
    format = s.CharField(allow_null=True, required=False)
    example_count = s.IntegerField(allow_null=True, required=False)
    token_estimate = s.IntegerField(allow_null=True, required=False)
    error_count = s.IntegerField(required=False)
    errors = s.ListField(child=s.DictField(), required=False, help_text="line-numbered")  # type: ignore[assignment]  # a field, as the body names it
    job_id = s.CharField(required=False, help_text="result files: the job they came from")


FileList = page_of(File, "FileList")


# --- jobs -------------------------------------------------------------------------------------


def _json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A gpu_worker JSON Schema (2020-12, as OpenAPI 3.1 takes it) without its $schema."""
    return {k: v for k, v in schema.items() if k != "$schema"}


_HYPER = HYPERPARAMETERS_SCHEMA["properties"]


@extend_schema_field(
    {
        **_json_schema(HYPERPARAMETERS_SCHEMA),
        "description": "OpenAI's three (each may be \"auto\": the default) and trainhub's own.",
        "properties": {
            **_HYPER,
            "n_epochs": _auto_or(**_HYPER["n_epochs"]),
            "batch_size": _auto_or(**_HYPER["batch_size"]),
            "learning_rate_multiplier": _auto_or(type="number", exclusiveMinimum=0, maximum=10),
        },
    }
)
class HyperparametersIn(s.JSONField):
    pass


class Hyperparameters(Body):
    """As resolved for the job ("auto" replaced by the value used)."""

    n_epochs = s.IntegerField()
    batch_size = s.IntegerField()
    learning_rate_multiplier = s.FloatField(allow_null=True)
    learning_rate = s.FloatField()
    max_seq_length = s.IntegerField()
    gradient_accumulation_steps = s.IntegerField()
    warmup_ratio = s.FloatField()
    gradient_checkpointing = s.BooleanField()
    packing = s.BooleanField(required=False, help_text="absent on jobs created before it existed")
    eval_interval = s.IntegerField(
        required=False, help_text="0: auto; absent on jobs created before it existed"
    )
    beta = s.FloatField(required=False, help_text="dpo jobs only")


class SupervisedIn(Body):
    hyperparameters = HyperparametersIn(required=False)


class MethodIn(Body):
    type = _enum(["supervised", "dpo"], help_text="reinforcement: not available (400)")
    supervised = SupervisedIn(required=False)
    dpo = SupervisedIn(required=False, help_text="hyperparameters, with beta (auto: 0.1)")


class Supervised(Body):
    hyperparameters = Hyperparameters()


class Method(Body):
    type = _enum(["supervised", "dpo"])
    supervised = Supervised(required=False)
    dpo = Supervised(required=False)


class Parent(Body):
    fine_tuned_model = s.CharField(help_text="the ft: name the job was created with")
    job_id = s.CharField(allow_null=True, help_text="null once that job is deleted")
    step_number = s.IntegerField(allow_null=True, help_text="a checkpoint's; null: final adapter")
    sha256 = s.CharField(help_text="of the adapter bytes the job continues")


@extend_schema_field(_json_schema(ADAPTER_SCHEMA))
class Adapter(s.JSONField):
    pass


GPU_NAME = {"type": "string", "pattern": "^[ -~]{1,100}$", "description": "glob, e.g. *A100*"}


@extend_schema_field(
    {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "count": {"type": "integer", "minimum": 0, "maximum": 64},
            "min_vram_gb": {"type": "number", "exclusiveMinimum": 0, "maximum": 4096},
            "name": GPU_NAME,
        },
    }
)
class GpuNeeds(s.JSONField):
    pass


@extend_schema_field({"type": "object", "additionalProperties": {"type": "string"}})
class StringMap(s.JSONField):
    pass


@extend_schema_field(
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["file", "grader"],
        "properties": {
            "file": {"type": "string", "description": "file-… in the eval format"},
            "grader": {"type": "object", "description": "string_check or text_similarity"},
            "max_tokens": {"type": "integer", "minimum": 1, "maximum": 1024},
        },
    }
)
class EvalsIn(s.JSONField):
    pass


class JobCreate(Body):
    model = s.CharField(
        help_text="Hub id (owner/name), an absolute path the operator allows, or a "
        "fine_tuned_model / fine_tuned_model_checkpoint of this project (trains on from it)."
    )
    training_file = s.CharField(help_text="file-… of this project, purpose fine-tune")
    validation_file = s.CharField(required=False, allow_null=True)
    method = MethodIn(required=False)
    hyperparameters = HyperparametersIn(required=False, help_text="legacy place; or method")
    suffix = s.CharField(required=False, allow_null=True, max_length=64)
    seed = s.IntegerField(required=False, allow_null=True, min_value=0, max_value=2**31 - 1)
    metadata = StringMap(required=False, allow_null=True, help_text="≤16 pairs")
    integrations = s.ListField(child=s.DictField(), required=False, allow_null=True,
                               help_text="must be empty: not supported")  # fmt: skip
    # trainhub's own settings: the SDK sends them with extra_body
    adapter = Adapter(required=False)
    target = s.CharField(required=False, help_text="local, auto, or a provider (GET /providers/)")
    gpu = GpuNeeds(required=False)
    node_selector = StringMap(required=False, help_text="{label: glob}")
    max_price_per_hour = s.FloatField(required=False, allow_null=True, min_value=0,
                                      help_text="compared with the price paid (spot or on demand)")  # fmt: skip
    capacity = s.ChoiceField(
        choices=[c.value for c in JobCapacity],
        required=False,
        allow_null=True,
        help_text="rented machines: on_demand (default), spot (interruptible), any (the cheaper)",
    )
    max_preemptions = s.IntegerField(required=False, allow_null=True, min_value=0, max_value=100,
                                     help_text="preemptions not counted against max_attempts")  # fmt: skip
    max_runtime_seconds = s.IntegerField(required=False, min_value=60, max_value=604800)
    max_attempts = s.IntegerField(required=False, min_value=1, max_value=10)
    priority = s.IntegerField(required=False, min_value=-100, max_value=100)
    evals = EvalsIn(required=False, help_text="graded checkpoints: items, grader, max_tokens")
    checkpoint_selection = _enum(
        ["last", "best_valid_loss", "best_eval"],
        required=False,
        help_text="which checkpoint becomes the adapter (default last)",
    )


class JobError(Body):
    code = s.CharField()
    message = s.CharField()
    param = s.CharField(allow_null=True)


@extend_schema_field(_OBJECT)
class AnyObject(s.JSONField):
    pass


class Job(Body):
    id = s.CharField(help_text="ftjob-…")
    object = _enum(["fine_tuning.job"])
    model = s.CharField(help_text="as requested: a base model or an ft: name")
    base_model = s.CharField(help_text="the base model trained (the parent's, for an ft: model)")
    parent = Parent(allow_null=True, help_text="the fine-tuned model this job continues")
    created_at = s.IntegerField()
    started_at = s.IntegerField(allow_null=True)
    finished_at = s.IntegerField(allow_null=True)
    estimated_finish = s.IntegerField(allow_null=True)
    fine_tuned_model = s.CharField(allow_null=True, help_text="ft:<base>:<project>:<suffix>:<id>")
    organization_id = s.CharField(help_text="the project")
    status = _enum(
        [str(v) for v in JobStatus],
        help_text="OpenAI's, plus provisioning, finalizing, cancelling and paused",
    )
    training_file = s.CharField()
    validation_file = s.CharField(allow_null=True)
    result_files = s.ListField(child=s.CharField())
    method = Method()
    hyperparameters = Hyperparameters()
    adapter = AnyObject()
    evals = AnyObject(allow_null=True, help_text="{file, grader, max_tokens}")
    checkpoint_selection = _enum(["last", "best_valid_loss", "best_eval"])
    seed = s.IntegerField()
    suffix = s.CharField(allow_null=True)
    user_provided_suffix = s.CharField(allow_null=True)
    metadata = StringMap(allow_null=True)
    integrations = s.ListField(child=s.DictField())
    target = s.CharField()
    priority = s.IntegerField()
    max_runtime_seconds = s.IntegerField()
    max_attempts = s.IntegerField()
    gpu = AnyObject()
    node_selector = StringMap()
    max_price_per_hour = s.FloatField(allow_null=True)
    capacity = _enum([c.value for c in JobCapacity])
    max_preemptions = s.IntegerField()
    preemptions = s.IntegerField(help_text="preemptions not counted against max_attempts so far")
    estimated_cost = s.FloatField(allow_null=True)
    cost = s.FloatField(allow_null=True, help_text="every attempt's machine time, as paid")
    on_demand_cost = s.FloatField(
        allow_null=True, help_text="the same machine time at on-demand rates (= cost unless spot)"
    )
    waiting_reason = s.CharField(allow_null=True)
    trained_tokens = s.IntegerField(allow_null=True)
    metrics = AnyObject(allow_null=True)
    error = JobError(allow_null=True)


JobList = page_of(Job, "JobList")


class Event(Body):
    id = s.CharField(help_text="ftevent-…")
    object = _enum(["fine_tuning.job.event"])
    created_at = s.IntegerField()
    level = _enum(["debug", "info", "warning", "error"])
    type = s.CharField(help_text="OpenAI's paths: metrics | message; native: trainhub's kind")
    kind = s.CharField(
        required=False, help_text="status, log, metrics, checkpoint, artifact, error, notification…"
    )
    message = s.CharField(allow_blank=True)
    data = AnyObject()  # type: ignore[assignment]  # a field, as the body names it
    attempt = s.IntegerField()


EventList = page_of(Event, "EventList")


class CheckpointMetrics(Body):
    """OpenAI's checkpoint metrics (validation ones null without a validation file; the
    full_valid ones only on a checkpoint of the last step), then trainhub's own."""

    step = s.IntegerField(allow_null=True)
    train_loss = s.FloatField(allow_null=True)
    train_mean_token_accuracy = s.FloatField(allow_null=True)
    valid_loss = s.FloatField(allow_null=True)
    valid_mean_token_accuracy = s.FloatField(allow_null=True)
    full_valid_loss = s.FloatField(allow_null=True)
    full_valid_mean_token_accuracy = s.FloatField(allow_null=True)
    learning_rate = s.FloatField(allow_null=True)
    epoch = s.FloatField(allow_null=True)
    eval_score = s.FloatField(allow_null=True, help_text="the job's grader on its evals")


class Checkpoint(Body):
    id = s.CharField(help_text="ftckpt-…")
    object = _enum(["fine_tuning.job.checkpoint"])
    created_at = s.IntegerField()
    fine_tuning_job_id = s.CharField()
    fine_tuned_model_checkpoint = s.CharField()
    step_number = s.IntegerField(allow_null=True)
    attempt = s.IntegerField()
    metrics = CheckpointMetrics()
    bytes = s.IntegerField(allow_null=True)
    sha256 = s.CharField(allow_null=True)


CheckpointList = page_of(Checkpoint, "CheckpointList")


class Artifact(Body):
    id = s.CharField()
    object = _enum(["fine_tuning.job.artifact"])
    job_id = s.CharField()
    kind = _enum(["adapter", "checkpoint", "logs", "merged"],
                 help_text="merged: an export, the adapter merged into its base")  # fmt: skip
    filename = s.CharField()
    bytes = s.IntegerField()
    sha256 = s.CharField()
    verified = s.BooleanField()
    created_at = s.IntegerField()


ArtifactList = page_of(Artifact, "ArtifactList")


class ExportCreate(Body):
    format = _enum(["merged_safetensors"], help_text="the adapter merged into its base model")


class Export(Body):
    id = s.CharField(help_text="ftexport-…")
    object = _enum(["fine_tuning.job.export"])
    job_id = s.CharField()
    format = _enum(["merged_safetensors"])
    status = _enum(["queued", "running", "succeeded", "failed"])
    error = s.CharField(allow_null=True, help_text="failed: why")
    adapter_sha256 = s.CharField(help_text="of the adapter bundle merged")
    artifact = Artifact(allow_null=True, help_text="succeeded: the merged model's bundle")
    created_at = s.IntegerField()
    finished_at = s.IntegerField(allow_null=True)


ExportList = page_of(Export, "ExportList")


# --- credentials, providers, offers -----------------------------------------------------------


_SECRET = {"type": "string", "pattern": "^[!-~]{1,1024}$"}  # printable ASCII, no space


def _credential_create(kind: str, fields: tuple[str, ...]) -> type[Body]:
    """The create body of one credential kind: its provider and exactly its secret fields."""
    secrets = {"type": "object", "properties": dict.fromkeys(fields, _SECRET),
               "required": list(fields), "additionalProperties": False}  # fmt: skip
    field = extend_schema_field(secrets)(type("Secrets", (s.JSONField,), {}))
    return type(
        f"{kind.title()}CredentialCreate",
        (s.Serializer,),
        {
            "provider": _enum([kind]),
            "name": s.CharField(required=False, min_length=1, max_length=100),
            "secrets": field(help_text="write-only: stored encrypted, never returned"),
        },
    )


# One body per kind, told apart by ``provider``: a schema-valid body names its kind's fields.
CREDENTIAL_CREATES: dict[str, Body | type[Body]] = {
    kind: _credential_create(kind, fields) for kind, fields in CREDENTIAL_KINDS.items()
}
CredentialCreate = PolymorphicProxySerializer(
    component_name="CredentialCreate",
    serializers=CREDENTIAL_CREATES,
    resource_type_field_name="provider",
)


class Credential(Body):
    id = s.IntegerField()
    object = _enum(["provider_credential"])
    provider = s.CharField()
    name = s.CharField()
    secret_fields = s.ListField(child=s.CharField())
    created_at = s.IntegerField()
    updated_at = s.IntegerField()


CredentialList = page_of(Credential, "CredentialList")


class Provider(Body):
    id = s.CharField()
    object = _enum(["provider"])
    description = s.CharField()
    credential_kind = s.CharField(allow_null=True)
    has_offers = s.BooleanField()
    usable = s.BooleanField()
    problem = s.CharField(allow_null=True)
    credential = AnyObject(allow_null=True)


ProviderList = page_of(Provider, "ProviderList")


class Offer(Body):
    object = _enum(["offer"])
    target = s.CharField()
    offer_id = s.CharField()
    gpu_name = s.CharField()
    gpu_count = s.IntegerField()
    vram_gb = s.FloatField()
    price_per_hour = s.FloatField()
    spot_price_per_hour = s.FloatField(allow_null=True)
    available = s.BooleanField()
    region = s.CharField(allow_blank=True)
    machine_id = s.CharField(allow_blank=True)
    details = AnyObject()


OfferList = page_of(Offer, "OfferList")


# --- nodes (operators and the nodes themselves) -----------------------------------------------


class Node(Body):
    id = s.CharField()
    object = _enum(["gpu_node"])
    status = s.CharField()
    draining = s.BooleanField()
    ephemeral = s.BooleanField()
    labels = StringMap()
    capabilities = AnyObject()
    cached_models = s.ListField(
        child=s.CharField(), help_text="base models the node reported complete on disk"
    )
    models_reported_at = s.IntegerField(allow_null=True, help_text="when it reported them")
    current_job = s.CharField(allow_null=True)
    current_attempt = s.IntegerField(allow_null=True)
    last_heartbeat_at = s.IntegerField(allow_null=True)
    registered_at = s.IntegerField(allow_null=True)
    created_at = s.IntegerField()


NodeList = page_of(Node, "NodeList")


class NodeCreate(Body):
    name = s.RegexField(
        r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$", max_length=100, help_text="its queue's name too"
    )


class NodeCreated(Node):
    token = s.CharField(help_text="shown once")


class NodeChanged(Node):
    token = s.CharField(required=False, help_text="rotate-token only: the new token, shown once")


class NodeEvent(Body):
    object = _enum(["gpu_node.event"])
    node = s.CharField()
    kind = s.CharField()
    message = s.CharField()
    actor = s.CharField(allow_null=True)
    created_at = s.IntegerField()


NodeEventList = page_of(NodeEvent, "NodeEventList")


class AttemptRef(Body):
    job_id = s.CharField()
    attempt = s.IntegerField(min_value=1)


class NodeClaim(AttemptRef):
    pass


class NodeClaimed(Body):
    spec = AnyObject(help_text="the executor's job spec (trainhub_contract/spec.py)")
    report_token = s.CharField(help_text="speaks for this attempt's events only")


class NodeHeartbeat(Body):
    registration = AnyObject(required=False, help_text="GPUs, labels, backend (node.py)")
    running = s.ListField(child=s.JSONField(), required=False, min_length=2, max_length=2,
                          help_text="[job_id, attempt] the node runs")  # fmt: skip
    stopping = s.BooleanField(required=False, help_text="true: a clean shutdown")
    models = s.ListField(
        child=s.CharField(max_length=MAX_NAME),
        required=False,
        max_length=MAX_MODELS,
        help_text="the base models cached on the node: hub ids 'owner/name' and absolute "
        "paths (gpu_worker/agent/model_cache.py)",
    )
    server = AnyObject(
        required=False,
        help_text="a serving node's inference server: {base_model, url, loader_url, api_key, "
        "max_adapters, instance}, or {down: reason} (jobs/services/serving/node_servers.py)",
    )


class StopRequest(AttemptRef):
    mode = _enum(["cancel", "pause"], required=False, help_text="pause: checkpoint first")


class NodeHeartbeatAnswer(Body):
    cancel = StopRequest(many=True)


class NodeEvents(Body):
    events = s.ListField(child=s.DictField(), help_text="the executor's events (seq, type…)")


class NodeEventsStored(Body):
    stored = s.IntegerField()


class WebhookReceived(Body):
    received = s.BooleanField()


# --- outbound webhooks (api/webhook_endpoint_views.py) ------------------------------------


@extend_schema_field(
    {
        "type": "array",
        "items": {"type": "string", "enum": list(WEBHOOK_EVENT_TYPES)},
        "minItems": 1,
        "description": "a type named twice counts once",
    }
)
class WebhookEventTypes(s.JSONField):
    pass


class WebhookEndpointCreate(Body):
    url = s.URLField(
        max_length=2048,
        help_text="https:// (http only where the operator allows it); a public address unless "
        "the operator allows the network; redirects are not followed",
    )
    event_types = WebhookEventTypes()
    description = s.CharField(required=False, allow_blank=True, max_length=200)
    enabled = s.BooleanField(required=False, default=True)


class WebhookEndpointUpdate(Body):
    url = s.URLField(required=False, max_length=2048)
    event_types = WebhookEventTypes(required=False)
    description = s.CharField(required=False, allow_blank=True, max_length=200)
    enabled = s.BooleanField(required=False, help_text="true also clears an auto-disable")


class WebhookEndpoint(Body):
    id = s.CharField(help_text="whep-…")
    object = _enum(["webhook_endpoint"])
    url = s.CharField()
    description = s.CharField(allow_blank=True)
    event_types = s.ListField(child=_enum(list(WEBHOOK_EVENT_TYPES)))
    enabled = s.BooleanField()
    disabled_reason = s.CharField(allow_null=True, help_text="why it is disabled, if it is")
    failing_since = s.IntegerField(
        allow_null=True, help_text="start of the current run of failed tries (Unix seconds)"
    )
    previous_secret_expires_at = s.IntegerField(
        allow_null=True, help_text="after a rotation: until when the old secret also signs"
    )
    created_at = s.IntegerField()
    updated_at = s.IntegerField()


WebhookEndpointList = page_of(WebhookEndpoint, "WebhookEndpointList")


class WebhookEndpointWithSecret(WebhookEndpoint):
    secret = s.CharField(help_text="whsec_…: the Standard Webhooks signing secret, shown this once")


class WebhookAttemptOut(Body):
    number = s.IntegerField()
    started_at = s.IntegerField()
    status_code = s.IntegerField(allow_null=True)
    latency_ms = s.IntegerField()
    response_excerpt = s.CharField(allow_blank=True, help_text="the first KiB of the answer")
    error = s.CharField(allow_null=True)


class WebhookDeliveryOut(Body):
    id = s.CharField(help_text="msg_…: the webhook-id header, the same on every try")
    object = _enum(["webhook_endpoint.delivery"])
    endpoint_id = s.CharField()
    event_id = s.CharField(help_text="evt_…: the body's id")
    event_type = _enum(list(WEBHOOK_EVENT_TYPES))
    job_id = s.CharField()
    status = _enum(["pending", "succeeded", "failed"])
    created_at = s.IntegerField()
    delivered_at = s.IntegerField(allow_null=True)
    next_attempt_at = s.IntegerField(allow_null=True)
    last_status_code = s.IntegerField(allow_null=True)
    last_error = s.CharField(allow_null=True)
    payload = AnyObject(help_text="the body sent (OpenAI's webhook event shape)")
    attempts = WebhookAttemptOut(many=True)


WebhookDeliveryList = page_of(WebhookDeliveryOut, "WebhookDeliveryList")


# --- the audit trail (staff) ------------------------------------------------------------------


@extend_schema_field(
    {
        "type": "object",
        "additionalProperties": {
            "type": "object",
            "properties": {"from": {}, "to": {}},
            "required": ["from", "to"],
        },
    }
)
class AuditChanges(s.JSONField):
    pass


class AuditEntry(Body):
    id = s.CharField(help_text="audit-…")
    object = _enum(["audit_entry"])
    created_at = s.IntegerField()
    actor = s.CharField(help_text="username, manage.py command, or system")
    # Serializer's own `source` attribute is not this field (DRF collects declared fields).
    source = _enum(["api", "admin", "cli", "system"])  # type: ignore[assignment]
    api_key_prefix = s.CharField(allow_null=True, help_text="the key's public prefix (source api)")
    action = s.CharField(help_text="<object>.<verb>, e.g. job.cancel, api_key.revoke")
    object_type = s.CharField()
    object_id = s.CharField(help_text="public id, name or key prefix")
    object_repr = s.CharField(allow_blank=True)
    project = s.CharField(allow_null=True, help_text="the project's slug")
    changes = AuditChanges(help_text='{"field": {"from", "to"}}; secrets only as "set"/"rotated"')


AuditEntryList = page_of(AuditEntry, "AuditEntryList")


# --- inference (api/inference_views.py) ---------------------------------------------------------


class Model(Body):
    """OpenAI's model object: a deployed fine-tuned model, or a base model a server serves."""

    id = s.CharField(help_text="ft:… or a base model")
    object = _enum(["model"])
    created = s.IntegerField(allow_null=True)
    owned_by = s.CharField()
    fine_tuning_job = s.CharField(required=False, help_text="deployed models: the job")
    state = _enum(["pending", "loaded", "failed"], required=False,
                  help_text="pending: not loaded on a server yet (or unloaded to make room)")  # fmt: skip
    detail = s.CharField(required=False, allow_null=True)
    sha256 = s.CharField(required=False, help_text="of the adapter bundle served")


class CompletionRequest(Body):
    """OpenAI's chat or text completion request (its other fields pass through unchanged);
    answered by the stream process."""

    model = s.CharField(min_length=1, help_text="an ft: name, or a base model a server serves")
    messages = s.ListField(child=s.DictField(), required=False, help_text="chat completions")
    prompt = s.CharField(required=False, allow_blank=True, help_text="text completions")
    stream = s.BooleanField(required=False)


class ModelList(Body):
    object = _enum(["list"])
    data = Model(many=True)  # type: ignore[assignment]  # a field, as the body names it


class ModelDeleted(Body):
    id = s.CharField()
    object = _enum(["model"])
    deleted = s.BooleanField()
