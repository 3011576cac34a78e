"""The stream process (Procfile ``stream``): live job updates over WebSocket and SSE.

    uvicorn trainhub.asgi:application --port 8001

See api/live/ and docs/ARCHITECTURE.md (Live updates) for why this is its own process.
"""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trainhub.settings")
django.setup()

from channels.routing import ProtocolTypeRouter  # noqa: E402 (after django.setup())

from api.live.routing import StreamHttp, websocket_routes  # noqa: E402

application = ProtocolTypeRouter({"http": StreamHttp(), "websocket": websocket_routes})
