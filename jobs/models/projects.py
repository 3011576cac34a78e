from django.conf import settings
from django.db import models


class Project(models.Model):
    """Owner of jobs, files, artifacts and credentials. Members see all of it; others nothing."""

    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=100, unique=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="ProjectMembership", related_name="projects"
    )
    max_concurrent_jobs = models.PositiveIntegerField(
        default=10, help_text="Live (non-terminal) jobs allowed at once."
    )
    max_spend_per_hour = models.DecimalField(
        max_digits=10,
        decimal_places=2,
        null=True,
        blank=True,
        help_text="USD per hour all of the project's rented machines may cost together "
        "(checked at placement); empty for no ceiling.",
    )
    operator_credential_providers = models.JSONField(
        default=list,
        blank=True,
        help_text="Provider kinds this project may use with the operator's environment credentials.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class ProjectMembership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner"
        MEMBER = "member"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    is_default = models.BooleanField(
        default=False, help_text="The project used when a request names none."
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="uniq_membership"),
            models.UniqueConstraint(
                fields=["user"], condition=models.Q(is_default=True), name="one_default_project"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


class ApiKey(models.Model):
    """A bearer key. Only ``prefix`` (for lookup and display) and a SHA-256 of the key are kept."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    key_sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class ProviderCredential(models.Model):
    """Cloud provider secrets of a project, encrypted at rest (MultiFernet); never shown again."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="credentials")
    provider = models.CharField(max_length=32)
    name = models.CharField(max_length=100)
    secret_ciphertext = models.TextField()
    secret_fields = models.JSONField(default=list, help_text="Names of the stored secret fields.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "provider", "name"], name="uniq_credential")
        ]

    def __str__(self) -> str:
        return f"{self.provider}:{self.name}"
