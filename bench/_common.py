"""Shared by the benchmarks: the throwaway database each drops and recreates on every run,
and the line that says which machine and code a figure comes from."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql


def bench_database_url(cli: str | None, *, env: str, name: str) -> str:
    """``--database-url``, else ``$env``, else DATABASE_URL's server with the database
    ``name``, else ``name`` on 127.0.0.1."""
    if cli:
        return cli
    if os.environ.get(env):
        return os.environ[env]
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        return urlunsplit(urlsplit(url)._replace(path="/" + name))
    return f"postgres://postgres@127.0.0.1:5432/{name}"


def database_recreate(url: str) -> str:
    """Drop and create the bench database; returns the server's version line."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        row = conn.execute("SELECT version()").fetchone()
    return str(row[0]).split(" on ")[0] if row else "PostgreSQL"


def machine(root: Path) -> str:
    """CPUs, CPU model, Python and the code's ``git describe``."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty"],  # noqa: S607
            cwd=root, capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    return f"{os.cpu_count()} CPUs ({cpu}); Python {platform.python_version()}" + (
        f"; code at {commit}" if commit else ""
    )
