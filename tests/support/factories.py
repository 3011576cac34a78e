"""Rows for tests that need a row in a given state rather than the path that leads there.

A test about a service builds its inputs here and calls the service; a test about the path
itself (submit, dispatch, report) goes through the services (``make_job`` and friends in
tests/conftest.py). Defaults are a plausible queued job on the own fleet; pass what the test
is about.

    attempt = JobAttemptFactory(job__target="vastai", offer=offer_dict(price_per_hour=0.35))
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import factory
from django.contrib.auth import get_user_model
from factory.django import DjangoModelFactory

from jobs.models import (
    Artifact,
    GpuNode,
    JobAttempt,
    JobEvent,
    Project,
    ProjectMembership,
    StorageDeletion,
    TrainingFile,
    TrainingJob,
)
from jobs.states import JobStatus
from providers.base import Offer

# What job_create fills in for a request that names no adapter or hyperparameters
# (trainhub_contract.spec's defaults), so a factory job looks like a submitted one.
DEFAULT_ADAPTER: dict[str, Any] = {
    "type": "lora",
    "r": 16,
    "alpha": 32,
    "dropout": 0.05,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}
DEFAULT_HYPERPARAMETERS: dict[str, Any] = {
    "n_epochs": 3,
    "batch_size": 4,
    "learning_rate": 0.0002,
    "max_seq_length": 2048,
    "gradient_accumulation_steps": 1,
    "warmup_ratio": 0.03,
    "gradient_checkpointing": True,
}
H100 = {"name": "NVIDIA H100 80GB HBM3", "vram_mb": 81559}  # as nvidia-smi reports it


def offer_dict(**fields: Any) -> dict[str, Any]:
    """An attempt's ``offer`` as placement stores it (an Offer as a dict)."""
    defaults: dict[str, Any] = {
        "target": "fake-cloud",
        "offer_id": "o1",
        "gpu_name": "RTX 4090",
        "gpu_count": 1,
        "vram_gb": 24.0,
        "price_per_hour": 0.5,
    }
    return dataclasses.asdict(Offer(**{**defaults, **fields}))


class UserFactory(DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("pw-unused")


class ProjectFactory(DjangoModelFactory):
    """A project; ``owner=user`` makes the user its owner (a member sees everything in it)."""

    class Meta:
        model = Project
        skip_postgeneration_save = True  # the owner hook writes a membership, not the project

    name = factory.Sequence(lambda n: f"lab-{n}")
    slug = factory.LazyAttribute(lambda o: o.name)

    @factory.post_generation
    def owner(self, create: bool, extracted: Any, **kwargs: Any) -> None:
        if create and extracted is not None:
            ProjectMembershipFactory(project=self, user=extracted, **kwargs)


class ProjectMembershipFactory(DjangoModelFactory):
    class Meta:
        model = ProjectMembership

    project = factory.SubFactory(ProjectFactory)
    user = factory.SubFactory(UserFactory)
    role = ProjectMembership.Role.OWNER


class TrainingFileFactory(DjangoModelFactory):
    """A validated file's row (no stored object: jobs built on it are never run)."""

    class Meta:
        model = TrainingFile

    project = factory.SubFactory(ProjectFactory)
    filename = "data.jsonl"
    storage_key = factory.LazyAttribute(lambda o: f"projects/{o.project.pk}/files/{o.filename}")
    status = TrainingFile.Status.PROCESSED
    format = "chat"
    example_count = 10
    bytes = 1000


class TrainingJobFactory(DjangoModelFactory):
    class Meta:
        model = TrainingJob

    project = factory.SubFactory(ProjectFactory)
    training_file = factory.SubFactory(
        TrainingFileFactory, project=factory.SelfAttribute("..project")
    )
    model = "acme/tiny-llama"
    adapter = factory.LazyFunction(lambda: dict(DEFAULT_ADAPTER))
    hyperparameters = factory.LazyFunction(lambda: dict(DEFAULT_HYPERPARAMETERS))
    target = "local"
    max_runtime_seconds = 3600
    status = JobStatus.QUEUED


class JobAttemptFactory(DjangoModelFactory):
    """The job's next attempt (live unless ``ended_at`` is given), on the job's target."""

    class Meta:
        model = JobAttempt

    job = factory.SubFactory(TrainingJobFactory)
    number = factory.LazyAttribute(
        lambda o: JobAttempt.objects.filter(job=o.job).count() + 1 if o.job.pk else 1
    )
    target = factory.LazyAttribute(lambda o: o.job.target)


class JobEventFactory(DjangoModelFactory):
    class Meta:
        model = JobEvent

    job = factory.SubFactory(TrainingJobFactory)
    seq = factory.Sequence(lambda n: n)
    number = factory.Sequence(lambda n: n + 1)
    type = "log"
    message = "a log line"


class ArtifactFactory(DjangoModelFactory):
    class Meta:
        model = Artifact

    job = factory.SubFactory(TrainingJobFactory)
    kind = Artifact.Kind.ADAPTER
    filename = factory.LazyAttribute(lambda o: f"{o.job.public_id}.tar")
    storage_key = factory.LazyAttribute(
        lambda o: f"projects/{o.job.project_id}/jobs/{o.job.public_id}/{o.filename}"
    )
    size = 10
    sha256 = "0" * 64


class GpuNodeFactory(DjangoModelFactory):
    """An own-fleet node's row with one H100; its token is ``thn-<name>``."""

    class Meta:
        model = GpuNode

    name = factory.Sequence(lambda n: f"gpu-{n}")
    token_sha256 = factory.LazyAttribute(
        lambda o: hashlib.sha256(f"thn-{o.name}".encode()).hexdigest()
    )
    capabilities = factory.LazyFunction(lambda: {"gpu_count": 1, "gpus": [dict(H100)]})


class StorageDeletionFactory(DjangoModelFactory):
    class Meta:
        model = StorageDeletion

    key = factory.Sequence(lambda n: f"projects/1/jobs/ftjob-gone-{n}/")
    reason = "job deleted"
