"""Development support shared by ``tests/`` and ``bench/``: real helper processes on loopback
(moto's S3 server, an OpenSSH server), free ports, and waiting for a server to be ready.

Never imported by the application (trainhub, jobs, providers, gpu_worker), and it imports
nothing from them or from ``tests/``, so a benchmark can use it without the test suite.
"""
