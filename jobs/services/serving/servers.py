"""Inference servers: an operator registers one (``manage.py register_server``), and trainhub
calls its runtime LoRA endpoints (vLLM's ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter``, at its ``loader_url`` when it has one), each call bounded in time.
A GPU node with the serving role registers its own (jobs.services.serving.node_servers). A server that cannot be reached is
marked offline and no longer chosen."""

from __future__ import annotations

import contextlib
import json

import requests
from django.db import transaction
from django.utils import timezone

from jobs.crypto import decrypt_json, encrypt_json
from jobs.models import GpuNode, InferenceServer
from jobs.services.accounts.audit import (
    SYSTEM,
    Actor,
    AuditObject,
    audit_record,
    created,
    diff,
    redacted_url,
)
from jobs.services.outbox import messages

# Loading fetches the bundle, checks it and reads the weights: minutes for a large adapter.
LOAD_TIMEOUT_SECONDS = 600
CALL_TIMEOUT_SECONDS = 15


class ServerUnavailable(Exception):
    """The server did not answer (or failed on its side): try another one."""


class LoadRefused(Exception):
    """The server answered and refused the adapter (bad bytes, a base it does not fit)."""


def server_register(
    *,
    name: str,
    url: str,
    base_model: str,
    served_name: str,
    api_key: str | None,
    max_adapters: int = 4,
    loader_url: str = "",
    node: GpuNode | None = None,
    instance: str = "",
    actor: Actor = SYSTEM,
) -> InferenceServer:
    """Register a server, or update the one of that name (back online); deployments waiting
    for a server of its base model are placed. ``loader_url``: where its adapters are loaded,
    when not at ``url``; ``node``: the GPU node that runs it; ``instance``: which run of it."""
    fields = {
        "url": url.rstrip("/"),
        "loader_url": loader_url.rstrip("/"),
        "node": node,
        "instance": instance,
        "base_model": base_model,
        "served_name": served_name,
        "max_adapters": max(1, max_adapters),
        "api_key_ciphertext": encrypt_json({"api_key": api_key}) if api_key else "",
        "status": InferenceServer.Status.ONLINE,
        "status_detail": "",
    }
    with transaction.atomic():
        before = InferenceServer.objects.select_for_update().filter(name=name).first()
        server, made = InferenceServer.objects.update_or_create(name=name, defaults=fields)
        shown = {k: fields[k] for k in ("base_model", "served_name", "max_adapters")}
        shown["url"] = redacted_url(str(fields["url"]))
        changes = (
            created(shown)
            if made or before is None
            else diff(
                {**{k: getattr(before, k) for k in shown}, "url": redacted_url(before.url)}, shown
            )
        )
        what = AuditObject("inference_server", server.name, server.base_model)
        audit_record(actor=actor, action="server.register", obj=what, changes=changes)
        messages.send_place_deployments(base_model)
    return server


def _headers(server: InferenceServer) -> dict[str, str]:
    if not server.api_key_ciphertext:
        return {}
    return {"Authorization": f"Bearer {decrypt_json(server.api_key_ciphertext)['api_key']}"}


def _post(server: InferenceServer, path: str, body: dict[str, str], timeout: float) -> None:
    try:
        answer = requests.post(
            (server.loader_url or server.url) + path,
            json=body,
            headers=_headers(server),
            timeout=timeout,
        )
    except requests.RequestException as exc:
        raise ServerUnavailable(f"{server.name} did not answer: {exc}") from exc
    if answer.status_code >= 500:
        raise ServerUnavailable(f"{server.name} failed: HTTP {answer.status_code}")
    if answer.status_code >= 400:
        message = server_error_message(answer.content)
        raise LoadRefused(f"{server.name} refused: HTTP {answer.status_code}: {message}")


def server_error_message(raw: bytes) -> str:
    """The message of an inference server's error answer (OpenAI's shape), else its start."""
    try:
        return str(json.loads(raw)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return raw[:300].decode(errors="replace")


def server_load(server: InferenceServer, name: str, url: str, sha256: str) -> None:
    """Load the bundle at ``url`` (checked against ``sha256`` by the server) as ``name``."""
    body = {"lora_name": name, "lora_path": url, "sha256": sha256}
    _post(server, "/v1/load_lora_adapter", body, LOAD_TIMEOUT_SECONDS)


def server_unload(server: InferenceServer, name: str) -> None:
    """Unload ``name``; an adapter the server no longer holds (restarted) is not an error."""
    with contextlib.suppress(LoadRefused):
        _post(server, "/v1/unload_lora_adapter", {"lora_name": name}, CALL_TIMEOUT_SECONDS)


def server_mark_offline(server: InferenceServer, reason: str) -> None:
    InferenceServer.objects.filter(pk=server.pk).update(
        status=InferenceServer.Status.OFFLINE, status_detail=reason[:500], checked_at=timezone.now()
    )
