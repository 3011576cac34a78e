"""GPU node endpoints: the operators' registry (staff only) and the nodes' own claim call."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.authentication import get_authorization_header
from rest_framework.permissions import AllowAny, IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import selectors
from jobs.api import presenters as p
from jobs.api.views import JSONBodyParser, _body
from jobs.errors import Conflict, ServiceError
from jobs.services import dispatch
from jobs.services import nodes as node_services


class NodeListView(APIView):
    permission_classes = [IsAdminUser]
    parser_classes = [JSONBodyParser]

    @extend_schema(operation_id="nodes_list", responses=dict)
    def get(self, request: Request) -> Response:
        return Response(p.page_json([p.node_json(n) for n in selectors.node_list()], False))

    @extend_schema(request=dict, responses=dict)
    def post(self, request: Request) -> Response:
        """Create a node; the response carries its token, shown this once."""
        node, token = node_services.node_create(
            name=_body(request).get("name"), actor=request.user.get_username()
        )
        return Response({**p.node_json(node), "token": token}, status=status.HTTP_201_CREATED)


class NodeDetailView(APIView):
    permission_classes = [IsAdminUser]

    @extend_schema(responses=dict)
    def get(self, request: Request, name: str) -> Response:
        return Response(p.node_json(node_services.node_get(name=name)))

    @extend_schema(responses=dict)
    def delete(self, request: Request, name: str) -> Response:
        node = node_services.node_get(name=name)
        node_services.node_delete(node=node, actor=request.user.get_username())
        return Response({"id": name, "object": "gpu_node", "deleted": True})


class NodeActionView(APIView):
    """``POST nodes/{name}/drain|undrain|rotate-token/``."""

    permission_classes = [IsAdminUser]
    action = ""

    @extend_schema(request=None, responses=dict)
    def post(self, request: Request, name: str) -> Response:
        node = node_services.node_get(name=name)
        actor = request.user.get_username()
        if self.action == "rotate-token":
            token = node_services.node_rotate_token(node=node, actor=actor)
            return Response({**p.node_json(node), "token": token})
        node = node_services.node_set_draining(
            node=node, draining=self.action == "drain", actor=actor
        )
        return Response(p.node_json(node))


class NodeEventListView(APIView):
    permission_classes = [IsAdminUser]

    @extend_schema(responses=dict)
    def get(self, request: Request, name: str) -> Response:
        rows = selectors.node_event_list(name=name)
        return Response(p.page_json([p.node_event_json(e) for e in rows], False))


class NodeClaimView(APIView):
    """A node starts an attempt: ``POST {"node", "job_id", "attempt"}`` with its token as
    ``Authorization: Bearer thn-…``. 200 once for the live attempt sent to that node; 409 for
    a duplicate, outdated or cancelled one (the node then drops the message)."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    parser_classes = [JSONBodyParser]

    @extend_schema(request=dict, responses=dict)
    def post(self, request: Request) -> Response:
        body = _body(request)
        scheme, _, token = get_authorization_header(request).decode("latin-1").partition(" ")
        node = node_services.node_authenticate(name=body.get("node"), token=token.strip())
        if scheme.lower() != "bearer" or node is None:
            raise _Unauthorized()
        if not dispatch.attempt_claim(
            node=node, job_id=body.get("job_id"), attempt_number=body.get("attempt")
        ):
            raise Conflict(
                "This attempt is not (or no longer) this node's to start.",
                code="attempt_not_claimable",
            )
        return Response({"claimed": True})


class _Unauthorized(ServiceError):
    http_status = 401
    error_type = "authentication_error"

    def __init__(self) -> None:
        super().__init__("Unknown node or invalid node token.", code="invalid_node_token")
