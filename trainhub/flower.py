"""Flower, the Celery monitor, as trainhub runs it (Procfile ``flower``): ``python -m
trainhub.flower [more Flower options]``.

Flower shows every task with its arguments and can revoke tasks and shut workers down, so it
never runs open: it listens on 127.0.0.1 unless ``FLOWER_ADDRESS`` names another address
(``FLOWER_PORT``, default 5555) and always asks for HTTP basic auth. The credentials are
``FLOWER_BASIC_AUTH`` ("user:password", comma-separated for several users); without it, one
login is generated on first start into ``<var dir>/flower_basic_auth`` (mode 0600) and reused,
and the launcher says where, never what. They reach Flower through its environment (readable
by this user only), not its command line (which every local user can list).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_PORT = 5555
GENERATED_USER = "flower"
CREDENTIALS_FILE = "flower_basic_auth"
MIN_PASSWORD_CHARS = 12


class FlowerConfigError(ValueError):
    """The environment asks for a Flower trainhub will not start (said in one line)."""


def check_basic_auth(value: str) -> str:
    """``value`` (FLOWER_BASIC_AUTH) if every entry is ``user:password`` with a password of at
    least MIN_PASSWORD_CHARS characters; else FlowerConfigError saying which entry is wrong."""
    entries = [e for e in value.split(",") if e.strip()]
    if not entries:
        raise FlowerConfigError("FLOWER_BASIC_AUTH is empty; write user:password.")
    for n, entry in enumerate(entries, 1):
        user, sep, password = entry.partition(":")
        if not sep or not user.strip():
            raise FlowerConfigError(
                f"FLOWER_BASIC_AUTH entry {n} is not user:password (comma-separated for more)."
            )
        if len(password) < MIN_PASSWORD_CHARS:
            raise FlowerConfigError(
                f"FLOWER_BASIC_AUTH entry {n} (user {user!r}) has a password shorter than "
                f"{MIN_PASSWORD_CHARS} characters; Flower can revoke tasks and stop workers."
            )
    return ",".join(entries)


def basic_auth(environ: Mapping[str, str], var_dir: Path) -> tuple[str, str]:
    """The basic-auth value Flower gets and where it came from (for the banner)."""
    given = environ.get("FLOWER_BASIC_AUTH")
    if given is not None:
        return check_basic_auth(given), "FLOWER_BASIC_AUTH"
    from trainhub import embedded

    path = var_dir / CREDENTIALS_FILE
    value = embedded.read_or_create_secret(
        path, lambda: f"{GENERATED_USER}:{secrets.token_urlsafe(24)}"
    )
    return check_basic_auth(value), f"{path} (user {value.partition(':')[0]!r})"


def listen_address(environ: Mapping[str, str]) -> str:
    return environ.get("FLOWER_ADDRESS") or DEFAULT_ADDRESS


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def flower_command(address: str, port: int, extra: Sequence[str] = ()) -> list[str]:
    """Flower on ``address:port`` (the credentials go through the environment)."""
    return [sys.executable, "-m", "celery", "-A", "trainhub", "flower",
            f"--address={address}", f"--port={port}", *extra]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Check the environment, say where Flower listens and where its login is, exec Flower."""
    from trainhub import settings

    environ = dict(os.environ)
    try:
        auth, source = basic_auth(environ, settings.VAR_DIR)
        port = int(environ.get("FLOWER_PORT") or DEFAULT_PORT)
    except (FlowerConfigError, ValueError) as exc:
        print(f"trainhub.flower: not starting: {exc}", file=sys.stderr)
        return 2
    address = listen_address(environ)
    print(f"trainhub.flower: http://{address}:{port}/ (basic auth: {source})", file=sys.stderr)
    if not is_loopback(address):
        print(
            "trainhub.flower: listening beyond loopback; basic auth crosses the network in "
            "clear unless a TLS proxy or Flower's --certfile/--keyfile is in front.",
            file=sys.stderr,
        )
    environ["FLOWER_BASIC_AUTH"] = auth
    command = flower_command(address, port, list(sys.argv[1:] if argv is None else argv))
    os.execvpe(command[0], command, environ)  # noqa: S606 - argv built here
    return 0  # not reached: exec replaces this process


if __name__ == "__main__":
    raise SystemExit(main())
