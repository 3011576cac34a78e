"""Exit codes and the one error type every command raises; shown by ``trainhub_cli.main``."""

from __future__ import annotations

import enum
from typing import Any


class ExitCode(enum.IntEnum):
    """What ``trainhub`` exits with (listed in ``trainhub --help`` and docs/CLI.md)."""

    OK = 0
    UNEXPECTED = 1  # a bug or an unexpected answer: please report it
    USAGE = 2  # a bad command line (Click's own code for usage errors)
    API = 3  # the API refused the request (400, 404, 409, 429, 5xx…): its message and param
    AUTH = 4  # no API key, or the API refused it (401) or the action (403)
    NETWORK = 5  # the server could not be reached (refused, DNS, TLS, timeout), a cut stream
    INTEGRITY = 6  # a download failed its SHA-256 / manifest check, or its archive is unsafe
    DATASET_INVALID = 7  # an uploaded file failed validation (its line-numbered errors shown)
    TIMEOUT = 8  # --timeout ran out while waiting (the job or file goes on)
    JOB_FAILED = 10  # jobs watch / create --watch: the job failed
    JOB_CANCELLED = 11  # … the job was cancelled
    JOB_PAUSED = 12  # … the job was paused (resume it, then watch again)
    INTERRUPTED = 130  # Ctrl-C (what was started on the server goes on)


EXIT_CODES_HELP = """\b
Exit codes:
  0   success (jobs watch: the job succeeded)
  1   unexpected error
  2   usage error (bad command line)
  3   API error: the API refused the request (its message and param are shown)
  4   authentication error: no API key, or the key or the action was refused (401/403)
  5   network error: the server could not be reached (or an answer's stream was cut)
  6   integrity error: a download failed verification or its archive is unsafe
  7   the uploaded dataset is invalid (line-numbered errors are shown)
  8   timed out waiting (the job or file goes on)
  10  the watched job failed
  11  the watched job was cancelled
  12  the watched job was paused
  130 interrupted (Ctrl-C)
"""


class CliError(Exception):
    """A failure to report: a message a user can act on, the exit code, and for API errors the
    API's ``param``, ``code`` and the whole error object (printed as-is under ``--json``)."""

    def __init__(
        self,
        message: str,
        exit_code: ExitCode = ExitCode.UNEXPECTED,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.param = param
        self.code = code
        self.status = status
        self.body = body

    def as_json(self) -> dict[str, Any]:
        """The API's ``{"error": {...}}`` when it sent one, else the same shape built here."""
        if self.body is not None:
            return self.body
        kind = {
            ExitCode.AUTH: "authentication_error",
            ExitCode.NETWORK: "network_error",
            ExitCode.INTEGRITY: "integrity_error",
            ExitCode.TIMEOUT: "timeout",
            ExitCode.DATASET_INVALID: "invalid_dataset",
        }.get(self.exit_code, "cli_error")
        return {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        }
