"""Deployments: a succeeded job's adapter made callable by its ``fine_tuned_model`` name.

``deployment_create`` records the deployment (idempotent: one live deployment per job) and asks
a worker to place it; ``deployment_place`` loads it on an online server of the job's base
model, preferring the least loaded, and when that server holds its ``max_adapters`` it first
unloads the least recently used adapter there (which stays deployed: it is loaded again when
next placed). The server fetches the bundle through a signed URL and checks it against the
sha256 the deployment recorded before loading it. ``deployment_delete`` is OpenAI's delete of a
fine-tuned model: unloaded, no longer callable; the job and its adapter stay.

Placement holds the chosen server's row lock while it calls the server, so two placements
never count the same free slot.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from jobs import storage
from jobs.errors import Conflict
from jobs.models import Deployment, InferenceServer, TrainingJob
from jobs.result_files import adapter_of
from jobs.services.accounts.audit import SYSTEM, Actor, AuditObject, audit_record, created, deleted
from jobs.services.outbox import messages
from jobs.services.serving.servers import (
    LoadRefused,
    ServerUnavailable,
    server_load,
    server_mark_offline,
    server_unload,
)
from jobs.states import JobStatus

# The signed URL a server fetches the bundle through: long enough for a slow download.
FETCH_URL_SECONDS = 3600
LIVE = Q(undeployed_at__isnull=True)


def deployment_create(*, job: TrainingJob, actor: Actor = SYSTEM) -> tuple[Deployment, bool]:
    """Deploy ``job``'s adapter; returns (deployment, created). A job that has not succeeded
    is a 409; deploying again returns the live deployment."""
    adapter = adapter_of(job) if job.status == JobStatus.SUCCEEDED else None
    if adapter is None:
        raise Conflict(
            f"Job {job.public_id} is {job.status}: only a succeeded job's adapter can be deployed.",
            code="job_not_deployable",
        )
    with transaction.atomic():
        TrainingJob.objects.select_for_update().filter(pk=job.pk).values_list("pk").get()
        live = Deployment.objects.filter(LIVE, job=job).first()
        if live is not None:
            return live, False
        deployment = Deployment.objects.create(
            job=job, name=job.fine_tuned_model_name, sha256=adapter.sha256
        )
        audit_record(
            actor=actor,
            action="deployment.create",
            obj=_audited(deployment),
            changes=created({"name": deployment.name, "sha256": deployment.sha256}),
        )
        messages.send_place_deployment(deployment.pk)
    return deployment, True


def deployment_place(*, deployment_pk: int) -> Deployment | None:
    """Load the deployment on a server with room (the task ``place_deployment``)."""
    deployment = (
        Deployment.objects.select_related("job", "server").filter(LIVE, pk=deployment_pk).first()
    )
    if deployment is None or deployment.state == Deployment.State.LOADED:
        return deployment
    job = deployment.job
    adapter = adapter_of(job)
    if adapter is None or adapter.sha256 != deployment.sha256:
        return _settle(deployment, Deployment.State.FAILED, "the job's adapter is gone")
    candidates = (
        InferenceServer.objects.filter(status=InferenceServer.Status.ONLINE, base_model=job.model)
        .annotate(held=Count("loaded", filter=Q(loaded__state=Deployment.State.LOADED)))
        .order_by("held", "pk")
    )
    url = storage.transfer_url(adapter.storage_key, "GET", ttl_seconds=FETCH_URL_SECONDS)
    for server in candidates:
        try:
            with transaction.atomic():
                InferenceServer.objects.select_for_update().filter(pk=server.pk).get()
                _make_room(server)
                server_load(server, deployment.name, url, deployment.sha256)
                deployment.server, deployment.loaded_at = server, timezone.now()
                return _settle(deployment, Deployment.State.LOADED, f"loaded on {server.name}")
        except ServerUnavailable as exc:
            server_lost(server, str(exc))
        except LoadRefused as exc:
            return _settle(deployment, Deployment.State.FAILED, str(exc))
    return _settle(
        deployment,
        Deployment.State.PENDING,
        f"waiting for a server of {job.model} (none online has room or answers)",
    )


def _make_room(server: InferenceServer) -> None:
    """Unload the server's least recently used adapters until one more fits."""
    held = Deployment.objects.filter(server=server, state=Deployment.State.LOADED).order_by(
        F("last_used_at").asc(nulls_first=True), "loaded_at"
    )
    for victim in held[: max(0, held.count() - server.max_adapters + 1)]:
        server_unload(server, victim.name)
        victim.server = None
        _settle(victim, Deployment.State.PENDING, f"unloaded from {server.name} to make room")


def _settle(deployment: Deployment, state: str, detail: str) -> Deployment:
    deployment.state, deployment.detail = state, detail[:500]
    deployment.save(update_fields=["state", "detail", "server", "loaded_at"])
    return deployment


def deployments_waiting(base_model: str) -> list[int]:
    """Live deployments of ``base_model`` not loaded anywhere (a server of it came online)."""
    return list(
        Deployment.objects.filter(LIVE, job__model=base_model)
        .exclude(state=Deployment.State.LOADED)
        .values_list("pk", flat=True)
    )


def server_lost(server: InferenceServer, reason: str) -> None:
    """``server`` is down (a call to it failed, its node went offline): it is not chosen until
    it is registered again, and what it held is placed elsewhere."""
    server_mark_offline(server, reason)
    deployments_orphaned(server)


def deployments_orphaned(server: InferenceServer) -> None:
    """``server`` lost its adapters (down, or restarted): they are loaded nowhere now, and are
    placed again."""
    held = list(Deployment.objects.filter(LIVE, server=server).values_list("pk", flat=True))
    Deployment.objects.filter(pk__in=held).update(
        server=None, state=Deployment.State.PENDING, detail=f"{server.name} went offline"
    )
    for pk in held:
        messages.send_place_deployment(pk)


def deployment_delete(*, deployment: Deployment, actor: Actor = SYSTEM) -> None:
    """Undeploy: unloaded from its server (best effort: a server that is down has lost it
    anyway), no longer callable; the job and its adapter stay."""
    if deployment.server is not None:
        try:
            server_unload(deployment.server, deployment.name)
        except ServerUnavailable as exc:
            server_lost(deployment.server, str(exc))
    with transaction.atomic():
        Deployment.objects.filter(pk=deployment.pk).update(
            undeployed_at=timezone.now(), server=None, state=Deployment.State.PENDING
        )
        audit_record(
            actor=actor,
            action="deployment.delete",
            obj=_audited(deployment),
            changes=deleted({"name": deployment.name}),
        )


def _audited(deployment: Deployment) -> AuditObject:
    job = deployment.job
    return AuditObject("deployment", deployment.name, job.public_id, job.project)
