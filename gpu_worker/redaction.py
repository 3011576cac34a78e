"""Secrets out of text the executor turns into events: its captured log lines.

A :class:`Redactor` replaces with ``***``:

* the values of the secrets this executor knows: the environment variables the spec names in
  ``secrets`` (the hub token), the attempt's report token, any variable whose name says it holds
  a secret (``*_TOKEN``, ``*_KEY``, ``*PASSWORD*``…), and the query parameters of the spec's
  signed URLs (they are credentials even without the URL around them);
* query strings of URLs (``https://bucket/key?X-Amz-Signature=…`` → ``https://bucket/key?***``)
  and of bare paths (``PUT /transfer/?t=…``), the way ``gpu_worker.transfer.redact`` strips them;
* ``Authorization:`` / ``Bearer …`` values, passwords in URLs, and tokens recognisable by shape
  (Hugging Face ``hf_…``, AWS access key ids).

Known values are replaced first, then the patterns, so a secret inside a URL goes either way.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlsplit

if TYPE_CHECKING:
    from trainhub_contract.spec import JobSpec

MASK = "***"
# Shorter values are not treated as secrets: masking every "1" or "true" would shred the text.
MIN_SECRET_CHARS = 8
# Environment variables whose value is a secret by their name (besides those the spec names).
_SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSW(OR)?D|API_?KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL|AUTH", re.IGNORECASE
)
# The attempt's own report token is always a secret, whatever else the environment holds.
ALWAYS_SECRET_ENV = ("TRAINHUB_REPORT_TOKEN", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")

_PATTERNS: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    # user:password@ in a URL
    (re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@"), rf"\1{MASK}@"),
    # the query string of a URL (scheme://…?…) or of a path (/…?…)
    (
        re.compile(r"""((?:\b[a-zA-Z][a-zA-Z0-9+.-]*://|/)[^\s?#'"<>]*)\?[^\s'"<>)\]}]+"""),
        rf"\1?{MASK}",
    ),
    # Authorization / Proxy-Authorization headers, in HTTP dumps, dict reprs and JSON
    (
        re.compile(
            r"""(\b(?:proxy-)?authorization['"]?\s*[:=]\s*['"]?)(?:(bearer|basic|token)\s+)?[^\s'",}]+""",
            re.IGNORECASE,
        ),
        lambda m: f"{m[1]}{m[2] + ' ' if m[2] else ''}{MASK}",
    ),
    (re.compile(r"\b(bearer)\s+[A-Za-z0-9._~+/=-]{6,}", re.IGNORECASE), rf"\1 {MASK}"),
    # credentials as key=value outside a query string
    (
        re.compile(
            r"""(\b(?:x-amz-signature|x-amz-credential|x-amz-security-token|signature|sig|"""
            r"""access_token|refresh_token|api_key|apikey|password|passwd|secret|token)"""
            r"""['"]?\s*[=:]\s*['"]?)[^\s&'",;}]{4,}""",
            re.IGNORECASE,
        ),
        rf"\1{MASK}",
    ),
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), f"hf_{MASK}"),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), MASK),
)


class Redactor:
    """``redactor(text)``: ``text`` with known secret values and credential patterns masked."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = sorted(
            {s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_CHARS},
            key=len,
            reverse=True,  # the longest first, so a secret containing another goes whole
        )
        self._values = re.compile("|".join(map(re.escape, values))) if values else None

    def __call__(self, text: str) -> str:
        if self._values is not None:
            text = self._values.sub(MASK, text)
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
        return text


def secret_values(spec: JobSpec | None, environ: Mapping[str, str] | None = None) -> list[str]:
    """Every secret value this executor knows of (see the module docstring)."""
    env = os.environ if environ is None else environ
    names = set(ALWAYS_SECRET_ENV) | {n for n in env if _SECRET_NAME.search(n)}
    if spec is not None:
        names |= set(spec.secrets.values())
    values = [env[n] for n in names if env.get(n)]
    if spec is not None:
        urls = [spec.dataset.url, spec.outputs.artifact_url, spec.outputs.checkpoint_url]
        urls += [spec.outputs.resume_url or ""]
        urls += [spec.validation_dataset.url if spec.validation_dataset else ""]
        for url in urls:
            query = urlsplit(url).query
            if query:
                values.append(query)
                values += [v for _, v in parse_qsl(query, keep_blank_values=True)]
    return values
