"""One outbound POST to a URL a tenant chose (webhooks), Django-free and SSRF-checked.

A tenant's URL must not turn the control plane into a proxy into its own network: the scheme
is https (http only where the operator allows it), and every address the host resolves to must
be public (not loopback, link-local, private, unique-local, multicast, reserved, unspecified or
a cloud metadata address) unless it lies in one of the operator's allowed networks. The
connection then goes to an address that was checked (no second lookup a rebinding DNS server
could answer differently), with the URL's host as TLS server name, certificate hostname and
``Host`` header; TLS verification stays on. Redirects are never followed. Time is bounded
(connect 5 s, everything 10 s, enforced by a watchdog that closes the socket, so a receiver
that drips bytes cannot hold a worker), and only the first KiB of the answer is read.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import certifi
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.util.ssl_match_hostname import CertificateError

CONNECT_TIMEOUT_SECONDS = 5.0
TOTAL_TIMEOUT_SECONDS = 10.0
EXCERPT_BYTES = 1024
MAX_URL_CHARS = 2048
USER_AGENT = "trainhub-webhooks/1"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Cloud metadata services (AWS/GCP/Azure/OpenStack; AWS's IPv6 one): named apart in refusals.
METADATA_ADDRESSES = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)
_UNIQUE_LOCAL = ipaddress.ip_network("fc00::/7")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class UrlRefused(ValueError):
    """The URL is malformed, not allowed, or reaches an address it must not."""


class Unresolvable(UrlRefused):
    """The URL's host has no address now (it may have one later)."""


@dataclass(frozen=True)
class Target:
    scheme: str  # "https" or "http"
    host: str  # lower-case, IDNA-encoded name or IP literal (no brackets)
    port: int
    path: str  # path and query, at least "/"

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


@dataclass(frozen=True)
class Answer:
    """What one POST came to: a status (any, 3xx included) or an error, never both."""

    status_code: int | None
    latency_ms: int
    excerpt: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def parse_networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    """The operator's allowed networks; a bad entry raises ValueError naming it."""
    out = []
    for cidr in cidrs:
        try:
            out.append(ipaddress.ip_network(cidr.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{cidr!r} is not a network (write e.g. 10.0.0.0/8)") from None
    return tuple(out)


def parse_url(url: object, *, allow_http: bool) -> Target:
    """Syntax and scheme only (no lookup)."""
    if not isinstance(url, str) or not url:
        raise UrlRefused("url must be a non-empty string.")
    if len(url) > MAX_URL_CHARS:
        raise UrlRefused(f"url is longer than {MAX_URL_CHARS} characters.")
    if not url.isascii() or not url.isprintable() or " " in url:
        raise UrlRefused(
            "url must be printable ASCII without spaces (percent-encode the path; write an "
            "international domain name in its xn-- form)."
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UrlRefused(f"url is not a valid URL ({exc}).") from None
    scheme = parts.scheme.lower()
    allowed = ("https", "http") if allow_http else ("https",)
    if scheme not in allowed:
        hint = "" if allow_http else " (plain http is not allowed on this server)"
        raise UrlRefused(f"url must start with https://{hint}; got {scheme or 'no'} scheme.")
    if parts.username is not None or parts.password is not None:
        raise UrlRefused(
            "url must not carry a user name or password; authenticate with the signature."
        )
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise UrlRefused("url has no host.")
    path = parts.path or "/"
    return Target(
        scheme=scheme,
        host=host,
        port=port or (443 if scheme == "https" else 80),
        path=f"{path}?{parts.query}" if parts.query else path,
    )


def _embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, Teredo, NAT64), which is where a
    connection to it ends up."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _kind(ip: IPAddress) -> str | None:
    """What makes ``ip`` not a public address, or None if it is one."""
    if ip in METADATA_ADDRESSES:
        return "cloud metadata"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if isinstance(ip, ipaddress.IPv6Address) and ip in _UNIQUE_LOCAL:
        return "unique-local"
    if ip.is_reserved:
        return "reserved"
    if ip.is_private:
        return "private"
    if not ip.is_global:
        return "non-public"
    return None


def address_refusal(ip: IPAddress, allowed: Sequence[Network] = ()) -> str | None:
    """Why ``ip`` may not be reached (a kind of address), or None if it may."""
    embedded = _embedded_ipv4(ip)
    # The IPv4 address inside first: that is where the packets go, and what names the refusal.
    candidates = [ip] if embedded is None else [embedded, ip]
    if any(c.version == n.version and c in n for c in candidates for n in allowed):
        return None
    for candidate in candidates:
        kind = _kind(candidate)
        if kind is not None:
            return kind
    return None


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to, in the resolver's order; socket.gaierror if none."""
    found: list[IPAddress] = []
    for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if ip not in found:
            found.append(ip)
    return found


def checked_addresses(target: Target, allowed: Sequence[Network] = ()) -> list[IPAddress]:
    """Resolve the target's host and check every address (one bad address refuses the URL: a
    name that resolves to a public and a private address is an attack, not a fallback)."""
    try:
        addresses = resolve(target.host, target.port)
    except (socket.gaierror, UnicodeError) as exc:
        raise Unresolvable(f"url: the host {target.host!r} does not resolve ({exc}).") from None
    for ip in addresses:
        kind = address_refusal(ip, allowed)
        if kind is not None:
            named = "" if target.host == str(ip) else f"{target.host} resolves to "
            raise UrlRefused(
                f"url: {named}{ip}, a {kind} address, which webhooks may not reach (an "
                "operator can allow a network with TRAINHUB_WEBHOOK_ALLOWED_CIDRS)."
            )
    if not addresses:
        raise Unresolvable(f"url: the host {target.host!r} has no address.")
    return addresses


def _context(ca_file: str | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca_file or certifi.where())


def _abort_all(connections: list[HTTPConnection]) -> None:
    for conn in connections:
        if conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)  # wakes a read blocked in the worker


class _Watchdog:
    """One thread per process that cuts off POSTs past their deadline (a timer thread per
    POST costs more than the POST on a loopback receiver). It ticks every 0.25 s, so a POST
    lasts at most its total timeout and a tick."""

    TICK = 0.25

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[float, list[HTTPConnection]]] = {}
        self._pid = 0  # the thread does not survive a fork (Celery's prefork children)

    def watch(self, deadline: float, holder: list[HTTPConnection]) -> int:
        with self._lock:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self._watched.clear()
                threading.Thread(target=self._run, name="webhook-watchdog", daemon=True).start()
            token = id(holder)
            self._watched[token] = (deadline, holder)
        return token

    def unwatch(self, token: int) -> None:
        with self._lock:
            self._watched.pop(token, None)

    def _run(self) -> None:
        while True:
            time.sleep(self.TICK)
            now = time.monotonic()
            with self._lock:
                late = [h for deadline, h in self._watched.values() if deadline <= now]
            for holder in late:
                _abort_all(holder)


_watchdog = _Watchdog()


def _connection(target: Target, ip: IPAddress, ca_file: str | None) -> HTTPConnection:
    if target.scheme == "https":
        return HTTPSConnection(
            str(ip),
            target.port,
            timeout=CONNECT_TIMEOUT_SECONDS,
            server_hostname=target.host,
            assert_hostname=target.host,
            ssl_context=_context(ca_file),
        )
    return HTTPConnection(str(ip), target.port, timeout=CONNECT_TIMEOUT_SECONDS)


def _connect(
    target: Target, addresses: Sequence[IPAddress], ca_file: str | None, deadline: float
) -> HTTPConnection:
    """A connection to the first checked address that answers."""
    last: Exception | None = None
    for ip in addresses:
        if time.monotonic() >= deadline:
            break
        conn = _connection(target, ip, ca_file)
        try:
            conn.connect()
            return conn
        except ssl.SSLError:
            conn.close()
            raise  # the server answered: a TLS failure is not a reason to try another address
        except OSError as exc:
            conn.close()
            last = exc
    raise last or TimeoutError("no address answered in time")


def _read_excerpt(conn: HTTPConnection, response: object, deadline: float) -> bytes:
    data = b""
    read1 = response.read1  # type: ignore[attr-defined]
    while len(data) < EXCERPT_BYTES:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if conn.sock is not None:
            conn.sock.settimeout(left)
        chunk = read1(EXCERPT_BYTES - len(data))
        if not chunk:
            break
        data += chunk
    return data[:EXCERPT_BYTES]


def _describe(exc: BaseException, target: Target) -> str:
    where = f"{target.host}:{target.port}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate of {where} not accepted: {exc.verify_message or exc}"
    if isinstance(exc, CertificateError):
        return f"TLS certificate of {where} not accepted: {exc}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake with {where} failed: {exc.reason or exc}"
    if isinstance(exc, TimeoutError | socket.timeout):
        return (
            f"{where} did not answer in time (connect {CONNECT_TIMEOUT_SECONDS:g} s, "
            f"total {TOTAL_TIMEOUT_SECONDS:g} s)"
        )
    if isinstance(exc, ConnectionRefusedError):
        return f"{where} refused the connection"
    name = type(exc).__name__
    return f"{where}: {name}: {exc}"[:500]


def post(
    target: Target,
    addresses: Sequence[IPAddress],
    body: bytes,
    headers: dict[str, str],
    *,
    ca_file: str | None = None,
    total_timeout: float = TOTAL_TIMEOUT_SECONDS,
) -> Answer:
    """POST ``body`` to ``target`` at one of ``addresses`` (already checked): the answer's
    status and first KiB, or what went wrong. Never raises for network or TLS errors."""
    started = time.monotonic()
    deadline = started + total_timeout
    conn: HTTPConnection | None = None
    holder: list[HTTPConnection] = []
    token = _watchdog.watch(deadline, holder)
    try:
        conn = _connect(target, addresses, ca_file, deadline)
        holder.append(conn)
        if conn.sock is not None:
            conn.sock.settimeout(max(0.001, deadline - time.monotonic()))
        conn.request(
            "POST",
            target.path,
            body=body,
            headers={
                **headers,
                "Host": target.host_header,
                "Content-Type": "application/json",
                "User-Agent": USER_AGENT,
            },
            preload_content=False,
            decode_content=False,
        )
        response = conn.getresponse()
        excerpt = _read_excerpt(conn, response, deadline)
        status = int(response.status)
    except Exception as exc:  # every failure is the delivery's error to log, not ours to raise
        late = time.monotonic() >= deadline  # the watchdog closed the socket
        return Answer(None, _ms(started), error=_describe(TimeoutError() if late else exc, target))
    finally:
        _watchdog.unwatch(token)
        if conn is not None:
            conn.close()
    text = excerpt.decode("utf-8", errors="replace")
    error = ""
    if 300 <= status < 400:
        location = response.headers.get("Location", "")
        error = f"redirect ({status}) to {location[:300]!r} not followed; give the final URL"
    elif not 200 <= status < 300:
        error = f"the receiver answered {status}"
    return Answer(status, _ms(started), excerpt=text, error=error)


def _ms(started: float) -> int:
    return max(0, round((time.monotonic() - started) * 1000))
