"""An inference server's streamed chat completions at a fixed pace, every stream at once: the
shape of a batching engine (vLLM on a GPU answers 64 streams together, each a token every few
ms), which the embedded CPU server (one generation at a time) is not. For bench/serve_proxy.py,
section 4: with the engine's queue out of the way, what trainhub adds to each token under 64
concurrent streams is what is left.

Each content chunk carries ``sent_at`` (``time.time()`` as it was written), so a client on the
same machine reads each token's delivery delay off it: what every hop after the server took.
trainhub's relay passes unknown fields of a chunk on unchanged.

    python bench/paced_server.py --port 8200 [--token-ms 50]

HTTP/1.1 with keep-alive (trainhub's relay reuses its connections); ``GET /health``; ``POST
/v1/chat/completions`` (streamed only; ``max_tokens`` tokens, then a usage chunk and
``[DONE]``). The text is the same for every request: ``t0 t1 t2 ...``."""

from __future__ import annotations

import argparse
import asyncio
import json
import time

ROLE = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(body: dict[str, object]) -> bytes:
    return _chunk(f"data: {json.dumps(body)}\n\n".encode())


async def _answer(writer: asyncio.StreamWriter, request: dict[str, object], pace: float) -> None:
    model, tokens = request.get("model"), int(request.get("max_tokens") or 16)  # type: ignore[call-overload]
    base = {"id": "chatcmpl-paced", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model}  # fmt: skip
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
    writer.write(_event({**base, "choices": [ROLE]}))
    start = time.monotonic()
    for i in range(tokens):
        await asyncio.sleep(max(0.0, start + (i + 1) * pace - time.monotonic()))
        choice = {"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}
        writer.write(_event({**base, "choices": [choice], "sent_at": time.time()}))
        await writer.drain()
    usage = {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": 8 + tokens}
    writer.write(_event({**base, "choices": [], "usage": usage}))
    writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pace: float) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            line, *fields = head.decode("latin-1").split("\r\n")
            headers = dict(f.lower().split(": ", 1) for f in fields if ": " in f)
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if line.startswith("GET /health"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            elif line.startswith("POST /v1/chat/completions"):
                await _answer(writer, json.loads(body), pace)
            else:
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass  # the client closed its connection
    finally:
        writer.close()


async def main(port: int, pace: float) -> None:
    server = await asyncio.start_server(
        lambda r, w: _serve(r, w, pace), "127.0.0.1", port, backlog=1024
    )
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--token-ms", type=float, default=50.0, help="ms between a stream's tokens")
    args = ap.parse_args()
    asyncio.run(main(args.port, args.token_ms / 1000))
