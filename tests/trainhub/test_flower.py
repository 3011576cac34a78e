"""trainhub.flower, the launcher of Procfile's ``flower``: which logins it accepts, the login it
generates when none is given, where it listens, and a refusal that starts nothing. Flower
itself answering 401 without the login is tests/security/test_operations.py."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from devsupport.processes import free_port
from trainhub import flower

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("", "is empty"),
        (" , ", "is empty"),
        ("admin", "entry 1 is not user:password"),
        (":a-long-enough-password", "entry 1 is not user:password"),
        ("admin:short", "entry 1 (user 'admin') has a password shorter than 12"),
        ("ops:a-long-enough-password,dev:pw", "entry 2 (user 'dev') has a password shorter"),
    ],
)
def test_a_missing_malformed_or_weak_login_is_refused_saying_which(value: str, why: str) -> None:
    with pytest.raises(flower.FlowerConfigError, match="FLOWER_BASIC_AUTH") as info:
        flower.check_basic_auth(value)
    assert why in str(info.value)


def test_good_logins_pass_as_given() -> None:
    value = "ops:a-long-enough-password,dev:another-long-one"
    assert flower.check_basic_auth(value) == value
    assert flower.basic_auth({"FLOWER_BASIC_AUTH": value}, Path("/nonexistent")) == (
        value,
        "FLOWER_BASIC_AUTH",
    )


def test_without_one_a_login_is_generated_once_owner_only_and_reused(tmp_path: Path) -> None:
    first, where = flower.basic_auth({}, tmp_path / "var")
    again, _ = flower.basic_auth({}, tmp_path / "var")
    path = tmp_path / "var" / flower.CREDENTIALS_FILE
    assert first == again == path.read_text().strip()
    user, _, password = first.partition(":")
    assert user == flower.GENERATED_USER and len(password) >= flower.MIN_PASSWORD_CHARS
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert str(path) in where and password not in where


def test_it_listens_on_loopback_unless_told_otherwise() -> None:
    assert flower.listen_address({}) == "127.0.0.1"
    assert flower.listen_address({"FLOWER_ADDRESS": "10.0.0.5"}) == "10.0.0.5"
    assert flower.is_loopback("127.0.0.1") and flower.is_loopback("::1")
    assert not flower.is_loopback("0.0.0.0") and not flower.is_loopback("10.0.0.5")  # noqa: S104
    command = flower.flower_command("127.0.0.1", 5555, ["--persistent=True"])
    assert command[-3:] == ["--address=127.0.0.1", "--port=5555", "--persistent=True"]
    assert not [a for a in command if "auth" in a], "the login never goes on the command line"


def test_a_weak_login_starts_nothing(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWER_", "TRAINHUB_"))}
    env.update(
        FLOWER_BASIC_AUTH="admin:admin",
        FLOWER_PORT=str(port),
        TRAINHUB_VAR_DIR=str(tmp_path / "var"),
    )
    done = subprocess.run(
        [sys.executable, "-m", "trainhub.flower"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "not starting" in done.stderr and "shorter than 12 characters" in done.stderr
    assert not (tmp_path / "var" / flower.CREDENTIALS_FILE).exists()
