"""Exit codes and messages of the CLI, against a scripted server on loopback (fast; the same
flows against the real server are in test_live.py)."""

from __future__ import annotations

import json
import socket
import stat
from pathlib import Path

from tests.cli._fake_api import Reply, fake_api
from trainhub_cli.errors import ExitCode

KEY = "th-cli-test-secret-key-0123456789abcdefghijklmnop"
JOBS = "/api/v1/fine_tuning/jobs"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_login_saves_the_key_0600_and_never_prints_it(run_cli, cli_env, tmp_path) -> None:
    with fake_api() as api:
        api.on("GET", JOBS, Reply.json({"object": "list", "data": [], "has_more": False}))
        result = run_cli("login", "--url", api.url + "/v1/", "--api-key-stdin", input=KEY + "\n")
        shown = run_cli("config")
        shown_json = run_cli("--json", "config")
    assert result.exit_code == 0, result.output
    path = Path(cli_env["XDG_CONFIG_HOME"]) / "trainhub" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert json.loads(path.read_text()) == {"url": api.url, "api_key": KEY}
    assert api.seen[0][2]["Authorization"] == f"Bearer {KEY}"  # verified with the key
    for output in (result.output, shown.output, shown_json.output):
        assert KEY not in output and KEY[:12] not in output
    assert json.loads(shown_json.stdout)["api_key"] == "set (from the config file)"
    logout = run_cli("logout")
    assert logout.exit_code == 0 and not path.exists()


def test_a_refused_key_exits_with_the_auth_code_and_saves_nothing(run_cli, cli_env) -> None:
    refused = {"error": {"message": "Invalid or revoked API key.", "type": "authentication_error",
                         "param": None, "code": "authentication_failed"}}  # fmt: skip
    with fake_api() as api:
        api.on("GET", JOBS, Reply.json(refused, 401))
        login = run_cli("login", "--url", api.url, "--api-key-stdin", input="th-wrong\n")
        listed = run_cli("--json", "jobs", "list", env={"TRAINHUB_URL": api.url,
                                                        "TRAINHUB_API_KEY": "th-wrong"})  # fmt: skip
    assert login.exit_code == ExitCode.AUTH, login.output
    assert "Invalid or revoked API key" in login.stderr and "th-wrong" not in login.output
    assert not (Path(cli_env["XDG_CONFIG_HOME"]) / "trainhub" / "config.json").exists()
    assert listed.exit_code == ExitCode.AUTH
    assert json.loads(listed.stdout) == refused  # --json: the API's error object as it came


def test_no_key_at_all_is_an_auth_error(run_cli) -> None:
    result = run_cli("jobs", "list", env={"TRAINHUB_URL": "http://127.0.0.1:9"})
    assert result.exit_code == ExitCode.AUTH
    assert "trainhub login" in result.stderr


def test_an_unreachable_server_exits_with_the_network_code(run_cli) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    env = {"TRAINHUB_URL": url, "TRAINHUB_API_KEY": KEY}
    result = run_cli("files", "list", env=env)
    as_json = run_cli("files", "list", "--json", env=env)
    assert result.exit_code == ExitCode.NETWORK, result.output
    assert "could not connect" in result.stderr and url in result.stderr
    assert KEY not in result.output
    assert as_json.exit_code == ExitCode.NETWORK
    assert json.loads(as_json.stdout)["error"]["type"] == "network_error"


def test_an_api_refusal_names_its_param(run_cli) -> None:
    refusal = {"error": {"message": "hyperparameters.learning_rate: must be > 0", "type":
                         "invalid_request_error", "param": "hyperparameters.learning_rate",
                         "code": "invalid_value"}}  # fmt: skip
    with fake_api() as api:
        api.on("POST", JOBS, Reply.json(refusal, 400))
        env = {"TRAINHUB_URL": api.url, "TRAINHUB_API_KEY": KEY}
        args = ("jobs", "create", "--model", "acme/x", "--training-file", "file-abc", "--lr", "-1")
        result = run_cli(*args, env=env)
        as_json = run_cli("--json", *args, env=env)
    assert result.exit_code == ExitCode.API
    assert "param: hyperparameters.learning_rate" in result.stderr
    assert json.loads(as_json.stdout) == refusal


def test_a_bad_flag_is_a_usage_error(run_cli) -> None:
    result = run_cli(
        "jobs", "create", "--model", "m", "--training-file", "file-x", "--adapter", "lorax"
    )
    assert result.exit_code == ExitCode.USAGE
    assert "--adapter" in result.stderr


def test_watching_a_job_that_fails_exits_10_by_polling(run_cli) -> None:
    job = {"id": "ftjob-f", "object": "fine_tuning.job", "status": "running", "metrics": None}
    failed = {**job, "status": "failed", "error": {"code": "oom", "message": "CUDA out of memory",
                                                   "param": None}}  # fmt: skip
    not_here = {"error": {"message": "stream=true is served by the stream process, at "
                          "(TRAINHUB_STREAM_URL is not set): connect there with the same path "
                          "and key.", "type": "invalid_request_error", "param": "stream",
                          "code": "stream_not_served_here"}}  # fmt: skip

    def event(n: int, kind: str, data: dict, message: str = "") -> dict:
        return {"id": f"ftevent-f-{n}", "object": "fine_tuning.job.event", "type": kind,
                "data": data, "message": message, "attempt": None, "level": "info"}  # fmt: skip

    events = [
        event(1, "metrics", {"step": 1, "total_steps": 4, "loss": 2.5}),
        event(2, "log", {}, "epoch 1"),
        event(3, "error", {}, "CUDA out of memory"),
        event(4, "status", {"status": "failed"}),
    ]
    with fake_api() as api:
        api.on("GET", f"{JOBS}/ftjob-f", [Reply.json(job), Reply.json(failed)])
        api.on("GET", "/api/v1/jobs/ftjob-f/events", [
            Reply.json(not_here, 400),
            Reply.json({"object": "list", "data": events, "has_more": False}),
        ])  # fmt: skip
        env = {"TRAINHUB_URL": api.url, "TRAINHUB_API_KEY": KEY}
        result = run_cli("jobs", "watch", "ftjob-f", "--interval", "0.2", env=env)
    assert result.exit_code == ExitCode.JOB_FAILED, result.output
    assert "polling" in result.stderr
    assert "step 1/4" in result.stderr and "CUDA out of memory" in result.output
    assert "oom" in result.stdout


def test_watch_exit_codes_of_finished_jobs(run_cli) -> None:
    with fake_api() as api:
        env = {"TRAINHUB_URL": api.url, "TRAINHUB_API_KEY": KEY}
        codes = {}
        for status in ("succeeded", "cancelled", "paused"):
            api.on(
                "GET",
                f"{JOBS}/ftjob-{status}",
                Reply.json({"id": f"ftjob-{status}", "status": status}),
            )
            result = run_cli("--json", "jobs", "watch", f"ftjob-{status}", env=env)
            codes[status] = result.exit_code
            assert json.loads(result.stdout)["status"] == status
    assert codes == {
        "succeeded": 0,
        "cancelled": ExitCode.JOB_CANCELLED,
        "paused": ExitCode.JOB_PAUSED,
    }
