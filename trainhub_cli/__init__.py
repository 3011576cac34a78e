"""``trainhub``: the command-line client of trainhub's HTTP API.

A client only: it speaks HTTP to the web process (and SSE to the stream process) and imports
nothing of the server (no Django, ``jobs``, ``trainhub`` or ``providers``), so it installs on a
laptop with its own few dependencies (requirements/cli.txt). Usage: docs/CLI.md.
"""

__version__ = "0.1.0"
