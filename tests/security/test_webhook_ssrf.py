"""A tenant's webhook URL must not reach what the control plane can reach and the tenant must
not (docs/SECURITY.md, "Outbound webhooks"): loopback, the cloud metadata service, private and
link-local networks, IPv6 spellings of them, names that resolve to them, redirects to them, a
DNS answer that changes between the check and the connection, plain http where it is not
allowed, TLS without verification, another project's endpoint. Each is tried through the real
path (the API, the delivery task) and refused, and nothing reaches the target."""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from jobs import outbound_http, tasks
from jobs.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from jobs.services.core.status import job_transition
from jobs.services.outbound import webhook_endpoints
from jobs.states import JobStatus
from tests.support.webhooks import Receiver, delivery_messages, receiving

BASE = "/api/v1/webhook_endpoints"
FAILED = "fine_tuning.job.failed"
D = WebhookDelivery.Status


def create(api, url: str):
    return api.post(BASE, {"url": url, "event_types": [FAILED]}, format="json")


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("https://127.0.0.1/hook", "loopback"),
        ("https://127.1.2.3:8443/hook", "loopback"),
        ("https://2130706433/hook", "loopback"),  # 127.0.0.1 as one number
        ("https://localhost/hook", "loopback"),  # a name that resolves to 127.0.0.1
        ("https://[::1]/hook", "loopback"),
        ("https://[::ffff:127.0.0.1]/hook", "loopback"),  # IPv4-mapped IPv6
        ("https://[2002:7f00:1::1]/hook", "loopback"),  # 6to4 of 127.0.0.1
        ("https://169.254.169.254/latest/meta-data/", "cloud metadata"),
        ("https://[fd00:ec2::254]/latest/meta-data/", "cloud metadata"),
        ("https://[::ffff:169.254.169.254]/", "cloud metadata"),
        ("https://169.254.10.1/hook", "link-local"),
        ("https://[fe80::1]/hook", "link-local"),
        ("https://10.1.2.3/hook", "private"),
        ("https://172.16.0.9/hook", "private"),
        ("https://192.168.1.1/hook", "private"),
        ("https://[64:ff9b::a01:203]/hook", "private"),  # NAT64 of 10.1.2.3
        ("https://[fd12:3456::1]/hook", "unique-local"),
        ("https://0.0.0.0/hook", "unspecified"),
        ("https://[::]/hook", "unspecified"),
        ("https://224.0.0.1/hook", "multicast"),
        ("https://[ff02::1]/hook", "multicast"),
        ("https://240.0.0.1/hook", "reserved"),
        ("https://100.64.0.1/hook", "non-public"),  # carrier-grade NAT
    ],
)
def test_create_refuses_an_address_webhooks_may_not_reach(api, url: str, kind: str) -> None:
    r = create(api, url)
    assert r.status_code == 400, r.json()
    error = r.json()["error"]
    assert error["param"] == "url" and error["code"] == "invalid_url"
    assert f"a {kind} address" in error["message"]
    assert "TRAINHUB_WEBHOOK_ALLOWED_CIDRS" in error["message"]
    assert not WebhookEndpoint.objects.exists()


def test_http_is_refused_unless_the_operator_allows_it(api, settings) -> None:
    r = create(api, "http://93.184.215.14/hook")
    assert r.status_code == 400 and r.json()["error"]["param"] == "url"
    assert "https://" in r.json()["error"]["message"]
    settings.TRAINHUB_WEBHOOK_ALLOW_HTTP = True
    assert create(api, "http://93.184.215.14/hook").status_code == 201


def test_the_allow_list_admits_exactly_its_networks(api, settings) -> None:
    settings.TRAINHUB_WEBHOOK_ALLOWED_CIDRS = ["10.20.0.0/16"]
    assert create(api, "https://10.20.3.4/hook").status_code == 201
    assert create(api, "https://10.21.3.4/hook").status_code == 400
    assert create(api, "https://169.254.169.254/").status_code == 400
    assert create(api, "https://127.0.0.1/").status_code == 400


@pytest.mark.parametrize(
    "ip",
    ["8.8.8.8", "93.184.215.14", "2606:4700:4700::1111", "2a00:1450:4001:80b::200e"],
)
def test_public_addresses_pass(ip: str) -> None:
    assert outbound_http.address_refusal(ipaddress.ip_address(ip)) is None


# --- at delivery: checked again, pinned, never redirected ---------------------------------------


@pytest.fixture
def loopback_allowed(settings) -> None:
    settings.TRAINHUB_WEBHOOK_ALLOW_HTTP = True
    settings.TRAINHUB_WEBHOOK_ALLOWED_CIDRS = ["127.0.0.0/8"]


def fail_a_job(make_job, sent, capture) -> int:
    """A job fails (committed); returns the one delivery its event queued."""
    with capture(execute=True):
        job_transition(job=make_job(), to=JobStatus.FAILED, error_code="oom")
    [pk] = delivery_messages(sent)
    return pk


def subscribe(project, url: str, receiver: Receiver | None = None) -> WebhookEndpoint:
    endpoint, secret = webhook_endpoints.endpoint_create(
        project=project, data={"url": url, "event_types": [FAILED]}
    )
    if receiver is not None:
        receiver.secrets.append(secret)
    return endpoint


def test_every_delivery_checks_the_address_again(
    project, make_job, sent, django_capture_on_commit_callbacks, settings, loopback_allowed
) -> None:
    """Saved while the operator allowed loopback; the allowance is withdrawn: the next delivery
    is refused before any connection, naming why."""
    with receiving() as receiver:
        url = f"http://localhost:{receiver.port}/hook"
        subscribe(project, url, receiver)
        settings.TRAINHUB_WEBHOOK_ALLOWED_CIDRS = []
        pk = fail_a_job(make_job, sent, django_capture_on_commit_callbacks)
        tasks.deliver_webhook(pk)
    assert receiver.received == []
    attempt = WebhookAttempt.objects.get(delivery_id=pk)
    assert attempt.status_code is None
    assert "localhost resolves to 127.0.0.1, a loopback address" in attempt.error
    settings.TRAINHUB_WEBHOOK_ALLOW_HTTP = False
    WebhookDelivery.objects.filter(pk=pk).update(next_attempt_at=attempt.started_at)
    tasks.deliver_webhook(pk)
    assert "https://" in WebhookDelivery.objects.get(pk=pk).last_error


def test_a_redirect_to_loopback_is_never_followed(
    project, make_job, sent, django_capture_on_commit_callbacks, loopback_allowed
) -> None:
    """The allow-listed receiver answers 302 to an internal address: the delivery fails saying
    so, and the internal address is never contacted."""
    with (
        receiving() as internal,
        receiving(
            default_status=302, headers={"Location": f"http://127.0.0.1:{0}/admin"}
        ) as receiver,
    ):
        receiver.headers["Location"] = f"http://127.0.0.1:{internal.port}/admin"
        subscribe(project, receiver.url, receiver)
        pk = fail_a_job(make_job, sent, django_capture_on_commit_callbacks)
        tasks.deliver_webhook(pk)
    assert len(receiver.received) == 1 and internal.received == []
    delivery = WebhookDelivery.objects.get(pk=pk)
    assert delivery.status == D.PENDING  # a failed try, retried later (to the same URL)
    assert delivery.last_status_code == 302
    assert "redirect (302)" in delivery.last_error and "not followed" in delivery.last_error


def test_the_connection_goes_to_the_address_that_was_checked(
    project, make_job, sent, django_capture_on_commit_callbacks, loopback_allowed, monkeypatch
) -> None:
    """A rebinding DNS server answers the check with an allowed address and any later lookup
    with a forbidden one: the name is looked up once per try and the connection goes to the
    checked address, with the name as Host header."""
    real = socket.getaddrinfo
    lookups: list[str] = []

    def rebinding(host, port, *args, **kwargs):
        if host == "rebind.test":
            lookups.append(host)
            ip = "127.0.0.1" if len(lookups) % 2 else "10.9.9.9"
            return real(ip, port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    with receiving() as receiver:
        subscribe(project, f"http://rebind.test:{receiver.port}/hook", receiver)
        lookups.clear()
        pk = fail_a_job(make_job, sent, django_capture_on_commit_callbacks)
        tasks.deliver_webhook(pk)
    assert lookups == ["rebind.test"]
    [received] = receiver.received
    assert received.headers["host"] == f"rebind.test:{receiver.port}"
    assert received.verified_with
    assert WebhookDelivery.objects.get(pk=pk).status == D.SUCCEEDED


def test_a_name_with_one_forbidden_address_is_refused(monkeypatch, loopback_allowed) -> None:
    real = socket.getaddrinfo

    def mixed(host, port, *args, **kwargs):
        if host == "mixed.test":
            return real("127.0.0.1", port, *args, **kwargs) + real(
                "169.254.169.254", port, *args, **kwargs
            )
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", mixed)
    target = outbound_http.parse_url("https://mixed.test/", allow_http=False)
    with pytest.raises(outbound_http.UrlRefused, match=r"169\.254\.169\.254, a cloud metadata"):
        outbound_http.checked_addresses(target, outbound_http.parse_networks(["127.0.0.0/8"]))


def test_another_projects_deliveries_are_404(api, make_user, make_client) -> None:
    other = make_client(make_user("bob"))
    theirs = other.post(
        BASE, {"url": "https://93.184.215.14/", "event_types": [FAILED]}, format="json"
    ).json()
    assert api.get(f"{BASE}/{theirs['id']}/deliveries").status_code == 404
    assert api.post(f"{BASE}/{theirs['id']}/rotate_secret").status_code == 404
    assert api.delete(f"{BASE}/{theirs['id']}").status_code == 404
    assert WebhookEndpoint.objects.filter(public_id=theirs["id"]).exists()


# --- TLS stays verified on the pinned connection ---------------------------------------------


def _cert(name: str, issuer_key, issuer_name, key, *, ca: bool = False) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture
def tls_receiver(tmp_path: Path) -> Iterator[tuple[int, Path, Path, list[str]]]:
    """An https server on 127.0.0.1 whose certificate names ``localhost``, issued by a test CA;
    yields its port, the CA's PEM, a second CA that did not issue it, and the Host headers seen."""
    pem = serialization.Encoding.PEM

    def new_ca(label: str) -> tuple[object, x509.Name, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, label)])
        cert = _cert(label, key, name, key, ca=True)
        path = tmp_path / f"{label}.pem"
        path.write_bytes(cert.public_bytes(pem))
        return key, name, path

    ca_key, ca_name, ca_pem = new_ca("trainhub test CA")
    _, _, stranger_pem = new_ca("another CA")
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = _cert("localhost", ca_key, ca_name, key)
    (tmp_path / "leaf.pem").write_bytes(
        leaf.public_bytes(pem)
        + key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    hosts: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            hosts.append(self.headers.get("Host", ""))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "leaf.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], ca_pem, stranger_pem, hosts
    finally:
        server.shutdown()
        server.server_close()


def test_tls_is_verified_against_the_urls_host(tls_receiver) -> None:
    port, ca_pem, stranger_pem, hosts = tls_receiver
    allowed = outbound_http.parse_networks(["127.0.0.0/8"])

    def post(host: str, ca: Path) -> outbound_http.Answer:
        target = outbound_http.parse_url(f"https://{host}:{port}/hook", allow_http=False)
        addresses = outbound_http.checked_addresses(target, allowed)
        return outbound_http.post(target, addresses, b"{}", {}, ca_file=str(ca))

    ok = post("localhost", ca_pem)  # pinned to 127.0.0.1, verified as "localhost"
    assert ok.status_code == 200, ok.error
    assert hosts == [f"localhost:{port}"]
    untrusted = post("localhost", stranger_pem)
    assert untrusted.status_code is None and "certificate" in untrusted.error
    wrong_name = post("127.0.0.1", ca_pem)  # the certificate does not name 127.0.0.1
    assert wrong_name.status_code is None and "certificate" in wrong_name.error
    assert len(hosts) == 1
