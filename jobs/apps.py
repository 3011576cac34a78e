from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Training"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Lazy: the runners import the services, which need the models loaded first.
        from jobs.services.runners import runners_install

        runners_install()
