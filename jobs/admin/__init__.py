"""Operator views. Actions go through the same services as the API; secrets never show.

One module per area; importing them registers their pages with the admin site.
"""

from django.contrib import admin

from jobs.admin import fleet, projects, stored, training_jobs, webhooks

admin.site.site_header = "trainhub operations"
admin.site.site_title = "trainhub admin"
admin.site.index_title = "Jobs, GPU fleet, providers and webhooks"

__all__ = ["fleet", "projects", "stored", "training_jobs", "webhooks"]
