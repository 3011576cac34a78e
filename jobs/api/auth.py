"""Bearer API keys, and which project a request acts in."""

from __future__ import annotations

from django.contrib.auth.models import User
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from jobs.models import ApiKey, Project
from jobs.services.projects import api_key_authenticate, project_default_for_user


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[object, ApiKey] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer":
            return None
        key = api_key_authenticate(raw=raw.strip())
        if key is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked API key.")
        if not key.is_member:  # type: ignore[attr-defined]  # see pyproject [tool.mypy]
            raise exceptions.AuthenticationFailed(
                f"This API key's user is no longer a member of project '{key.project.slug}'."
            )
        return key.user, key

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


def request_user(request: Request) -> User:
    """The signed-in user: every API view but the node and webhook ones requires one."""
    if not isinstance(request.user, User):
        raise exceptions.NotAuthenticated()
    return request.user


def request_project(request: Request) -> Project:
    """An API key acts in its own project; a browser session in the user's default project."""
    if isinstance(request.auth, ApiKey):
        return request.auth.project
    return project_default_for_user(user=request_user(request))
