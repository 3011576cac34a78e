from jobs.models.files import TrainingFile
from jobs.models.jobs import Artifact, IdempotencyKey, JobAttempt, JobEvent, TrainingJob
from jobs.models.projects import ApiKey, Project, ProjectMembership, ProviderCredential

__all__ = [
    "ApiKey",
    "Artifact",
    "IdempotencyKey",
    "JobAttempt",
    "JobEvent",
    "Project",
    "ProjectMembership",
    "ProviderCredential",
    "TrainingFile",
    "TrainingJob",
]
