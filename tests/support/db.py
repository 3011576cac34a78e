"""Rows as the database has them now, shared by the tests/jobs modules."""

from __future__ import annotations

from typing import TypeVar

from django.db.models import Model

M = TypeVar("M", bound=Model)


def fresh(obj: M) -> M:
    """``obj`` re-read from the database (in place, and returned for use in an expression)."""
    obj.refresh_from_db()
    return obj
