"""An inference server on loopback that answers chat completions in vLLM's shapes (a whole
answer, or SSE chunks with a usage chunk and ``[DONE]``), remembers the bodies it was sent, and
can be told to answer 404 for a model from then on, as a server that unloaded it does."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WORDS = ["Owls ", "are ", "grey."]
USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


@dataclass
class FakeInferenceServer:
    url: str = ""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    gone: set[str] = field(default_factory=set)  # models answered with 404 now


def _handler(state: FakeInferenceServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.bodies.append(body)
            if body["model"] in state.gone:
                error = {"error": {"message": f"The model `{body['model']}` does not exist.",
                                   "type": "NotFoundError", "code": 404}}  # fmt: skip
                return self._whole(404, error)
            if not body.get("stream"):
                message = {"role": "assistant", "content": "".join(WORDS)}
                return self._whole(200, {
                    "id": "c1", "object": "chat.completion", "created": 1, "model": body["model"],
                    "usage": USAGE, "choices": [{"index": 0, "finish_reason": "stop",
                                                 "message": message}],
                })  # fmt: skip
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunks: list[dict[str, Any]] = [
                {"choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]}
                for w in WORDS
            ]
            chunks.append({"choices": [], "usage": USAGE})
            for chunk in chunks:
                chunk |= {"id": "c1", "object": "chat.completion.chunk", "created": 1,
                          "model": body["model"]}  # fmt: skip
                self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
            self._chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")

        def _whole(self, status: int, answer: dict[str, Any]) -> None:
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler


@contextmanager
def fake_inference_server() -> Iterator[FakeInferenceServer]:
    state = FakeInferenceServer()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state.url = f"http://127.0.0.1:{server.server_port}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
