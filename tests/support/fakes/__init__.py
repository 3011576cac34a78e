"""Fakes of outside services: a scripted provider adapter registered in-process (adapter.py),
and services that tests and benchmarks talk to over real sockets on loopback (runpod_api.py;
imds.py, EC2's instance metadata service with spot interruption notices per machine)."""
