"""Fakes of outside services that tests and benchmarks talk to over real sockets on loopback."""
