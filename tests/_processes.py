"""Helpers for tests that start real processes against the pytest database."""

from __future__ import annotations

from urllib.parse import quote


def database_url(db: dict) -> str:
    """A DATABASE_URL for another process to reach the (test) database this one uses."""
    user = quote(db.get("USER") or "", safe="")
    password = quote(db.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    return f"postgres://{auth}{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"
