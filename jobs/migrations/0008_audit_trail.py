"""The audit trail (AuditEntry), append-only in the database itself: triggers refuse every
UPDATE and DELETE of a row, on PostgreSQL and on SQLite (the embedded default).

PostgreSQL's TRUNCATE fires no row trigger, so a test database can still be flushed; SQLite's
flush deletes row by row, so ``manage.py flush`` fails there while audit entries exist.
A later migration that alters this table must create the SQLite triggers again: SQLite alters
a table by rebuilding it, which drops its triggers.
"""

import django.utils.timezone
from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

import jobs.models.audit

REFUSAL = "jobs_auditentry is append-only: audit entries cannot be changed or deleted"

POSTGRESQL_UP = [
    f"""
    CREATE OR REPLACE FUNCTION jobs_auditentry_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION '{REFUSAL} (% refused)', TG_OP USING ERRCODE = 'insufficient_privilege';
    END
    $$
    """,
    """
    CREATE TRIGGER jobs_auditentry_append_only BEFORE UPDATE OR DELETE ON jobs_auditentry
    FOR EACH ROW EXECUTE FUNCTION jobs_auditentry_refuse()
    """,
]
POSTGRESQL_DOWN = [
    "DROP TRIGGER IF EXISTS jobs_auditentry_append_only ON jobs_auditentry",
    "DROP FUNCTION IF EXISTS jobs_auditentry_refuse()",
]
SQLITE_UP = [
    f"""
    CREATE TRIGGER jobs_auditentry_no_{verb} BEFORE {verb.upper()} ON jobs_auditentry
    BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END
    """
    for verb in ("update", "delete")
]
SQLITE_DOWN = [f"DROP TRIGGER IF EXISTS jobs_auditentry_no_{verb}" for verb in ("update", "delete")]
STATEMENTS = {"postgresql": (POSTGRESQL_UP, POSTGRESQL_DOWN), "sqlite": (SQLITE_UP, SQLITE_DOWN)}


def _run(schema_editor: BaseDatabaseSchemaEditor, which: int) -> None:
    vendor = schema_editor.connection.vendor
    if vendor not in STATEMENTS:
        raise RuntimeError(f"No append-only trigger for the {vendor} database; add one here.")
    for sql in STATEMENTS[vendor][which]:
        schema_editor.execute(sql, params=None)  # None: a literal %, no placeholders


def triggers_up(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    _run(schema_editor, 0)


def triggers_down(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    _run(schema_editor, 1)


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0007_webhook_endpoints"),
    ]

    operations = [
        migrations.CreateModel(
            name="AuditEntry",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "public_id",
                    models.CharField(
                        default=jobs.models.audit.new_audit_id,
                        editable=False,
                        max_length=40,
                        unique=True,
                    ),
                ),
                (
                    "created_at",
                    models.DateTimeField(default=django.utils.timezone.now, editable=False),
                ),
                (
                    "actor",
                    models.CharField(help_text="Username, command, or 'system'.", max_length=150),
                ),
                (
                    "source",
                    models.CharField(
                        choices=[
                            ("api", "API"),
                            ("admin", "admin"),
                            ("cli", "manage.py"),
                            ("system", "system"),
                        ],
                        max_length=10,
                    ),
                ),
                (
                    "api_key_prefix",
                    models.CharField(
                        blank=True,
                        help_text="The key's public prefix when the source is api.",
                        max_length=16,
                    ),
                ),
                (
                    "action",
                    models.CharField(help_text="<object>.<verb>, e.g. job.cancel.", max_length=64),
                ),
                ("object_type", models.CharField(max_length=40)),
                (
                    "object_id",
                    models.CharField(help_text="Public id, name or key prefix.", max_length=150),
                ),
                ("object_repr", models.CharField(blank=True, max_length=200)),
                ("project_id", models.BigIntegerField(blank=True, null=True)),
                ("project_slug", models.CharField(blank=True, max_length=100)),
                (
                    "changes",
                    models.JSONField(
                        blank=True,
                        default=dict,
                        help_text='{"field": {"from": before, "to": after}}; secrets only as "set"/"rotated".',
                    ),
                ),
            ],
            options={
                "verbose_name_plural": "audit entries",
                "indexes": [
                    models.Index(fields=["object_type", "object_id", "-id"], name="audit_object"),
                    models.Index(fields=["action", "-id"], name="audit_action"),
                    models.Index(fields=["project_slug", "-id"], name="audit_project"),
                    models.Index(fields=["actor", "-id"], name="audit_actor"),
                ],
            },
        ),
        migrations.RunPython(triggers_up, triggers_down),
    ]
