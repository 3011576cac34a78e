from jobs.models.files import TrainingFile
from jobs.models.jobs import Artifact, IdempotencyKey, JobAttempt, JobEvent, TrainingJob
from jobs.models.nodes import GpuNode, NodeEvent
from jobs.models.projects import ApiKey, Project, ProjectMembership, ProviderCredential

__all__ = [
    "ApiKey",
    "Artifact",
    "GpuNode",
    "IdempotencyKey",
    "JobAttempt",
    "JobEvent",
    "NodeEvent",
    "Project",
    "ProjectMembership",
    "ProviderCredential",
    "TrainingFile",
    "TrainingJob",
]
