"""The CLI's fixtures: an isolated config home, and the CLI run in-process (Click's runner) or
as the installed console script (``.venv/bin/trainhub``, what a user runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from trainhub_cli.main import app

SCRIPT = Path(sys.executable).with_name("trainhub")


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """None of the CLI's variables from the machine; the config file in this test's folder."""
    for name in ("TRAINHUB_URL", "TRAINHUB_API_KEY", "TRAINHUB_STREAM_URL", "TRAINHUB_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "config-home"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return {"XDG_CONFIG_HOME": str(home), "COLUMNS": "200"}


@pytest.fixture
def run_cli(cli_env: dict[str, str]) -> Callable[..., Result]:
    """``run_cli(*args, env=..., input=...)``: the CLI in this process (Click's runner)."""

    def run(*args: str, env: dict[str, str] | None = None, input: str | None = None) -> Result:
        runner = CliRunner()
        return runner.invoke(app, list(args), env={**cli_env, **(env or {})}, input=input,
                             catch_exceptions=False)  # fmt: skip

    return run


@pytest.fixture
def trainhub(cli_env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``trainhub(*args, env=..., input=...)``: the installed console script, as a user runs it."""
    script = SCRIPT if SCRIPT.exists() else shutil.which("trainhub")
    if script is None:
        pytest.fail("the trainhub console script is not installed: run `make venv`")

    def run(
        *args: str,
        env: dict[str, str] | None = None,
        input: str | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        full = {**os.environ, **cli_env, **(env or {})}
        return subprocess.run(
            [str(script), *args], env=full, input=input, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip

    return run
