"""The process's stdout and stderr, read while they keep going where they went.

:class:`FdTee` points file descriptors 1 and 2 at pipes, so everything written to them is seen:
Python's prints and warnings, tqdm, and native writes from C/C++ libraries (CUDA, tokenizers).
A reader thread per pipe copies every byte unchanged to where the descriptor pointed before
(a terminal, the SSH executor's ``executor.log``, a node's or RunPod's console) and hands the
decoded text to ``on_text(stream, text)``. :meth:`FdTee.stop` points the descriptors back, so
what is written afterwards (the CLI's JSON summary) never goes through a pipe.

A reader that fails gives its descriptor back at once: a pipe nobody drains would block every
writer once full (64 KiB).
"""

from __future__ import annotations

import codecs
import contextlib
import os
import select
import sys
import threading
import time
from collections.abc import Callable
from typing import IO

STREAMS = {"stdout": 1, "stderr": 2}
_POLL_SECONDS = 0.2  # how soon a stopped reader notices when a child process holds its pipe


class FdTee:
    """Descriptors 1 and 2 through pipes (see the module docstring). ``console`` maps each
    captured descriptor to a text stream writing where it pointed before (for logging
    handlers that must not write into the capture)."""

    def __init__(self, on_text: Callable[[str, str], None], *, thread_prefix: str = "fdtee-"):
        self.on_text = on_text
        self.thread_prefix = thread_prefix
        self.console: dict[int, IO[str]] = {}
        self._saved: dict[int, int] = {}  # fd -> a duplicate of where it pointed
        self._readers: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._line_buffering: bool | None = None

    def start(self) -> None:
        """Capture both descriptors; raises OSError (having undone what it did) if it cannot."""
        _flush_std()
        with contextlib.suppress(Exception):  # each print reaches the reader at once
            self._line_buffering = bool(getattr(sys.stdout, "line_buffering", False))
            sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        try:
            for name, fd in STREAMS.items():
                saved = os.dup(fd)
                self._saved[fd] = saved
                self.console[fd] = open(  # noqa: SIM115 - closed by close()
                    saved, "w", encoding="utf-8", errors="replace", closefd=False, buffering=1
                )
                read_end, write_end = os.pipe()
                os.dup2(write_end, fd)
                os.close(write_end)
                reader = threading.Thread(
                    target=self._read,
                    args=(name, fd, read_end, saved),
                    name=f"{self.thread_prefix}{name}",
                    daemon=True,
                )
                self._readers.append(reader)
                reader.start()
        except OSError:
            with contextlib.suppress(OSError):
                self.stop(time.monotonic() + 1.0)
            self.close()
            raise

    def stop(self, deadline: float) -> None:
        """Point the descriptors back; the readers copy what is left and end (by ``deadline``)."""
        _flush_std()
        self._stopping.set()
        for fd, saved in list(self._saved.items()):
            os.dup2(saved, fd)  # closes the pipe's last write end here: the reader sees EOF
        if self._line_buffering is not None:
            with contextlib.suppress(Exception):
                sys.stdout.reconfigure(line_buffering=self._line_buffering)  # type: ignore[union-attr]
        for reader in self._readers:
            reader.join(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Release the saved descriptors (after :meth:`stop`)."""
        for stream in self.console.values():
            with contextlib.suppress(Exception):
                stream.close()
        self.console.clear()
        if any(reader.is_alive() for reader in self._readers):
            return  # still copying to them (a stuck reader): leaked rather than reused
        for saved in self._saved.values():
            with contextlib.suppress(OSError):
                os.close(saved)
        self._saved.clear()

    def _read(self, stream: str, fd: int, read_end: int, saved: int) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            while True:
                ready, _, _ = select.select([read_end], [], [], _POLL_SECONDS)
                if not ready:
                    if self._stopping.is_set():  # a child process still holds the pipe
                        break
                    continue
                data = os.read(read_end, 1 << 16)
                if not data:
                    break
                view = memoryview(data)
                with contextlib.suppress(OSError):  # the old destination gone: keep draining
                    while view:
                        view = view[os.write(saved, view) :]
                with contextlib.suppress(Exception):
                    self.on_text(stream, decoder.decode(data))
        finally:
            if not self._stopping.is_set():  # this thread failed: give the descriptor back
                with contextlib.suppress(OSError):
                    os.dup2(saved, fd)
            os.close(read_end)


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
