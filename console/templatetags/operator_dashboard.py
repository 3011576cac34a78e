"""``{% operator_dashboard %}``: the admin index's dashboard (console/admin/dashboard.py)."""

from __future__ import annotations

from typing import Any

from django import template

from console.admin import dashboard

register = template.Library()


@register.inclusion_tag("admin/jobs/dashboard.html")
def operator_dashboard() -> dict[str, Any]:
    return {"d": dashboard.dashboard()}
