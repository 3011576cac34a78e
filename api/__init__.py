"""The HTTP edge: the REST API under /api/v1/ and OpenAI's paths under /v1/ (DRF views,
serializers, presenters, auth, errors), the node API, and the live streams (``api.live``)."""
