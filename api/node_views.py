"""GPU node endpoints: the operators' registry, and the calls nodes make with their tokens.

Operators need staff status and the Django permission the method needs (``jobs.view_gpunode``
to read, ``add``/``change``/``delete`` to create, act on or delete a node). Nodes speak for
themselves only: ``nodes/<name>/claim|heartbeat/`` need that node's token, and an attempt's
events need the report token the node got when it claimed that attempt (docs/SECURITY.md).
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import AllowAny, BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api import presenters as p
from api import serializers as sz
from api.auth import request_actor
from api.schema import responses
from api.views import JSONBodyParser, _body
from jobs import selectors
from jobs.errors import Conflict, InvalidRequest, ServiceError
from jobs.models import GpuNode
from jobs.services.core import attempts
from jobs.services.fleet import nodes as node_services
from jobs.services.scheduling import dispatch
from jobs.services.serving import node_servers


class OperatorPermission(BasePermission):
    """Staff holding the model permission for the method (``actions`` maps it to a verb)."""

    actions = {"GET": "view", "HEAD": "view", "OPTIONS": "view", "POST": "add", "DELETE": "delete"}

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        verb = getattr(view, "post_action", None) if request.method == "POST" else None
        verb = verb or self.actions.get(request.method or "", "")
        return bool(user and user.is_staff and verb and user.has_perm(f"jobs.{verb}_gpunode"))


class NodeListView(APIView):
    permission_classes = [OperatorPermission]
    parser_classes = [JSONBodyParser]

    @extend_schema(
        operation_id="nodes_list",
        tags=["nodes (operators)"],
        responses=responses({200: sz.NodeList}, 403),
    )
    def get(self, request: Request) -> Response:
        return Response(p.page_json([p.node_json(n) for n in selectors.node_list()], False))

    @extend_schema(
        operation_id="nodes_create",
        tags=["nodes (operators)"],
        request=sz.NodeCreate,
        responses=responses({201: sz.NodeCreated}, 400, 403, 409, 413),
    )
    def post(self, request: Request) -> Response:
        """Create a node; the response carries its token, shown this once."""
        node, token = node_services.node_create(
            name=_body(request, ("name",)).get("name"), actor=request_actor(request)
        )
        return Response({**p.node_json(node), "token": token}, status=status.HTTP_201_CREATED)


class NodeDetailView(APIView):
    permission_classes = [OperatorPermission]

    @extend_schema(
        operation_id="nodes_retrieve",
        tags=["nodes (operators)"],
        responses=responses({200: sz.Node}, 403, 404),
    )
    def get(self, request: Request, name: str) -> Response:
        return Response(p.node_json(node_services.node_get(name=name)))

    @extend_schema(
        operation_id="nodes_delete",
        tags=["nodes (operators)"],
        responses=responses({200: sz.Deleted}, 403, 404, 409),
    )
    def delete(self, request: Request, name: str) -> Response:
        node = node_services.node_get(name=name)
        node_services.node_delete(node=node, actor=request_actor(request))
        return Response({"id": name, "object": "gpu_node", "deleted": True})


class NodeActionView(APIView):
    """``POST nodes/{name}/drain|undrain|rotate-token/``."""

    permission_classes = [OperatorPermission]
    post_action = "change"
    action = ""

    @extend_schema(
        tags=["nodes (operators)"],
        request=None,
        responses=responses({200: sz.NodeChanged}, 403, 404, 409),
    )
    def post(self, request: Request, name: str) -> Response:
        node = node_services.node_get(name=name)
        actor = request_actor(request)
        if self.action == "rotate-token":
            token = node_services.node_rotate_token(node=node, actor=actor)
            return Response({**p.node_json(node), "token": token})
        node = node_services.node_set_draining(
            node=node, draining=self.action == "drain", actor=actor
        )
        return Response(p.node_json(node))


class NodeEventListView(APIView):
    permission_classes = [OperatorPermission]

    @extend_schema(
        operation_id="nodes_events_list",
        tags=["nodes (operators)"],
        responses=responses({200: sz.NodeEventList}, 403, 404),
    )
    def get(self, request: Request, name: str) -> Response:
        rows = selectors.node_event_list(name=name)
        return Response(p.page_json([p.node_event_json(e) for e in rows], False))


def _bearer(request: Request) -> str:
    scheme, _, token = get_authorization_header(request).decode("latin-1").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _node(request: Request, name: str) -> GpuNode:
    """The node the path names, if the request carries its current token."""
    node = node_services.node_authenticate(name=name, token=_bearer(request))
    if node is None:
        raise _Unauthorized()
    return node


class _NodeView(APIView):
    """Called by nodes: no session, no API key; the node token (or report token) decides."""

    authentication_classes: list[type[BaseAuthentication]] = []
    permission_classes = [AllowAny]
    parser_classes = [JSONBodyParser]


class NodeClaimView(_NodeView):
    """``POST nodes/{name}/claim/ {"job_id", "attempt"}``: the node starts the attempt. 200 with
    ``{"spec", "report_token"}`` once, for the live attempt sent to that node; 409 for a
    duplicate, outdated, cancelled or another node's one (the node then drops the message)."""

    @extend_schema(
        operation_id="node_claim",
        tags=["node agent"],
        request=sz.NodeClaim,
        responses=responses({200: sz.NodeClaimed}, 400, 404, 409, 413),
    )
    def post(self, request: Request, name: str) -> Response:
        node = _node(request, name)
        body = _body(request)
        claimed = dispatch.attempt_claim(
            node=node, job_id=body.get("job_id"), attempt_number=body.get("attempt")
        )
        if claimed is None:
            raise Conflict(
                "This attempt is not (or no longer) this node's to start.",
                code="attempt_not_claimable",
            )
        return Response({"spec": claimed.spec, "report_token": claimed.report_token})


class NodeHeartbeatView(_NodeView):
    """``POST nodes/{name}/heartbeat/ {"registration"?, "running"?, "stopping"?, "models"?,
    "server"?}``: the node is alive (registering now and then, or saying goodbye; ``models``:
    the base models it has cached, when it registers or they changed; ``server``: its inference
    server, when it started, stopped or changed). The answer lists the attempts it must
    stop, ``{"cancel": [{"job_id", "attempt"}]}``: nodes cannot be sent anything else. A body
    with any bad part is refused whole (400 naming it) before anything is stored."""

    @extend_schema(
        operation_id="node_heartbeat",
        tags=["node agent"],
        request=sz.NodeHeartbeat,
        responses=responses({200: sz.NodeHeartbeatAnswer}, 400, 404, 413),
    )
    def post(self, request: Request, name: str) -> Response:
        node = _node(request, name)
        body = _body(request)
        registration, running = body.get("registration"), body.get("running")
        if registration is not None and not isinstance(registration, dict):
            raise InvalidRequest(
                "registration must be an object.", code="invalid_value", param="registration"
            )
        if running is not None and not (isinstance(running, list) and len(running) == 2):
            raise InvalidRequest(
                "running must be [job_id, attempt].", code="invalid_value", param="running"
            )
        models = node_services.parse_cached_models(body.get("models"))
        server = body.get("server")
        server = None if server is None else node_servers.parse_server_report(server)
        if body.get("stopping") is True:
            node_services.node_stopping(node=node)
        elif registration is not None:
            node_services.node_register(node=node, report=registration, models=models)
        else:
            node_services.node_heartbeat(node=node, models=models)
        if server is not None and body.get("stopping") is not True:
            node_servers.node_server_report(node=node, report=server)
        cancel = node_services.node_stop_requests(
            node=node, running=tuple(running) if running else None
        )
        return Response({"cancel": cancel})


class NodeAttemptEventsView(_NodeView):
    """``POST nodes/{name}/attempts/{job_id}/{attempt}/events/ {"events": [...]}`` with the
    attempt's report token: the executor's progress. 403 for a token not issued for this very
    attempt of this node (another node's, another attempt's, a forged one)."""

    @extend_schema(
        operation_id="node_attempt_events",
        tags=["node agent"],
        request=sz.NodeEvents,
        responses=responses({200: sz.NodeEventsStored}, 400, 403, 404, 413),
    )
    def post(self, request: Request, name: str, job_id: str, attempt: int) -> Response:
        allowed = dispatch.attempt_for_report(
            node_name=name, job_id=job_id, attempt_number=attempt, token=_bearer(request)
        )
        if not allowed:
            raise _Forbidden()
        events = _body(request).get("events")
        if not isinstance(events, list):
            raise InvalidRequest(
                "events must be a list of event objects.", code="invalid_value", param="events"
            )
        stored = attempts.attempt_record_events(
            job_id=job_id, attempt_number=attempt, events=events
        )
        return Response({"stored": stored})


class _Unauthorized(ServiceError):
    http_status = 401
    error_type = "authentication_error"

    def __init__(self) -> None:
        super().__init__("Unknown node or invalid node token.", code="invalid_node_token")


class _Forbidden(ServiceError):
    http_status = 403
    error_type = "permission_error"

    def __init__(self) -> None:
        super().__init__(
            "This report token does not speak for this attempt of this node.",
            code="invalid_report_token",
        )
