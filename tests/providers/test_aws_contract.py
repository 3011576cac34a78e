"""The provider contract (tests/providers/test_contract.py) kept by the AWS adapter. boto3 does
not go through ``requests``, so ``responses`` cannot answer it: a small EC2 Query API server
on loopback answers instead, with EC2's XML bodies and error documents, and the real boto3
client (its parser, its standard-mode retries) calls it.

The same promises: a bad key is InvalidCredentials on every verb, throttling and 5xx are
waited out where that is safe, cancelling what EC2 does not know is success, the status map is
total and read through the real parser, and no error repeats the key. One difference, by
design: a launch that failed with a 5xx *is* sent again by boto3, because every repeat carries
the attempt's ClientToken and EC2 answers it with the instance the first one started."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

import pytest

from providers import aws
from providers.base import Handle, LaunchRequest, Offer, RemoteStatus
from providers.errors import (
    InvalidCredentials,
    ProviderError,
    RateLimited,
    TransientProviderError,
)

KEY_ID = "AKIDCONTRACTKEY9B2E4C"
SECRET = "rpa_CONTRACT_SECRET_9b2e4c7a51d3"  # distinctive: it must never appear in an error
INSTANCE = "i-0abc1234def567890"
HANDLE = Handle(f"us-east-1/{INSTANCE}", "trainhub-ftjob-x-a2")
REQUEST = LaunchRequest(
    job_id="ftjob-x",
    attempt=2,
    name="trainhub-ftjob-x-a2",
    max_runtime_seconds=3600,
    gpu={"count": 1},
    ssh_public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIcontract trainhub-ftjob-x-a2",
    offer=Offer(
        target="aws",
        offer_id="g5.xlarge@us-east-1",
        gpu_name="A10G",
        gpu_count=1,
        vram_gb=24.0,
        price_per_hour=1.006,
        region="us-east-1",
    ),
)
NS = 'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"'
# EC2's documented instance states (InstanceState.Name).
DOCUMENTED_STATES = frozenset(
    {"pending", "running", "shutting-down", "terminated", "stopping", "stopped"}
)
STATE_CODES = {
    "pending": 0,
    "running": 16,
    "shutting-down": 32,
    "terminated": 48,
    "stopping": 64,
    "stopped": 80,
}


def error_xml(code: str, message: str = "refused") -> str:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error>'
        f"<Code>{code}</Code><Message>{message}</Message></Error></Errors>"
        "<RequestID>ea966190-f9aa-478e-9ede-example</RequestID></Response>"
    )


def instance_xml(instance_id: str, state: str) -> str:
    return (
        f"<item><instanceId>{instance_id}</instanceId><instanceType>g5.xlarge</instanceType>"
        f"<instanceState><code>{STATE_CODES[state]}</code><name>{state}</name></instanceState>"
        "<ipAddress>203.0.113.7</ipAddress><tagSet>"
        "<item><key>Name</key><value>trainhub-ftjob-x-a2</value></item>"
        "<item><key>trainhub:managed</key><value>true</value></item></tagSet></item>"
    )


def describe_instances(ids: list[str], state: str) -> str:
    items = "".join(instance_xml(i, state) for i in ids)
    reservations = (
        f"<item><reservationId>r-1</reservationId><instancesSet>{items}</instancesSet></item>"
        if ids
        else ""
    )
    return (
        f"<DescribeInstancesResponse {NS}><requestId>1</requestId>"
        f"<reservationSet>{reservations}</reservationSet></DescribeInstancesResponse>"
    )


SUCCESS: dict[str, str] = {
    "DescribeInstances": describe_instances([], "pending"),
    "DescribeImages": (
        f"<DescribeImagesResponse {NS}><requestId>1</requestId><imagesSet><item>"
        "<imageId>ami-0123456789abcdef0</imageId><name>Deep Learning</name>"
        "<rootDeviceName>/dev/sda1</rootDeviceName>"
        "<creationDate>2026-10-01T00:00:00.000Z</creationDate></item></imagesSet>"
        "</DescribeImagesResponse>"
    ),
    "DescribeSecurityGroups": (
        f"<DescribeSecurityGroupsResponse {NS}><requestId>1</requestId><securityGroupInfo>"
        "<item><groupId>sg-0123456789abcdef0</groupId><groupName>trainhub-ssh</groupName>"
        "</item></securityGroupInfo></DescribeSecurityGroupsResponse>"
    ),
    "ImportKeyPair": (
        f"<ImportKeyPairResponse {NS}><requestId>1</requestId>"
        "<keyName>trainhub-ftjob-x-a2</keyName><keyFingerprint>aa:bb</keyFingerprint>"
        "<keyPairId>key-0123456789abcdef0</keyPairId></ImportKeyPairResponse>"
    ),
    "RunInstances": (
        f"<RunInstancesResponse {NS}><requestId>1</requestId><reservationId>r-1"
        f"</reservationId><instancesSet>{instance_xml(INSTANCE, 'pending')}</instancesSet>"
        "</RunInstancesResponse>"
    ),
    "TerminateInstances": (
        f"<TerminateInstancesResponse {NS}><requestId>1</requestId><instancesSet><item>"
        f"<instanceId>{INSTANCE}</instanceId><currentState><code>32</code>"
        "<name>shutting-down</name></currentState><previousState><code>16</code>"
        "<name>running</name></previousState></item></instancesSet>"
        "</TerminateInstancesResponse>"
    ),
    "DeleteKeyPair": (
        f"<DeleteKeyPairResponse {NS}><requestId>1</requestId><return>true</return>"
        "</DeleteKeyPairResponse>"
    ),
}


class FakeEc2(ThreadingHTTPServer):
    """EC2's Query API: each action answers from its script (the last answer repeats), else
    with SUCCESS. Every request is recorded as (action, parameters)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script: dict[str, list[tuple[int, str, str]]] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def answer(self, action: str, status: int, body: str, content_type: str = "text/xml") -> None:
        self.script.setdefault(action, []).append((status, body, content_type))

    def fail(self, action: str, status: int, code: str) -> None:
        self.answer(action, status, error_xml(code))

    def sent(self, action: str) -> list[dict[str, str]]:
        return [params for a, params in self.requests if a == action]

    def next_answer(self, action: str) -> tuple[int, str, str]:
        queue = self.script.get(action)
        if not queue:
            return 200, SUCCESS.get(action, error_xml("InvalidAction")), "text/xml"
        return queue.pop(0) if len(queue) > 1 else queue[0]


class _Handler(BaseHTTPRequestHandler):
    server: FakeEc2

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        params = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
        action = params.get("Action", "")
        self.server.requests.append((action, params))
        status, body, content_type = self.server.next_answer(action)
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake() -> Iterator[FakeEc2]:
    server = FakeEc2()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def build(endpoint: str, max_attempts: int = 3) -> aws.AwsEc2:
    return aws.AwsEc2(
        access_key_id=KEY_ID,
        secret_access_key=SECRET,
        regions=["us-east-1"],
        instance_types=["g5.xlarge"],
        ssh_cidr="203.0.113.0/24",
        ami_id="ami-0123456789abcdef0",
        endpoint_url=endpoint,
        max_attempts=max_attempts,
    )


def call_verb(adapter: aws.AwsEc2, verb: str) -> object:
    if verb == "launch":
        return adapter.launch(REQUEST)
    if verb == "poll":
        return adapter.poll([HANDLE])
    return adapter.cancel(HANDLE)


FIRST_CALL = {
    "launch": "DescribeInstances",
    "poll": "DescribeInstances",
    "cancel": "TerminateInstances",
}


def raised(error: type[Exception], call: Any) -> Exception:
    with pytest.raises(error) as info:
        call()
    text = f"{info.value} {info.value!r} {getattr(info.value, 'message', '')}"
    assert SECRET not in text
    return info.value


# --- credentials --------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["launch", "poll", "cancel"])
@pytest.mark.parametrize(
    ("status", "code"),
    [(401, "AuthFailure"), (403, "UnauthorizedOperation"), (400, "OptInRequired")],
)
def test_a_bad_key_is_invalid_credentials_on_every_verb(
    fake: FakeEc2, verb: str, status: int, code: str
) -> None:
    fake.fail(FIRST_CALL[verb], status, code)
    error = raised(InvalidCredentials, lambda: call_verb(build(fake.url), verb))
    assert isinstance(error, InvalidCredentials) and error.code == code
    assert len(fake.requests) == 1, "a bad key is not retried"


def test_a_bad_key_is_not_swallowed_when_many_attempts_are_polled(fake: FakeEc2) -> None:
    fake.fail("DescribeInstances", 401, "AuthFailure")
    handles = [Handle(f"us-east-1/i-0abc{n}", f"trainhub-ftjob-{n}-a1") for n in range(3)]
    raised(InvalidCredentials, lambda: build(fake.url).poll(handles))


# --- throttling and server errors ---------------------------------------------------------------


def test_throttling_on_poll_is_waited_out_then_the_state_comes_back(fake: FakeEc2) -> None:
    fake.fail("DescribeInstances", 503, "RequestLimitExceeded")
    fake.answer("DescribeInstances", 200, describe_instances([INSTANCE], "running"))
    state = build(fake.url).poll([HANDLE])[HANDLE.instance_id]
    assert state.status is RemoteStatus.RUNNING
    assert len(fake.sent("DescribeInstances")) == 2


def test_a_5xx_on_poll_is_retried_then_succeeds(fake: FakeEc2) -> None:
    fake.fail("DescribeInstances", 500, "InternalError")
    fake.answer("DescribeInstances", 503, "<html>Service Unavailable</html>", "text/html")
    fake.answer("DescribeInstances", 200, describe_instances([INSTANCE], "pending"))
    state = build(fake.url).poll([HANDLE])[HANDLE.instance_id]
    assert state.status is RemoteStatus.PENDING
    assert len(fake.sent("DescribeInstances")) == 3


def test_a_5xx_on_launch_is_maybe_applied_and_every_repeat_carries_the_token(
    fake: FakeEc2,
) -> None:
    fake.fail("RunInstances", 500, "InternalError")
    error = raised(TransientProviderError, lambda: build(fake.url).launch(REQUEST))
    assert isinstance(error, TransientProviderError) and error.maybe_applied
    runs = fake.sent("RunInstances")
    assert len(runs) == 3, "boto3's standard retries: safe, the token dedupes them at EC2"
    token = aws.client_token(REQUEST.name, "g5.xlarge@us-east-1", REQUEST.capacity)
    assert {r["ClientToken"] for r in runs} == {token}


def test_throttling_that_lasts_goes_back_to_the_caller_on_launch(fake: FakeEc2) -> None:
    fake.fail("RunInstances", 503, "RequestLimitExceeded")
    error = raised(RateLimited, lambda: build(fake.url).launch(REQUEST))
    assert isinstance(error, RateLimited) and error.code == "RequestLimitExceeded"


def test_launch_answers_with_the_instance_and_sends_what_ec2_needs(fake: FakeEc2) -> None:
    handle = build(fake.url).launch(REQUEST)
    assert handle == Handle(f"us-east-1/{INSTANCE}", REQUEST.name)
    (run,) = fake.sent("RunInstances")
    assert run["InstanceType"] == "g5.xlarge" and run["KeyName"] == REQUEST.name
    assert run["SecurityGroupId.1"] == "sg-0123456789abcdef0"
    assert run["BlockDeviceMapping.1.DeviceName"] == "/dev/sda1"
    assert run["BlockDeviceMapping.1.Ebs.DeleteOnTermination"] == "true"
    assert run["TagSpecification.1.ResourceType"] == "instance"


# --- cancel -------------------------------------------------------------------------------------


def test_cancel_of_an_instance_ec2_does_not_know_is_success(fake: FakeEc2) -> None:
    fake.fail("TerminateInstances", 400, "InvalidInstanceID.NotFound")
    assert build(fake.url).cancel(HANDLE) is None
    assert len(fake.sent("TerminateInstances")) == 1


def test_cancel_succeeds(fake: FakeEc2) -> None:
    assert build(fake.url).cancel(HANDLE) is None
    assert fake.sent("TerminateInstances") == [
        {"Action": "TerminateInstances", "Version": "2016-11-15", "InstanceId.1": INSTANCE}
    ]
    assert fake.sent("DeleteKeyPair")[0]["KeyName"] == HANDLE.name


# --- the status map -----------------------------------------------------------------------------


def test_the_status_map_is_total() -> None:
    assert set(aws.STATUS_MAP) == DOCUMENTED_STATES
    assert all(isinstance(s, RemoteStatus) for s in aws.STATUS_MAP.values())


@pytest.mark.parametrize("raw", sorted(DOCUMENTED_STATES))
def test_poll_maps_each_raw_status_through_the_real_parser(fake: FakeEc2, raw: str) -> None:
    fake.answer("DescribeInstances", 200, describe_instances([INSTANCE], raw))
    state = build(fake.url).poll([HANDLE])[HANDLE.instance_id]
    assert state.status is aws.STATUS_MAP[raw]


def test_a_2xx_that_is_not_xml_is_a_provider_error_or_unknown(fake: FakeEc2) -> None:
    fake.answer("DescribeInstances", 200, "<html><body>Just a moment...</body></html>", "text/html")
    try:
        states = build(fake.url).poll([HANDLE])
    except ProviderError:
        return
    assert HANDLE.instance_id not in states


# --- the key ------------------------------------------------------------------------------------

FAILURES = {
    "400": (400, "InvalidParameterValue"),
    "403": (403, "UnauthorizedOperation"),
    "500": (500, "InternalError"),
    "503": (503, "RequestLimitExceeded"),
}


@pytest.mark.parametrize("failure", list(FAILURES))
@pytest.mark.parametrize("verb", ["launch", "poll", "cancel"])
def test_no_error_repeats_the_key(fake: FakeEc2, verb: str, failure: str) -> None:
    status, code = FAILURES[failure]
    for action in ("DescribeInstances", "RunInstances", "TerminateInstances"):
        fake.fail(action, status, code)
    try:
        call_verb(build(fake.url, max_attempts=1), verb)
    except ProviderError as exc:
        assert SECRET not in f"{exc} {exc!r} {exc.message} {exc.body}"
        assert KEY_ID not in f"{exc} {exc!r} {exc.message} {exc.body}"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("verb", ["launch", "poll", "cancel"])
def test_a_provider_that_cannot_be_reached_is_transient_and_keyless(verb: str) -> None:
    adapter = build(f"http://127.0.0.1:{_closed_port()}", max_attempts=1)
    try:
        call_verb(adapter, verb)
    except TransientProviderError as exc:
        assert not exc.maybe_applied, "the connection never opened: nothing can have launched"
        assert SECRET not in f"{exc} {exc!r} {exc.message}"
    else:
        assert verb == "poll", "only a poll may leave an attempt out instead of raising"
