"""Static files as the Procfile's ``web`` command serves them (gunicorn, DEBUG off, no
``collectstatic``): the admin's stylesheets and the API docs' scripts answer 200 from the web
process itself, and the docs pages load nothing from a CDN (they work offline)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
import requests

from devsupport.processes import free_port
from devsupport.readiness import wait_http_ready
from tests.support.processes import ROOT, procfile_command


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory):
    port = free_port()
    log = tmp_path_factory.mktemp("web") / "gunicorn.log"
    env = {**os.environ, "TRAINHUB_DEBUG": "0"}
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [*procfile_command("web", port), "--workers", "1"],
            cwd=ROOT, env=env, stdout=sink, stderr=sink,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ready(f"{base}/static/admin/css/base.css", timeout=90, proc=proc, log=log)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _assets(html: str) -> list[str]:
    return re.findall(r'(?:src|href)="([^"]+\.(?:js|css|png))"', html)


def test_the_admin_login_page_and_its_stylesheets_answer_200(web: str) -> None:
    page = requests.get(f"{web}/admin/login/", timeout=10)
    assert page.status_code == 200
    assert "trainhub operations" in page.text  # not "Django administration"
    sheets = [a for a in _assets(page.text) if a.endswith(".css")]
    assert sheets, page.text[:500]
    for sheet in sheets:
        resp = requests.get(f"{web}{sheet}", timeout=10)
        assert resp.status_code == 200, sheet
        assert resp.headers["Content-Type"].startswith("text/css"), sheet


@pytest.mark.parametrize("path", ["/api/docs/", "/api/redoc/"])
def test_the_api_docs_load_their_scripts_from_this_server(web: str, path: str) -> None:
    page = requests.get(f"{web}{path}", timeout=10)
    assert page.status_code == 200
    assets = _assets(page.text)
    scripts = [a for a in assets if a.endswith(".js")]
    assert scripts, page.text[:500]
    assert all(a.startswith("/static/") for a in assets), assets  # no CDN
    assert "cdn." not in page.text and "unpkg" not in page.text
    for script in scripts:
        resp = requests.get(f"{web}{script}", timeout=10)
        assert resp.status_code == 200, script
        assert "javascript" in resp.headers["Content-Type"], script
        assert len(resp.content) > 10_000, script  # the real bundle, not a stub


def test_a_missing_static_file_is_a_404(web: str) -> None:
    assert requests.get(f"{web}/static/admin/css/nope.css", timeout=10).status_code == 404
