"""What the relay records of each completion (``InferenceCall``): the caller's project and
model, tokens, time to the first token and in all. It is the project's usage (base models
included) and, summed over a recent window, the admin's requests/s, tokens/s and latency per
model. A deployment also keeps running totals, for its ``models`` entry."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.models import Deployment, InferenceCall

WINDOW_SECONDS = 300


@dataclass(frozen=True)
class CallFacts:
    project_id: int
    model: str
    deployment_pk: int | None
    server_pk: int | None
    streamed: bool
    status_code: int
    first_token_ms: int | None
    duration_ms: int


def _tokens(usage: dict[str, Any] | None, name: str) -> int:
    value = (usage or {}).get(name)
    return max(0, int(value)) if isinstance(value, int) and not isinstance(value, bool) else 0


def calls_record(calls: list[tuple[CallFacts, dict[str, Any] | None]]) -> None:
    """Record completions (each with ``usage`` as its server reported it, if it did): one
    INSERT for all of them and one counter update per deployment, so that a relay busy with
    many answers at once writes them together."""
    now = timezone.now()
    rows: list[InferenceCall] = []
    totals: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])  # requests, prompt, completion
    for facts, usage in calls:
        prompt, completion = _tokens(usage, "prompt_tokens"), _tokens(usage, "completion_tokens")
        rows.append(InferenceCall(
            project_id=facts.project_id, model=facts.model[:500],
            deployment_id=facts.deployment_pk, server_id=facts.server_pk,
            streamed=facts.streamed, status_code=facts.status_code, prompt_tokens=prompt,
            completion_tokens=completion, first_token_ms=facts.first_token_ms,
            duration_ms=facts.duration_ms, created_at=now,
        ))  # fmt: skip
        if facts.deployment_pk is not None and facts.status_code == 200:
            total = totals[facts.deployment_pk]
            total[0], total[1], total[2] = total[0] + 1, total[1] + prompt, total[2] + completion
    with transaction.atomic():
        InferenceCall.objects.bulk_create(rows)
        for pk in sorted(totals):  # one order for every writer: no deadlock between two relays
            requests, prompt, completion = totals[pk]
            Deployment.objects.filter(pk=pk).update(
                requests=F("requests") + requests,
                prompt_tokens=F("prompt_tokens") + prompt,
                completion_tokens=F("completion_tokens") + completion,
                last_used_at=now,
            )


@dataclass(frozen=True)
class ModelTraffic:
    model: str
    requests: int
    errors: int
    requests_per_second: float
    tokens_per_second: float  # completion tokens
    p50_ms: int | None
    p95_ms: int | None
    first_token_p95_ms: int | None


def _percentile(values: list[int], share: float) -> int | None:
    """The nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def traffic(window_seconds: int = WINDOW_SECONDS) -> list[ModelTraffic]:
    """Each model called in the last ``window_seconds``, busiest first."""
    since = timezone.now() - timedelta(seconds=window_seconds)
    rows = InferenceCall.objects.filter(created_at__gte=since).values_list(
        "model", "status_code", "completion_tokens", "duration_ms", "first_token_ms"
    )
    by_model: dict[str, list[tuple[int, int, int, int | None]]] = defaultdict(list)
    for model, code, tokens, duration, first in rows.iterator(chunk_size=2000):
        by_model[model].append((code, tokens, duration, first))
    out = []
    for model, calls in by_model.items():
        ok = [c for c in calls if c[0] == 200]
        durations = [c[2] for c in ok]
        firsts = [c[3] for c in ok if c[3] is not None]
        out.append(
            ModelTraffic(
                model=model,
                requests=len(calls),
                errors=len(calls) - len(ok),
                requests_per_second=len(calls) / window_seconds,
                tokens_per_second=sum(c[1] for c in ok) / window_seconds,
                p50_ms=_percentile(durations, 0.50),
                p95_ms=_percentile(durations, 0.95),
                first_token_p95_ms=_percentile(firsts, 0.95),
            )
        )
    return sorted(out, key=lambda t: (-t.requests, t.model))


def calls_prune() -> int:
    """Delete the records older than TRAINHUB_INFERENCE_CALL_RETENTION_SECONDS; how many."""
    seconds = settings.TRAINHUB_INFERENCE_CALL_RETENTION_SECONDS
    cutoff = timezone.now() - timedelta(seconds=seconds)
    deleted, _ = InferenceCall.objects.filter(created_at__lt=cutoff).delete()
    return deleted
