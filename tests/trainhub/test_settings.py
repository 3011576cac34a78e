"""trainhub.settings as processes read it from the environment: the production switch
(TRAINHUB_PRODUCTION and its companions), the API rate limit, and the embedded default's
private files (trainhub.embedded). Each case starts a fresh interpreter, as a deployment does.
``check --deploy`` being clean with the switch is tests/security/test_operations.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from trainhub import embedded

ROOT = Path(__file__).resolve().parents[2]
SHOWN = [
    "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_PRELOAD",
    "SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE",
    "SECURE_PROXY_SSL_HEADER", "SILENCED_SYSTEM_CHECKS",
]  # fmt: skip
PUBLIC = {"TRAINHUB_PUBLIC_URL": "https://trainhub.example.com"}


def _settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    script = (
        "import json, django; django.setup()\n"
        "from django.conf import settings\n"
        f"print(json.dumps({{n: getattr(settings, n) for n in {SHOWN!r}}}))\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAINHUB_")}
    base.update(DJANGO_SETTINGS_MODULE="trainhub.settings", TRAINHUB_VAR_DIR=str(tmp_path))
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _read(tmp_path: Path, **env: str) -> dict:
    done = _settings(tmp_path, **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_production_switch_turns_on_https_only_cookies_hsts_and_the_redirect(
    tmp_path: Path,
) -> None:
    default = _read(tmp_path)
    production = _read(tmp_path, TRAINHUB_PRODUCTION="1", **PUBLIC)
    assert default == {
        "SECURE_HSTS_SECONDS": 0,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": False,
        "SECURE_HSTS_PRELOAD": False,
        "SECURE_SSL_REDIRECT": False,
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "SECURE_PROXY_SSL_HEADER": None,
        "SILENCED_SYSTEM_CHECKS": [],
    }
    assert production == {
        "SECURE_HSTS_SECONDS": 365 * 24 * 3600,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": False,  # both opt-in: they bind the whole domain
        "SECURE_HSTS_PRELOAD": False,
        "SECURE_SSL_REDIRECT": True,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_PROXY_SSL_HEADER": None,
        "SILENCED_SYSTEM_CHECKS": ["security.W005", "security.W021"],
    }


def test_behind_a_proxy_that_redirects_it_trusts_the_proxy_header_and_does_not_redirect(
    tmp_path: Path,
) -> None:
    shown = _read(
        tmp_path,
        TRAINHUB_PRODUCTION="1",
        TRAINHUB_BEHIND_PROXY="1",
        TRAINHUB_SSL_REDIRECT="0",
        TRAINHUB_HSTS_SECONDS="600",
        TRAINHUB_HSTS_INCLUDE_SUBDOMAINS="1",
        TRAINHUB_PUBLIC_URL="http://ignored-without-the-redirect",
    )
    assert shown["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert shown["SECURE_SSL_REDIRECT"] is False
    assert shown["SECURE_HSTS_SECONDS"] == 600 and shown["SECURE_HSTS_INCLUDE_SUBDOMAINS"]
    assert "security.W008" in shown["SILENCED_SYSTEM_CHECKS"]


@pytest.mark.parametrize("name", ["TRAINHUB_PUBLIC_URL", "TRAINHUB_CONTROL_URL"])
def test_production_refuses_a_plain_http_url_that_nodes_would_be_redirected_from(
    tmp_path: Path, name: str
) -> None:
    env = {**PUBLIC, name: "http://trainhub.example.com"}
    done = _settings(tmp_path, TRAINHUB_PRODUCTION="1", **env)
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and f"{name} ('http://" in done.stderr


def test_production_without_any_public_url_is_refused(tmp_path: Path) -> None:
    done = _settings(tmp_path, TRAINHUB_PRODUCTION="1")  # nodes would use http://127.0.0.1
    assert done.returncode != 0 and "TRAINHUB_CONTROL_URL" in done.stderr


@pytest.mark.parametrize("rate", ["lots", "10", "10/fortnight", "-1/minute", ""])
def test_a_bad_api_rate_limit_is_refused_at_start(tmp_path: Path, rate: str) -> None:
    done = _settings(tmp_path, TRAINHUB_API_RATE_LIMIT=rate)
    assert done.returncode != 0
    assert "TRAINHUB_API_RATE_LIMIT" in done.stderr and "1200/minute" in done.stderr


def test_a_private_dir_is_made_0700_but_an_existing_one_is_left_alone(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    embedded.private_dir(shared / "a" / "b")
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755, "not ours to tighten (think /tmp)"
    for made in (shared / "a", shared / "a" / "b"):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700


def test_an_existing_database_file_keeps_its_content_and_loses_other_access(
    tmp_path: Path,
) -> None:
    database = tmp_path / "db.sqlite3"
    database.write_bytes(b"SQLite format 3\x00 and more")
    database.chmod(0o664)
    Path(f"{database}-wal").write_bytes(b"wal")
    Path(f"{database}-wal").chmod(0o644)
    embedded.private_sqlite_file(database)
    assert database.read_bytes() == b"SQLite format 3\x00 and more"
    assert stat.S_IMODE(database.stat().st_mode) == 0o600
    assert stat.S_IMODE(Path(f"{database}-wal").stat().st_mode) == 0o600
