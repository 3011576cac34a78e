"""``route()``: a URL that answers with and without its trailing slash, so a client that
drops the slash (OpenAI's SDK does) is served, never redirected (a redirected POST comes
back as a GET and loses its body)."""

from __future__ import annotations

from typing import Any

from django.urls import URLPattern, path


def route(pattern: str, view: Any, name: str | None = None) -> list[URLPattern]:
    """``pattern`` without its slash; the named (reversed) form is the one with the slash."""
    return [path(f"{pattern}/", view, name=name), path(pattern, view)]
