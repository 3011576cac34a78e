"""Where the CLI finds its server and key: the environment first, then the config file.

The file is JSON at ``$TRAINHUB_CONFIG``, else ``$XDG_CONFIG_HOME/trainhub/config.json``
(``~/.config/trainhub/config.json``), written by ``trainhub login`` with mode 0600 in a 0700
folder. ``TRAINHUB_URL``, ``TRAINHUB_API_KEY`` and ``TRAINHUB_STREAM_URL`` override it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from trainhub_cli.errors import CliError, ExitCode

DEFAULT_URL = "http://127.0.0.1:8000"
ENV_URL = "TRAINHUB_URL"
ENV_KEY = "TRAINHUB_API_KEY"
ENV_STREAM = "TRAINHUB_STREAM_URL"
ENV_CONFIG = "TRAINHUB_CONFIG"
# What users paste as "the API URL" besides the server's root; the client adds /api/v1 itself.
_API_SUFFIXES = ("/api/v1", "/v1")


@dataclass(frozen=True)
class Settings:
    url: str
    api_key: str | None
    stream_url: str | None
    key_source: str  # "env", "file" or "none": said by `trainhub config`, never the key itself


def config_path() -> Path:
    explicit = os.environ.get(ENV_CONFIG)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "trainhub" / "config.json"


def normalize_url(raw: str, what: str = "--url") -> str:
    """``http(s)://host[:port][/prefix]`` without a trailing slash or an /api/v1 suffix."""
    url = raw.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CliError(
            f"{what}: {raw!r} is not an http:// or https:// URL (e.g. {DEFAULT_URL}).",
            ExitCode.USAGE,
            param=what,
        )
    if parts.query or parts.fragment:
        raise CliError(f"{what}: a server URL takes no query or fragment.", ExitCode.USAGE)
    for suffix in _API_SUFFIXES:
        if url.endswith(suffix):
            url = url.removesuffix(suffix)
            break
    return url


def read_file(path: Path | None = None) -> dict[str, str]:
    path = path or config_path()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise CliError(
            f"Cannot read the config file {path}: {exc}. Fix it or run `trainhub login` again.",
            ExitCode.USAGE,
        ) from None
    if not isinstance(raw, dict):
        raise CliError(f"The config file {path} is not a JSON object.", ExitCode.USAGE)
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}


def load(url_override: str | None = None) -> Settings:
    stored = read_file()
    url = url_override or os.environ.get(ENV_URL) or stored.get("url") or DEFAULT_URL
    env_key = os.environ.get(ENV_KEY)
    key = env_key or stored.get("api_key") or None
    stream = os.environ.get(ENV_STREAM) or stored.get("stream_url") or None
    return Settings(
        url=normalize_url(url),
        api_key=key,
        stream_url=normalize_url(stream, "stream URL") if stream else None,
        key_source="env" if env_key else ("file" if key else "none"),
    )


def write_file(values: dict[str, str], path: Path | None = None) -> Path:
    """Write the config atomically, 0600 from the first byte (never world-readable in between)."""
    path = path or config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".config-", dir=path.parent)  # mkstemp: mode 0600
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(values, fh, indent=2)
            fh.write("\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def remove_file(path: Path | None = None) -> bool:
    path = path or config_path()
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
