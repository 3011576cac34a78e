from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Training"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from jobs.api import schema  # noqa: F401  (registers the OpenAPI auth extension)
