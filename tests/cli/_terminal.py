"""The installed ``trainhub`` at a pseudo-terminal, as a person runs it: stdin, stdout and stderr
are the terminal, which is its controlling terminal, so a typed Ctrl-C (``\\x03``) is a SIGINT
from the terminal's line discipline and Ctrl-D at an empty line is end of file."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time

from tests.cli.conftest import SCRIPT

SETTLE = 0.3
# Run in the new session (start_new_session): take the terminal on stdin as the controlling
# one, then become the console script (the same process: the terminal's foreground group).
# SIGINT as a shell gives it: a test run started in the background (``cmd &`` without job
# control) ignores SIGINT, its children inherit that, and Python then never raises
# KeyboardInterrupt.
_TAKE_TERMINAL = (
    "import fcntl, os, signal, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
)


def sigint_as_at_a_shell() -> None:
    """A ``preexec_fn``: SIGINT's default action, whatever the test run inherited."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Terminal:
    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _TAKE_TERMINAL, str(SCRIPT), *args],
            stdin=slave, stdout=slave, stderr=slave, env={**env, "TERM": "dumb"},
            start_new_session=True,
        )  # fmt: skip
        os.close(slave)
        self.output = ""  # everything the terminal showed (echoed typing included)
        self._mark = 0

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: the program ended and closed the terminal
            return False
        self.output += data.decode(errors="replace")
        return bool(data)

    def expect(self, text: str, timeout: float = 60) -> str:
        """Wait until ``text`` shows after what the last expect matched; what showed up to it."""
        deadline = time.monotonic() + timeout
        while text not in self.output[self._mark :]:
            left = deadline - time.monotonic()
            if left <= 0 or (not self._read(min(left, 0.5)) and self.proc.poll() is not None):
                raise AssertionError(f"{text!r} never showed; the terminal showed:\n{self.output}")
        end = self.output.index(text, self._mark) + len(text)
        shown, self._mark = self.output[self._mark : end], end
        return shown

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def at_prompt(self) -> None:
        """Wait for the prompt, and for the program to read: CPython's readline draws the prompt,
        then waits in select(); a Ctrl-C in between is seen only at the next key typed (a
        person is never that quick; a test is)."""
        self.expect(">>> ")
        time.sleep(SETTLE)

    def line(self, text: str) -> None:
        """Type a line once the prompt is there."""
        self.expect(">>> ")
        self.type(text + "\r")

    def finish(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._read(0.2)
        while self._read(0.1):
            pass
        try:
            return self.proc.wait(max(0.0, deadline - time.monotonic()))
        finally:
            self.close()

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill the program if it still runs; close the terminal (again: a no-op)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self.master >= 0:
            os.close(self.master)
            self.master = -1
