"""Public object ids (``ftjob-…``, ``file-…``): random, URL-safe, never the database key."""

import secrets
import string

_ALPHABET = string.ascii_letters + string.digits


def public_id(prefix: str, length: int = 24) -> str:
    return f"{prefix}-" + "".join(secrets.choice(_ALPHABET) for _ in range(length))


def new_job_id() -> str:
    return public_id("ftjob")


def new_file_id() -> str:
    return public_id("file")


def new_artifact_id() -> str:
    return public_id("artifact")


def new_export_id() -> str:
    return public_id("ftexport")


def checkpoint_id(job_public_id: str, event_number: int) -> str:
    """A stored checkpoint's id: its job and the number of the event that recorded it."""
    return f"ftckpt-{job_public_id.removeprefix('ftjob-')}-{event_number}"
