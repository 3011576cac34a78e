"""Inference servers run by GPU nodes with the serving role (gpu_worker.agent.serving).

Such a node reports its server with its heartbeat, under ``server``: the running server as
``{"base_model", "url", "loader_url", "api_key", "max_adapters", "instance"}`` (when it became
ready or changed, and with each registration), or ``{"down": reason}`` when the process died
and is being started again. The server is registered as ``node-<node name>``, bound to its
node: it lives and dies with it. A new ``instance`` is a new process, which holds none of the
adapters the last one held: they are placed again, there or elsewhere. A node that goes
offline takes its servers with it (``node_servers_lost``, sent by the fleet when it settles a
node offline).

What a node reports is remote input: checked field by field, refused whole with a 400 that
names the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from django.db import transaction
from django.utils import timezone

from jobs.errors import InvalidRequest
from jobs.models import GpuNode, InferenceServer
from jobs.services.accounts.audit import Actor
from jobs.services.serving.deployments import deployments_orphaned, server_lost
from jobs.services.serving.servers import server_register
from trainhub_contract.spec import SpecError, validate_model_name

MAX_ADAPTERS_LIMIT = 64
_KEY = re.compile(r"^[\x21-\x7e]{16,200}$")  # printable ASCII, no spaces: a bearer token
_INSTANCE = re.compile(r"^[A-Za-z0-9._:-]{1,100}$")


def server_name(node: GpuNode) -> str:
    return f"node-{node.name}"[:100]


def _refuse(field: str, what: str) -> InvalidRequest:
    return InvalidRequest(f"server.{field} {what}.", code="invalid_value", param=f"server.{field}")


def _url(report: Mapping[str, Any], field: str) -> str:
    value = report.get(field)
    if not isinstance(value, str) or len(value) > 500:
        raise _refuse(field, "must be an http(s) URL of at most 500 characters")
    try:
        parts = urlsplit(value)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port out of range, brackets that do not close
        ok = False
    if not ok:
        raise _refuse(field, "must be an http(s) URL of at most 500 characters")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise _refuse(field, "must be a base URL, without credentials, query or fragment")
    return value.rstrip("/")


def parse_server_report(report: object) -> dict[str, Any]:
    """The fields of a node's server report, checked; ``{"down": reason}`` stays as it is."""
    if not isinstance(report, Mapping):
        raise InvalidRequest("server must be an object.", code="invalid_value", param="server")
    if "down" in report:
        return {"down": str(report["down"])[:300]}
    try:
        base_model = validate_model_name(report.get("base_model"))
    except SpecError as exc:
        raise _refuse("base_model", f"is not a model name ({exc.message})") from None
    api_key, instance = report.get("api_key"), report.get("instance")
    if not isinstance(api_key, str) or not _KEY.match(api_key):
        raise _refuse("api_key", "must be 16 to 200 printable ASCII characters")
    if not isinstance(instance, str) or not _INSTANCE.match(instance):
        raise _refuse("instance", "must be 1 to 100 letters, digits or . _ : -")
    limit = report.get("max_adapters")
    if type(limit) is not int or not 1 <= limit <= MAX_ADAPTERS_LIMIT:
        raise _refuse("max_adapters", f"must be an integer from 1 to {MAX_ADAPTERS_LIMIT}")
    return {
        "base_model": base_model,
        "url": _url(report, "url"),
        "loader_url": _url(report, "loader_url"),
        "api_key": api_key,
        "max_adapters": limit,
        "instance": instance,
    }


def node_server_report(*, node: GpuNode, report: Mapping[str, Any]) -> None:
    """Apply a report :func:`parse_server_report` returned."""
    name = server_name(node)
    with transaction.atomic():
        before = InferenceServer.objects.select_for_update().filter(name=name).first()
        if "down" in report:
            if before is not None and before.status == InferenceServer.Status.ONLINE:
                server_lost(before, f"{node.name}: {report['down']}")
            return
        if before is not None and before.instance != report["instance"]:
            deployments_orphaned(before)  # a new process holds none of what the last one did
        if (
            before is not None
            and before.status == InferenceServer.Status.ONLINE
            and before.instance == report["instance"]
            and (before.url, before.loader_url, before.base_model, before.max_adapters)
            == (report["url"], report["loader_url"], report["base_model"], report["max_adapters"])
        ):
            InferenceServer.objects.filter(pk=before.pk).update(checked_at=timezone.now())
            return
        server_register(
            name=name,
            served_name=report["base_model"],
            node=node,
            actor=Actor.system(f"node {node.name}"),
            **report,
        )


def node_servers_lost(*, node_pk: int) -> int:
    """The node went offline: its servers are down, their adapters placed elsewhere."""
    node = GpuNode.objects.filter(pk=node_pk).first()
    if node is None or node.status != GpuNode.Status.OFFLINE:
        return 0  # back already
    lost = 0
    for server in InferenceServer.objects.filter(node=node, status=InferenceServer.Status.ONLINE):
        with transaction.atomic():
            server_lost(server, f"{node.name} went offline")
        lost += 1
    return lost
