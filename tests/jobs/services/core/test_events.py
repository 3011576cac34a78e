"""Job events: public numbering, executor batches stored once, malformed input rejected, and the
caps on what an executor (a node or a rented host, not trusted) can make the control plane
store: an event's data, the routine events of one batch and of one attempt."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import IntegrityError, connection, transaction

from jobs.models import JobEvent, TrainingJob
from jobs.services.core import events as events_module
from jobs.services.core.events import (
    MAX_DECISIVE_PER_BATCH,
    MAX_EVENT_DATA_BYTES,
    MAX_EVENTS_PER_BATCH,
    MAX_MESSAGE_CHARS,
    clean_executor_event,
    event_append,
    events_store,
    events_within_caps,
)
from tests.support.factories import JobEventFactory


def _numbers(job: TrainingJob) -> list[int]:
    return list(
        JobEvent.objects.filter(job=job).order_by("number").values_list("number", flat=True)
    )


@pytest.fixture
def job(make_job) -> TrainingJob:
    return make_job()


def test_append_numbers_are_gap_free_and_follow_the_counter(job) -> None:
    start = len(_numbers(job))
    assert start >= 2, "job_create recorded 'created' and 'queued'"
    first = event_append(job=job, type="log", message="hello", data={"k": 1})
    second = event_append(
        job=job, type="status", level="warning", message="x" * (MAX_MESSAGE_CHARS + 10)
    )

    assert (first.number, second.number) == (start + 1, start + 2)
    assert (first.attempt, first.seq) == (0, first.number)
    assert first.data == {"k": 1}
    assert len(second.message) == MAX_MESSAGE_CHARS and second.level == "warning"
    assert _numbers(job) == list(range(1, start + 3))
    job.refresh_from_db()
    assert job.event_counter == start + 2


def test_store_keeps_executor_seq_and_skips_seen_ones(job) -> None:
    batch = [
        clean_executor_event({"seq": 2, "type": "log", "message": "b"}),
        clean_executor_event({"seq": 1, "type": "log", "message": "a"}),
    ]
    stored = events_store(job=job, attempt=1, events=batch)
    assert [(e.seq, e.message) for e in stored] == [(1, "a"), (2, "b")], "stored in seq order"
    assert stored[1].number == stored[0].number + 1

    assert events_store(job=job, attempt=1, events=batch) == []
    # The same seq from another attempt is a different event.
    assert [e.seq for e in events_store(job=job, attempt=2, events=batch[:1])] == [2]
    assert events_store(job=job, attempt=1, events=[]) == []
    assert _numbers(job) == list(range(1, len(_numbers(job)) + 1))


def test_database_rejects_a_duplicate_attempt_seq(job) -> None:
    events_store(job=job, attempt=1, events=[clean_executor_event({"seq": 0, "type": "log"})])
    with pytest.raises(IntegrityError), transaction.atomic():
        JobEventFactory(job=job, attempt=1, seq=0, number=999, type="log", message="dup")


def test_metrics_keep_only_known_keys(job) -> None:
    events_store(
        job=job,
        attempt=1,
        events=[
            clean_executor_event({"seq": 0, "type": "metrics", "data": {"step": 1, "loss": 3.0}}),
            clean_executor_event({"seq": 1, "type": "log", "message": "between"}),
            clean_executor_event(
                {"seq": 2, "type": "metrics",
                 "data": {"step": 2, "epoch": 0.5, "tokens_per_second": 900.0, "grad_norm": 0.7,
                          "trained_tokens": 2048, "secret": "x"}}
            ),
        ],
    )  # fmt: skip
    job.refresh_from_db()
    assert job.latest_metrics == {
        "step": 2,
        "epoch": 0.5,
        "tokens_per_second": 900.0,
        "grad_norm": 0.7,
    }
    assert job.trained_tokens == 2048


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "text",
        [1, 2],
        {"type": "log"},
        {"seq": None, "type": "log"},
        {"seq": 1.0, "type": "log"},
        {"seq": False, "type": "log"},
        {"seq": -3, "type": "log"},
        {"seq": 1},
        {"seq": 1, "type": "shell"},
        {"seq": 1, "type": "log", "level": "fatal"},
        {"seq": 1, "type": "log", "data": "not a mapping"},
    ],
)
def test_malformed_executor_events_are_rejected(raw) -> None:
    assert clean_executor_event(raw) is None


def test_clean_event_defaults_and_truncation() -> None:
    cleaned = clean_executor_event(
        {"seq": 0, "type": "heartbeat", "message": 42, "extra": "dropped"}
    )
    assert cleaned == {"seq": 0, "type": "heartbeat", "level": "info", "message": "42", "data": {}}
    long = clean_executor_event({"seq": 1, "type": "log", "message": "y" * 9000, "data": None})
    assert long is not None and len(long["message"]) == MAX_MESSAGE_CHARS and long["data"] == {}


# --- caps ----------------------------------------------------------------------------------------


def _data_of_json_size(size: int) -> dict:
    """A data object whose JSON (as the cap measures it) is exactly ``size`` characters."""
    data = {"blob": ""}
    data["blob"] = "x" * (size - len(json.dumps(data)))
    assert len(json.dumps(data)) == size
    return data


def test_event_data_up_to_the_cap_is_kept_and_over_it_is_replaced_by_a_note() -> None:
    at_cap = _data_of_json_size(MAX_EVENT_DATA_BYTES)
    over = _data_of_json_size(MAX_EVENT_DATA_BYTES + 1)

    kept = clean_executor_event({"seq": 0, "type": "log", "message": "m", "data": at_cap})
    dropped = clean_executor_event({"seq": 1, "type": "status", "message": "m", "data": over})

    assert kept is not None and kept["data"] == at_cap
    assert dropped == {
        "seq": 1, "type": "status", "level": "info", "message": "m",
        "data": {"data_dropped": f"over {MAX_EVENT_DATA_BYTES} bytes"},
    }  # fmt: skip


def _cleaned(seq: int, type_: str = "log") -> dict:
    event = clean_executor_event({"seq": seq, "type": type_, "message": f"{type_} {seq}"})
    assert event is not None
    return event


def test_a_batch_within_the_caps_is_kept_whole(job) -> None:
    batch = [_cleaned(i) for i in range(MAX_EVENTS_PER_BATCH)] + [_cleaned(999, "status")]
    assert events_within_caps(job=job, attempt=1, events=batch) == batch


def test_a_batch_keeps_its_first_routine_events_up_to_the_cap_and_every_decisive_one(
    job, caplog
) -> None:
    kinds = ("log", "metrics", "heartbeat", "checkpoint", "artifact")
    routine = [_cleaned(i, kinds[i % 5]) for i in range(700)]
    decisive = [_cleaned(1000, "status"), _cleaned(1001, "error")]  # they move the job
    # Decisive events anywhere in the batch, one after the cap is reached.
    batch = routine[:10] + decisive[:1] + routine[10:] + decisive[1:]

    kept = events_within_caps(job=job, attempt=1, events=batch)

    assert kept == routine[:10] + decisive[:1] + routine[10:MAX_EVENTS_PER_BATCH] + decisive[1:]
    [warning] = [r for r in caplog.records if "over the caps" in r.getMessage()]
    assert f"dropped {700 - MAX_EVENTS_PER_BATCH} of 702" in warning.getMessage()
    assert job.public_id in warning.getMessage()


def test_a_flood_of_status_events_keeps_the_last_few(job) -> None:
    flood = [_cleaned(i, "status") for i in range(MAX_DECISIVE_PER_BATCH + 30)]
    assert events_within_caps(job=job, attempt=1, events=flood) == flood[-MAX_DECISIVE_PER_BATCH:]


def test_the_attempt_cap_counts_what_the_attempt_already_stored(job, monkeypatch) -> None:
    monkeypatch.setattr(events_module, "MAX_EVENTS_PER_ATTEMPT", 10)
    events_store(job=job, attempt=1, events=[_cleaned(i) for i in range(8)])

    batch = [_cleaned(100 + i) for i in range(5)] + [_cleaned(200, "status")]
    kept = events_within_caps(job=job, attempt=1, events=batch)
    assert kept == batch[:2] + batch[-1:]
    events_store(job=job, attempt=1, events=kept)

    full = [_cleaned(300), _cleaned(301, "error"), _cleaned(302, "artifact")]
    assert events_within_caps(job=job, attempt=1, events=full) == full[1:2], (
        "at the cap, only what moves the job is stored"
    )
    assert events_within_caps(job=job, attempt=2, events=batch) == batch, "per attempt"


@pytest.mark.django_db(transaction=True)
def test_concurrent_appenders_get_distinct_gap_free_numbers(make_job) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers are checked on PostgreSQL")
    job = make_job()
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def append(worker: int) -> None:
        try:
            barrier.wait(timeout=10)
            for i in range(5):
                if worker % 2:
                    event_append(job=job, type="log", message=f"w{worker}-{i}")
                else:
                    batch = [clean_executor_event({"seq": worker * 100 + i, "type": "log"})]
                    events_store(job=job, attempt=1, events=batch)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=append, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)

    assert errors == []
    numbers = _numbers(job)
    assert numbers == list(range(1, len(numbers) + 1))
    assert JobEvent.objects.filter(job=job, message__startswith="w").count() == 10
    assert JobEvent.objects.filter(job=job, attempt=1).count() == 10
    job.refresh_from_db()
    assert job.event_counter == numbers[-1]


def test_nul_characters_from_a_machine_are_stripped_before_storing(job) -> None:
    raw = {"seq": 0, "type": "log", "message": "a\x00b", "data": {"k\x00": "v\x00w"}}
    cleaned = clean_executor_event(raw)
    assert cleaned is not None
    assert cleaned["message"] == "ab" and cleaned["data"] == {"k": "vw"}
    [stored] = events_store(job=job, attempt=1, events=[cleaned])
    assert JobEvent.objects.get(pk=stored.pk).data == {"k": "vw"}
