"""nginx running the shipped front-door config (deploy/nginx.conf) on loopback, for the tests
and the benchmarks: the file as an operator installs it, with only its two upstreams, its
listen address and its access log's path pointed elsewhere."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from devsupport.processes import free_port, wait_for_port

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "deploy" / "nginx.conf"
NGINX_PACKAGE = "nginx"

# What the shipped file says, and what each becomes here.
_WEB, _STREAM = "server 127.0.0.1:8000;", "server 127.0.0.1:8001;"
_LISTEN, _ACCESS_LOG = "listen 80;", "/var/log/nginx/trainhub.access.log"

# The smallest main config around it, every path in the run's own folder (no root needed).
_MAIN = """daemon off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    include {dir}/trainhub.conf;
}}
"""


def nginx_missing_reason() -> str | None:
    if nginx_binary() is None:
        return f"nginx is not installed (apt-get install {NGINX_PACKAGE}; `make services` does as root)"
    return None


def nginx_binary() -> str | None:
    """nginx on PATH, or where Debian puts it (/usr/sbin is not on a plain user's PATH)."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")


def site_config(web: str, stream: str, port: int, access_log: Path) -> str:
    """deploy/nginx.conf with its upstreams at ``web`` and ``stream`` (host:port), listening on
    127.0.0.1:``port``."""
    text = CONFIG.read_text()
    for shipped, here in ((_WEB, f"server {web};"), (_STREAM, f"server {stream};"),
                          (_LISTEN, f"listen 127.0.0.1:{port};"),
                          (_ACCESS_LOG, str(access_log))):  # fmt: skip
        if text.count(shipped) != 1:
            raise RuntimeError(f"{CONFIG} no longer holds {shipped!r} exactly once")
        text = text.replace(shipped, here)
    return text


@dataclass(frozen=True)
class FrontProxy:
    url: str  # http://127.0.0.1:<port>
    pid: int  # nginx's master process (its worker is a child)
    error_log: Path

    def tail(self) -> str:
        return self.error_log.read_text(errors="replace")[-4000:] if self.error_log.exists() else ""


@contextmanager
def front_proxy(
    web: str, stream: str, workdir: Path, timeout: float = 30.0
) -> Iterator[FrontProxy]:
    """nginx with the shipped config in front of ``web`` and ``stream`` (host:port). Its error
    log and access log are in ``workdir``."""
    binary = nginx_binary()
    if binary is None:
        raise RuntimeError(nginx_missing_reason())
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    (workdir / "trainhub.conf").write_text(site_config(web, stream, port, workdir / "access.log"))
    (workdir / "nginx.conf").write_text(_MAIN.format(dir=workdir))
    log = workdir / "error.log"
    argv = [binary, "-p", str(workdir), "-c", str(workdir / "nginx.conf"), "-e", str(log)]
    with (workdir / "stderr.log").open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)  # noqa: S603
    try:
        wait_for_port(port, proc, workdir / "stderr.log", "nginx", timeout)
        yield FrontProxy(f"http://127.0.0.1:{port}", proc.pid, log)
    finally:
        proc.terminate()  # nginx's fast shutdown; its worker goes with it
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
