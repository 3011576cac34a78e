"""Reads of the audit trail (staff only; the API's ``GET /api/v1/audit`` and nothing else).

Newest first with the same keyset pages as every list (``after`` = the last entry's id). A
filter longer than any stored value is a 400 naming it; one holding a NUL (which PostgreSQL
refuses in a text parameter) matches nothing and is never queried.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db.models import Q

from jobs.errors import InvalidRequest
from jobs.models import AuditEntry
from jobs.selectors import newest_first_page

MAX_FILTER_CHARS = 150


def _checked(param: str, value: str) -> bool:
    """Whether ``value`` can match a row; a 400 when it is longer than any can be."""
    if len(value) > MAX_FILTER_CHARS:
        raise InvalidRequest(
            f"{param} must be at most {MAX_FILTER_CHARS} characters.",
            code="invalid_value",
            param=param,
        )
    return "\x00" not in value


def audit_list(
    *,
    after: str | None,
    limit: int,
    action: str | None = None,
    object_id: str | None = None,
    actor: str | None = None,
    project: str | None = None,
    source: str | None = None,
) -> tuple[list[AuditEntry], bool]:
    """Entries newest first. ``actor`` matches a username/command or an API key prefix;
    ``project`` a project's slug."""
    qs = AuditEntry.objects.all()
    if source:
        if source not in AuditEntry.Source.values:
            raise InvalidRequest(
                f"source must be one of: {', '.join(AuditEntry.Source.values)}.",
                code="invalid_value",
                param="source",
            )
        qs = qs.filter(source=source)
    match: Callable[[str], Q]
    for param, value, match in (
        ("action", action, lambda v: Q(action=v)),
        ("object_id", object_id, lambda v: Q(object_id=v)),
        ("actor", actor, lambda v: Q(actor=v) | Q(api_key_prefix=v)),
        ("project", project, lambda v: Q(project_slug=v)),
    ):
        if value:
            qs = qs.filter(match(value)) if _checked(param, value) else qs.none()
    return newest_first_page(
        qs, among=AuditEntry.objects.all(), after=after, limit=limit, noun="audit entry"
    )
