"""Live job updates for the stream process (trainhub/asgi.py): WebSocket and SSE consumers."""
