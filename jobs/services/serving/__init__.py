"""Inference: servers that answer vLLM's API (``servers``) and the deployments of succeeded
jobs' adapters on them (``deployments``)."""
