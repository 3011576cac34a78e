"""gunicorn settings for the web process (Procfile ``web``: ``-c python:trainhub.gunicorn_conf``).

Transfer URLs carry their signed token in the query string (``/transfer/?t=…``), like S3
presigned URLs: anyone who reads it can PUT or GET that object until it expires. So no access log
line may hold a query string. The format logs the path alone (``%(U)s``), and the logger class
strips query strings from every atom that could carry one, so an operator's own
``--access-logformat`` (``%(r)s``, ``%(q)s``, ``%({raw_uri}e)s``…) cannot bring it back. Access
logging itself stays the operator's choice (``--access-logfile -`` or GUNICORN_CMD_ARGS).
"""

from __future__ import annotations

from typing import Any

from gunicorn.glogging import Logger

# gunicorn's default, with the request line spelled out without its query string, and no
# Referer (a page's URL, query and all).
access_log_format = '%(h)s %(l)s %(u)s %(t)s "%(m)s %(U)s %(H)s" %(s)s %(b)s "%(a)s"'

# Atoms that hold a URL with its query string, or the query string itself (gunicorn.glogging).
_URL_ATOMS = ("r", "f", "{raw_uri}e", "{request_uri}e", "{http_referer}e", "{referer}i")
_QUERY_ATOMS = ("q", "{query_string}e")


def without_query(text: str) -> str:
    """``text`` (a URL, or a request line ``GET /path?query HTTP/1.1``) without its query
    string."""
    head, sep, rest = text.partition("?")
    if not sep:
        return text
    # Keep what follows the URL in a request line (" HTTP/1.1").
    _, space, tail = rest.partition(" ")
    return head + space + tail


class QuerylessLogger(Logger):  # type: ignore[misc]  # gunicorn ships no type hints
    """gunicorn's logger with every query string taken out of the access-log atoms."""

    def atoms(
        self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any
    ) -> dict[str, Any]:
        atoms: dict[str, Any] = super().atoms(resp, req, environ, request_time)
        for name in _URL_ATOMS:
            if isinstance(atoms.get(name), str):
                atoms[name] = without_query(atoms[name])
        for name in _QUERY_ATOMS:
            if name in atoms:
                atoms[name] = ""
        return atoms


logger_class = QuerylessLogger
