"""The processes the node agent starts (executors, the serving engine): what they inherit,
and how they are stopped."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess

_PR_SET_PDEATHSIG = 1
# What a child may inherit from the node's environment: never its token or broker URL.
_NODE_SECRETS = ("TRAINHUB_NODE_TOKEN", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND")


def die_with_parent() -> None:
    """In the child before exec: SIGKILL when the thread that started it goes away (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _NODE_SECRETS}


def signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal the child's whole process group (it was started with start_new_session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
