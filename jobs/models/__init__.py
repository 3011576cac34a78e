from jobs.models.audit import AuditEntry
from jobs.models.files import TrainingFile
from jobs.models.jobs import Artifact, Export, IdempotencyKey, JobAttempt, JobEvent, TrainingJob
from jobs.models.nodes import GpuNode, NodeEvent
from jobs.models.projects import ApiKey, Project, ProjectMembership, ProviderCredential
from jobs.models.serving import Deployment, InferenceCall, InferenceServer
from jobs.models.storage import StorageDeletion
from jobs.models.webhooks import WebhookAttempt, WebhookDelivery, WebhookEndpoint

__all__ = [
    "ApiKey",
    "Artifact",
    "AuditEntry",
    "Deployment",
    "Export",
    "GpuNode",
    "IdempotencyKey",
    "InferenceCall",
    "InferenceServer",
    "JobAttempt",
    "JobEvent",
    "NodeEvent",
    "Project",
    "ProjectMembership",
    "ProviderCredential",
    "StorageDeletion",
    "TrainingFile",
    "TrainingJob",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookEndpoint",
]
