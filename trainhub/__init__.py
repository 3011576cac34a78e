"""trainhub control plane. Importing the Celery app here makes @shared_task bind to it."""

from trainhub.celery import app as celery_app

__all__ = ["celery_app"]
