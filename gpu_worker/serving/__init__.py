"""Inference with what a job trained: ``python -m gpu_worker serve``, an embedded server with
vLLM's HTTP API (engine: transformers + PEFT, many adapters on one base; server: the routes)."""
