"""Template context every page gets (the admin's pages are the only templates here)."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def operator_links(request: HttpRequest) -> dict[str, str]:
    """Where the operations tools beside the admin live (Flower asks for its own login)."""
    return {"flower_url": settings.TRAINHUB_FLOWER_URL}
