"""The stream process's periodic checks: one task per process, started with its first user."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


def ensure_running(
    task: asyncio.Task[None] | None, start: Callable[[], Coroutine[Any, Any, None]]
) -> asyncio.Task[None]:
    """``task`` while it runs on this loop; else a new one (it ended, or it belonged to a loop
    that is gone: a test's earlier ``asyncio.run``)."""
    loop = asyncio.get_running_loop()
    if task is not None and not task.done() and task.get_loop() is loop:
        return task
    return loop.create_task(start())
