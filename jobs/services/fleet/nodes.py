"""GPU nodes: identity (tokens), registration and heartbeats, drain, offline, delete.

A node's status is derived from four facts and written by :func:`node_settle` alone:
no heartbeat for ``TRAINHUB_NODE_OFFLINE_SECONDS`` (or retired: stopped cleanly, or an
ephemeral node after its job, until a new process registers) → offline; else draining when asked;
else busy while it holds an attempt; else idle. A node that turns idle triggers the
dispatcher. A node also reports the base models it has cached (``models``, validated by
:func:`parse_cached_models`; stored with when it came). Every operator action and every
registration leaves a :class:`NodeEvent`; operator
actions (create, token rotation, drain, undrain, delete) are also written to the audit trail
(services.audit) with their actor.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from gpu_worker.agent.model_cache import MAX_MODELS, MAX_NAME
from jobs.broker_acl import broker_user_delete, broker_user_set, broker_users_sync
from jobs.errors import Conflict, InvalidRequest, NotFound
from jobs.models import GpuNode, JobAttempt, NodeEvent
from jobs.services.accounts.audit import SYSTEM, Actor, audit_record, created, deleted, diff
from jobs.services.outbox import messages
from jobs.states import JobStatus
from trainhub_contract.outcomes import StopMode
from trainhub_contract.spec import SpecError, validate_model_name

log = logging.getLogger(__name__)
N = GpuNode.Status
NODE_TOKEN_PREFIX = "thn-"  # noqa: S105 - a public prefix, not a secret
# The node name becomes a queue name (gpu.node.<name>) and a Celery hostname part.
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _audit(node: GpuNode, kind: str, message: str, actor: str = "") -> None:
    NodeEvent.objects.create(
        node=node, node_name=node.name, kind=kind, message=message, actor=actor
    )


def node_get(*, name: str) -> GpuNode:
    node = GpuNode.objects.filter(name=name).first()
    if node is None:
        raise NotFound(f"No GPU node named '{name}'.", code="node_not_found")
    return node


def node_create(*, name: object, actor: Actor | str = SYSTEM) -> tuple[GpuNode, str]:
    """Create a node and return it with its token, which is never retrievable again.
    (A bare string ``actor``, from older callers, is recorded as a system actor.)"""
    who = Actor.coerce(actor)
    if not isinstance(name, str) or not _NODE_NAME.match(name):
        raise InvalidRequest(
            "name must be 1-100 letters, digits, '.', '_' or '-', starting with a letter or "
            "digit (it becomes the node's queue name).",
            code="invalid_value",
            param="name",
        )
    token = NODE_TOKEN_PREFIX + secrets.token_urlsafe(32)
    try:
        with transaction.atomic():
            node = GpuNode.objects.create(name=name, token_sha256=_hash(token))
            _audit(node, "created", "Node created.", who.label)
            audit_record(
                actor=who, action="node.create", obj=node, changes=created({"token": "set"})
            )
            transaction.on_commit(lambda: broker_user_set(name, node.token_sha256))
    except IntegrityError:
        raise Conflict(f"A node named '{name}' already exists.", code="node_exists") from None
    return node, token


def node_rotate_token(*, node: GpuNode, actor: Actor | str = SYSTEM) -> str:
    """Issue a new token; the old one is refused from now on."""
    who = Actor.coerce(actor)
    token = NODE_TOKEN_PREFIX + secrets.token_urlsafe(32)
    digest = _hash(token)
    with transaction.atomic():
        GpuNode.objects.filter(pk=node.pk).update(token_sha256=digest)
        _audit(node, "token_rotated", "Token rotated; the previous token is refused.", who.label)
        audit_record(
            actor=who,
            action="node.rotate_token",
            obj=node,
            changes={"token": {"from": "set", "to": "rotated"}},
        )
        # The broker too: the old password stops working, and so do its open connections.
        transaction.on_commit(lambda: broker_user_set(node.name, digest, disconnect=True))
    return token


def node_authenticate(*, name: object, token: object) -> GpuNode | None:
    """The node if ``token`` is its current token; None (and a log line) otherwise."""
    node = GpuNode.objects.filter(name=name).first() if isinstance(name, str) else None
    ok = (
        node is not None
        and isinstance(token, str)
        and hmac.compare_digest(node.token_sha256, _hash(token))
    )
    if not ok:
        log.warning("dropping a message from node %r: unknown node or wrong token", name)
        return None
    return node


def node_settle(*, node_pk: int) -> str:
    """Recompute and store the node's status from its facts; returns it."""
    with transaction.atomic():
        node = GpuNode.objects.select_for_update().get(pk=node_pk)
        cutoff = timezone.now() - timedelta(seconds=settings.TRAINHUB_NODE_OFFLINE_SECONDS)
        if node.retired or node.last_heartbeat_at is None or node.last_heartbeat_at < cutoff:
            status = N.OFFLINE
        elif node.draining:
            status = N.DRAINING
        elif node.current_attempt_id is not None:
            status = N.BUSY
        else:
            status = N.IDLE
        if status != node.status:
            GpuNode.objects.filter(pk=node.pk).update(status=status)
            if status == N.OFFLINE:
                _audit(node, "offline", _why_offline(node))
                messages.send_node_servers_lost(node.pk)
            elif status == N.IDLE:  # a node free for work: look for a job
                messages.send_dispatch()
    return status


def _why_offline(node: GpuNode) -> str:
    if node.retired and node.ephemeral:
        return "Ephemeral node retired after its job; offline until it starts again."
    if node.retired:
        return "Node stopped; offline until it starts again."
    if node.last_heartbeat_at is None:
        return "Node never registered."
    return f"No heartbeat for {settings.TRAINHUB_NODE_OFFLINE_SECONDS} s; node is offline."


def _int(value: object) -> int:
    if not isinstance(value, int | float | str):
        return 0
    try:
        return max(0, int(value))
    except (ValueError, OverflowError):
        return 0


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _clean_report(report: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a node's registration we keep, with types enforced (it is remote input)."""
    caps = _mapping(report.get("capabilities"))
    raw_gpus = caps.get("gpus")
    if not isinstance(raw_gpus, list):
        raw_gpus = []
    gpus = [
        {"name": str(g.get("name", ""))[:100], "vram_mb": _int(g.get("vram_mb"))}
        for g in raw_gpus[:64]
        if isinstance(g, Mapping)
    ]
    labels = _mapping(report.get("labels"))
    return {
        "capabilities": {
            "gpu_count": len(gpus),
            "gpus": gpus,
            **{
                k: str(caps[k])[:100]
                for k in ("cuda_version", "driver_version", "backend", "hostname")
                if caps.get(k)
            },
        },
        # Which worker process reported: a new one means the node (re)started.
        "process": str(report.get("process") or "")[:100],
        "labels": {str(k)[:63]: str(v)[:200] for k, v in list(labels.items())[:64]},
        "ephemeral": bool(report.get("ephemeral")),
        "celery_hostname": str(report.get("celery_hostname") or "")[:255],
    }


def parse_cached_models(value: object) -> list[str] | None:
    """A heartbeat's ``models``: None when absent; else every item a model reference a job
    could name (a hub id or an absolute path, at most MAX_NAME characters), at most
    MAX_MODELS of them; returned sorted without repeats. Anything else is refused whole
    (InvalidRequest naming the item): it comes from a GPU node, and a node sends only what this
    accepts (gpu_worker.agent.model_cache.reportable)."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidRequest(
            "models must be a list of model names (hub ids or absolute paths).",
            code="invalid_value",
            param="models",
        )
    if len(value) > MAX_MODELS:
        raise InvalidRequest(
            f"models lists {len(value)} models; at most {MAX_MODELS} are accepted.",
            code="invalid_value",
            param="models",
        )
    for i, name in enumerate(value):
        try:
            ok = isinstance(name, str) and len(name) <= MAX_NAME
            ok = ok and validate_model_name(name) == name
        except SpecError:
            ok = False
        if not ok:
            raise InvalidRequest(
                f"models[{i}] must be a hub id 'owner/name' or an absolute path of at most "
                f"{MAX_NAME} characters, without surrounding whitespace.",
                code="invalid_value",
                param=f"models[{i}]",
            )
    return sorted(set(value))


def _models_fields(node: GpuNode, models: list[str] | None, now: Any) -> dict[str, Any]:
    """The fields a models report sets, with a node event when the list changed."""
    if models is None:
        return {}
    before = set(node.cached_models or [])
    added, removed = sorted(set(models) - before), sorted(before - set(models))
    if added or removed:
        parts = [f"{len(models)} cached"]
        if added:
            parts.append("new: " + _few(added))
        if removed:
            parts.append("gone: " + _few(removed))
        _audit(node, "models", "Models: " + "; ".join(parts) + ".")
    return {"cached_models": models, "models_reported_at": now}


def _few(names: list[str], shown: int = 5) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def node_register(
    *, node: GpuNode, report: Mapping[str, Any], models: list[str] | None = None
) -> GpuNode:
    """A node (re)started: store what it reported and bring it online. ``models``: its
    cached models, as :func:`parse_cached_models` returns them (None: not reported)."""
    now = timezone.now()
    fields = _clean_report(report)
    restarted = fields["process"] != node.process
    GpuNode.objects.filter(pk=node.pk).update(
        **fields,
        **_models_fields(node, models, now),
        last_heartbeat_at=now,
        registered_at=now,
        # A retired node re-registering from the same process is on its way out.
        **({"retired": False} if restarted else {}),
    )
    # Nodes re-register every few minutes; only a (re)start or a change is worth an audit line.
    if restarted or fields["capabilities"] != node.capabilities:
        caps = fields["capabilities"]
        gpus = ", ".join(f"{g['name']} ({g['vram_mb']} MiB)" for g in caps["gpus"]) or "no GPU"
        _audit(node, "registered", f"Registered: {gpus}; backend {caps.get('backend', '?')}.")
    node_settle(node_pk=node.pk)
    return node


def node_heartbeat(*, node: GpuNode, models: list[str] | None = None) -> None:
    """The node is alive; ``models`` as for :func:`node_register`."""
    now = timezone.now()
    GpuNode.objects.filter(pk=node.pk).update(
        last_heartbeat_at=now, **_models_fields(node, models, now)
    )
    node_settle(node_pk=node.pk)


def node_stopping(*, node: GpuNode) -> None:
    """A node shut down cleanly: offline now rather than after the heartbeat timeout, retired
    until a new process registers. Its last heartbeat stays: when it was last seen."""
    GpuNode.objects.filter(pk=node.pk).update(retired=True)
    node_settle(node_pk=node.pk)


def node_stop_requests(
    *, node: GpuNode, running: tuple[object, object] | None = None
) -> list[dict[str, object]]:
    """The attempts this node must stop, as ``[{"job_id", "attempt", "mode"}]``: its live
    attempts of cancelling jobs (mode cancel) and of paused jobs (mode pause: the executor
    saves a checkpoint first), and ``running`` (what its supervisor runs; mode cancel) unless
    that is still the live attempt of a running job claimed by this node (ended by a lease
    expiry, say). Nodes pull this with their heartbeat: they cannot be sent anything but a
    doorbell. Nodes older than the mode stop every listed attempt at once."""
    mine = JobAttempt.objects.filter(node_name=node.name)
    modes = {JobStatus.CANCELLING: StopMode.CANCEL, JobStatus.PAUSED: StopMode.PAUSE}
    stop = {
        (job_id, number): modes[JobStatus(status)]
        for job_id, number, status in mine.filter(
            ended_at__isnull=True, job__status__in=modes
        ).values_list("job__public_id", "number", "job__status")
    }
    if running is not None:
        job_id, number = running
        if not isinstance(job_id, str) or type(number) is not int:
            raise InvalidRequest(
                "running must be [job_id, attempt number].", code="invalid_value", param="running"
            )
        still_mine = mine.filter(
            job__public_id=job_id,
            number=number,
            ended_at__isnull=True,
            claimed_at__isnull=False,
            job__status__in=(JobStatus.PROVISIONING, JobStatus.RUNNING),
        ).exists()
        if not still_mine:
            stop.setdefault((job_id, number), StopMode.CANCEL)
    return [
        {"job_id": job_id, "attempt": number, "mode": str(mode)}
        for (job_id, number), mode in sorted(stop.items())
    ]


def nodes_mark_offline() -> int:
    """Settle every node that looks online but has not heartbeaten in time; returns count."""
    cutoff = timezone.now() - timedelta(seconds=settings.TRAINHUB_NODE_OFFLINE_SECONDS)
    stale = GpuNode.objects.exclude(status=N.OFFLINE).filter(last_heartbeat_at__lt=cutoff)
    return sum(node_settle(node_pk=pk) == N.OFFLINE for pk in stale.values_list("pk", flat=True))


def node_set_draining(*, node: GpuNode, draining: bool, actor: Actor | str = SYSTEM) -> GpuNode:
    who = Actor.coerce(actor)
    with transaction.atomic():
        before = GpuNode.objects.select_for_update().values_list("draining", flat=True)
        was = before.get(pk=node.pk)
        GpuNode.objects.filter(pk=node.pk).update(draining=draining)
        if draining:
            _audit(
                node, "drain", "Draining: finishes its current job, takes no new one.", who.label
            )
        else:
            _audit(node, "undrain", "Accepting jobs again.", who.label)
        changes = diff({"draining": was}, {"draining": draining})
        if changes:  # a repeat is a NodeEvent line, not a change
            action = "node.drain" if draining else "node.undrain"
            audit_record(actor=who, action=action, obj=node, changes=changes)
    node_settle(node_pk=node.pk)
    node.refresh_from_db()
    return node


def node_delete(*, node: GpuNode, actor: Actor | str = SYSTEM) -> None:
    """Delete an offline node; its audit trail stays (by name)."""
    who = Actor.coerce(actor)
    if node_settle(node_pk=node.pk) != N.OFFLINE:
        raise Conflict(
            f"Node '{node.name}' is {node.status}; only an offline node can be deleted "
            "(drain it and stop its worker first).",
            code="node_not_offline",
        )
    name = node.name
    with transaction.atomic():
        _audit(node, "deleted", "Node deleted.", who.label)
        audit_record(
            actor=who,
            action="node.delete",
            obj=node,
            changes=deleted({"name": node.name, "token": "set"}),
        )
        node.delete()
        transaction.on_commit(lambda: broker_user_delete(name))


def nodes_sync_broker_users() -> int:
    """Put back the broker users a restarted Redis forgot; returns how many."""
    return broker_users_sync(GpuNode.objects.values_list("name", "token_sha256"))


# --- the node's attempt ends or is cancelled --------------------------------------------------


def node_release(*, attempt: JobAttempt) -> None:
    """The attempt ended: free its node. An ephemeral node is shutting down after its one job:
    it retires (offline, whatever its last heartbeats say) until a new process registers, so
    no second job waits in a queue nobody reads."""
    node = GpuNode.objects.filter(current_attempt_id=attempt.pk).first()
    if node is None:
        return
    GpuNode.objects.filter(pk=node.pk, current_attempt_id=attempt.pk).update(
        current_attempt=None, retired=node.ephemeral
    )
    node_settle(node_pk=node.pk)  # idle again → the dispatcher looks for the next job
