"""devsupport.processes: the sshd check and the port wait say what to do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from devsupport import processes


def test_without_sshd_the_reason_names_the_package_and_the_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(processes, "SSHD", tmp_path / "no-sshd")
    reason = processes.sshd_missing_reason()
    assert reason is not None and "\n" not in reason
    assert "openssh-server" in reason
    assert "sudo apt-get install -y openssh-server" in reason


def test_with_sshd_there_is_no_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "sshd").touch()
    monkeypatch.setattr(processes, "SSHD", tmp_path / "sshd")
    assert processes.sshd_missing_reason() is None


def test_a_process_that_exits_before_listening_is_reported_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "srv.log"
    log.write_text("address already in use\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    proc.wait()
    port = processes.free_port()
    with pytest.raises(RuntimeError) as caught:
        processes.wait_for_port(port, proc, log, "srv", timeout=10)
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message and "exited with 1" in message
    assert str(log) in message and "address already in use" in message
