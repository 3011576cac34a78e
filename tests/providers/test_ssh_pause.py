"""providers.ssh: a pause written into the run's cancel file over SSH (the real loopback sshd),
which the executor reads as "upload a checkpoint, then stop"."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from providers.ssh import RemoteExecutor
from tests.providers.test_ssh import executor  # noqa: F401 - the ``executor`` fixture
from trainhub_contract.outcomes import StopMode


def test_a_pause_is_written_whole_and_never_downgrades_a_cancel(
    executor: Callable[..., RemoteExecutor],  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> None:
    remote = tmp_path / "remote"
    ex = executor()
    ex.request_stop(pause=True)
    assert not remote.exists(), "before the start: nothing to write into"

    remote.mkdir()
    ex.request_stop(pause=True)
    ex.request_stop(pause=True)  # every poll of a paused job asks again
    assert StopMode.of_file(remote / "cancel") is StopMode.PAUSE
    assert sorted(p.name for p in remote.iterdir()) == ["cancel"], "no temporary file left"

    ex.request_stop()
    ex.request_stop(pause=True)
    assert StopMode.of_file(remote / "cancel") is StopMode.CANCEL
