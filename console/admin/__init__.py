"""Operator views. Actions go through the same services as the API; secrets never show.

One module per area; importing them registers their pages with the admin site.
"""

from django.contrib import admin

from console.admin import audit, fleet, projects, serving, stored, training_jobs, webhooks

admin.site.site_header = "trainhub operations"
admin.site.site_title = "trainhub admin"
admin.site.index_title = "Jobs, GPU fleet, providers, webhooks and the audit trail"
admin.site.index_template = "admin/jobs/dashboard_index.html"  # the operator dashboard on top
admin.site.site_url = None  # no "View site": the API's root is not a page

__all__ = ["audit", "fleet", "projects", "serving", "stored", "training_jobs", "webhooks"]
