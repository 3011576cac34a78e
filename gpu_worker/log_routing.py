"""Logging records to one handler, while console handlers stay out of a stdout/stderr capture
(gpu_worker.logcapture): each record is then heard once, as a record, with its level.

* The handler goes on the root logger and on every logger that does not propagate
  (transformers and datasets configure their library loggers so, with their own console
  handler); loggers configured later are found by :meth:`LogRouting.adopt`, which rescans
  when new loggers appear (and every few seconds).
* Console handlers (a ``StreamHandler`` on descriptor 1 or 2) are pointed at ``console``, the
  saved descriptors, so their text reaches the terminal or log file without going through the
  capture again. One that cannot be moved (``logging.lastResort``, which dill installs) leaves
  its logger to the text capture.
* Python warnings become records (``logging.captureWarnings``); a process without any logging
  handler keeps printing warnings, as logging's last resort did.

:meth:`LogRouting.stop` puts everything back.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import IO, Any

_RESCAN_SECONDS = 5.0


class LogRouting:
    def __init__(self, handler: logging.Handler, console: dict[int, IO[str]]) -> None:
        self.handler = handler
        self.console = console  # captured fd -> a text stream writing where it pointed
        self._adopted: list[logging.Logger] = []
        self._swapped: list[tuple[logging.StreamHandler[Any], IO[str]]] = []
        self._added_console: logging.Handler | None = None
        self._warnings_were_captured = False
        self._logger_count = -1
        self._scanned_at = 0.0

    def start(self) -> None:
        if not logging.root.handlers:  # what logging's last resort printed must still print
            self._added_console = logging.StreamHandler(self.console.get(2, sys.stderr))
            self._added_console.setLevel(logging.WARNING)
            logging.root.addHandler(self._added_console)
        self._warnings_were_captured = logging._warnings_showwarning is not None  # type: ignore[attr-defined]
        logging.captureWarnings(True)
        logging.root.addHandler(self.handler)
        self.adopt(force=True)

    def adopt(self, *, force: bool = False) -> None:
        """Hear non-propagating loggers; point console handlers past the capture."""
        loggers = logging.Logger.manager.loggerDict
        now = time.monotonic()
        if (
            not force
            and len(loggers) == self._logger_count
            and now - self._scanned_at < _RESCAN_SECONDS
        ):
            return
        self._logger_count, self._scanned_at = len(loggers), now
        candidates = [
            logging.root,
            *(v for v in list(loggers.values()) if isinstance(v, logging.Logger)),
        ]
        for logger in candidates:
            movable = all([self._move_off_capture(h) for h in list(logger.handlers)])
            if (
                logger is not logging.root
                and not logger.propagate
                and movable
                and logger not in self._adopted
            ):
                logger.addHandler(self.handler)
                self._adopted.append(logger)

    def stop(self) -> None:
        logging.root.removeHandler(self.handler)
        for logger in self._adopted:
            logger.removeHandler(self.handler)
        self._adopted.clear()
        for handler, old in self._swapped:
            with contextlib.suppress(Exception):
                handler.setStream(old)
        self._swapped.clear()
        if self._added_console is not None:
            logging.root.removeHandler(self._added_console)
            self._added_console = None
        if not self._warnings_were_captured:
            logging.captureWarnings(False)

    def _move_off_capture(self, handler: logging.Handler) -> bool:
        """Point a console handler at the saved descriptor; False if it writes to a captured
        one and cannot be moved."""
        if (
            not self.console
            or not isinstance(handler, logging.StreamHandler)
            or isinstance(handler, logging.FileHandler)
            or handler is self._added_console
            or any(h is handler for h, _ in self._swapped)
        ):
            return True
        fd = _fd_of(handler.stream)
        if fd not in self.console:
            return True
        try:
            old = handler.setStream(self.console[fd])
        except (AttributeError, OSError, ValueError):
            return False
        if old is not None:
            self._swapped.append((handler, old))
        return True


def _fd_of(stream: object) -> int | None:
    try:
        fd = stream.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return None
    return fd if isinstance(fd, int) else None
