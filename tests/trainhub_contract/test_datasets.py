"""Dataset detection and streaming validation: line-accurate errors whatever the chunking."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.tiny_model import DEMO_DATASET_PATH
from trainhub_contract import datasets
from trainhub_contract.datasets import (
    MAX_REPORTED_ERRORS,
    DatasetError,
    DatasetReport,
    LineError,
    detect_format,
    estimate_tokens,
    iter_examples,
    validate_jsonl,
    validate_path,
)

CHAT = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}
ALPACA = {"instruction": "Add", "input": "1 2", "output": "3"}
PC = {"prompt": "2+2=", "completion": "4"}
TEXT = {"text": "Once upon a time."}
# OpenAI's DPO line: the conversation so far, then one preferred and one non-preferred reply.
PAIR = {
    "input": {"messages": [{"role": "user", "content": "Hi"}]},
    "preferred_output": [{"role": "assistant", "content": "Hello! How can I help?"}],
    "non_preferred_output": [{"role": "assistant", "content": "What."}],
}


def pair(**changes: Any) -> dict[str, Any]:
    return {**PAIR, **changes}


def jsonl(*records: Any) -> bytes:
    return b"".join(
        (r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in records
    )


def lines_of(report: DatasetReport) -> list[int]:
    return [e.line for e in report.errors]


@pytest.mark.parametrize(
    ("record", "fmt"),
    [
        (CHAT, "messages"),
        (ALPACA, "alpaca"),
        ({"instruction": "x", "output": "y"}, "alpaca"),
        (PC, "prompt_completion"),
        (TEXT, "text"),
        # Precedence: messages > prompt_completion > alpaca > text.
        ({**CHAT, **PC, **ALPACA, **TEXT}, "messages"),
        ({**PC, **ALPACA, **TEXT}, "prompt_completion"),
        ({**ALPACA, **TEXT}, "alpaca"),
        ({"instruction": "x", "text": "t"}, "text"),
        (PAIR, "preference"),
        ({"input": {}, "non_preferred_output": []}, "preference"),  # then its checks explain
        ({"input": {"messages": []}}, "eval"),  # no outputs: an eval item
        ({"instruction": "x", "input": "i", "output": "y"}, "alpaca"),  # input beside output
        ({"prompt": "x"}, None),
        ({}, None),
    ],
)
def test_detect_format(record: dict[str, Any], fmt: str | None) -> None:
    assert detect_format(record) == fmt


EVAL_ITEM = {"input": PAIR["input"], "reference": "Hello"}


@pytest.mark.parametrize("record", [CHAT, ALPACA, PC, TEXT, PAIR, EVAL_ITEM])
def test_each_format_validates(record: dict[str, Any]) -> None:
    report = validate_jsonl([jsonl(record, record)])
    assert report.ok, report.errors
    assert report.format == detect_format(record)
    assert report.example_count == 2
    assert report.token_estimate > 0


def test_demo_file_passes() -> None:
    report = validate_path(DEMO_DATASET_PATH)
    assert report.ok, report.errors
    assert report.format == "messages"
    assert report.example_count == 60
    examples = list(iter_examples(DEMO_DATASET_PATH))
    assert len(examples) == 60
    assert [m["role"] for m in examples[0]["messages"]] == ["system", "user", "assistant"]


def test_broken_file_reports_exact_lines(tmp_path: Path) -> None:
    bad_role = {
        "messages": [{"role": "bot", "content": "x"}, {"role": "assistant", "content": "y"}]
    }
    data = jsonl(CHAT, CHAT, b'{"messages": [', CHAT, bad_role, CHAT, ALPACA, CHAT)
    path = tmp_path / "broken.jsonl"
    path.write_bytes(data)
    report = validate_path(path)
    assert lines_of(report) == [3, 5, 7]
    assert report.error_count == 3
    assert report.example_count == 5
    assert report.format == "messages"
    assert not report.ok
    msgs = [e.message for e in report.errors]
    assert "invalid JSON" in msgs[0] and "column" in msgs[0]
    assert "messages[0].role" in msgs[1] and "bot" in msgs[1]
    assert (
        msgs[2]
        == "line 7 is alpaca but the file started as messages (line 1); use one format per file"
    )
    with pytest.raises(DatasetError) as exc:
        list(iter_examples(path))
    assert exc.value.line == 3


def test_format_is_set_by_first_valid_line() -> None:
    bad_chat = {"messages": []}
    report = validate_jsonl([jsonl(bad_chat, TEXT, CHAT)])
    assert report.format == "text"
    assert lines_of(report) == [1, 3]
    assert "started as text (line 2)" in report.errors[1].message


@pytest.mark.parametrize(
    ("record", "needle"),
    [
        ("[1, 2]", "expected a JSON object"),
        ('"just a string"', "expected a JSON object"),
        ({"foo": 1}, "accepted shapes"),
        ({"messages": "hi"}, "messages must be a non-empty list"),
        ({"messages": []}, "messages must be a non-empty list"),
        ({"messages": ["hi"]}, "messages[0] must be an object"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content must be a string"),
        ({"messages": [{"role": "user", "content": "q"}]}, "at least one assistant"),
        ({"messages": [{"role": "assistant", "content": "  "}]}, "at least one assistant"),
        ({"messages": [{"role": "assistant", "content": "a", "weight": 0}]}, "at least one assistant"),
        ({"messages": [{"role": "assistant", "content": "a", "weight": 2}]}, "messages[0].weight"),
        ({"messages": [{"role": "user", "content": "a", "weight": 1}, {"role": "assistant", "content": "b"}]}, "messages[0].weight"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        ({**CHAT, "tools": "x"}, "tools must be a list"),
        ({"instruction": "", "output": "y"}, "instruction must be a non-empty string"),
        ({"instruction": "x", "output": 1}, "output must be a string"),
        ({"instruction": "x", "output": "y", "input": None}, "input must be a string"),
        ({"prompt": 1, "completion": "y"}, "prompt must be a string"),
        ({"prompt": "x", "completion": ""}, "completion must be a non-empty string"),
        ({"text": ""}, "text must be a non-empty string"),
        ({"text": None}, "text must be a non-empty string"),
        (pair(input=[]), "input must be an object with messages"),
        (pair(input={"messages": []}), "input.messages must be a non-empty list"),
        (pair(input={"messages": [{"role": "bot", "content": "x"}]}), "input.messages[0]"),
        (pair(input={"messages": [{"role": "user", "content": 1}]}), "input.messages[0].content"),
        (pair(input={**PAIR["input"], "system": "x"}), "input.system is not a known field"),
        (pair(input={**PAIR["input"], "tools": {}}), "input.tools must be a list"),
        ({k: v for k, v in PAIR.items() if k != "non_preferred_output"}, "non_preferred_output must be a list of exactly one"),
        (pair(preferred_output=PAIR["preferred_output"] * 2), "preferred_output must be a list of exactly one"),
        (pair(preferred_output={"role": "assistant", "content": "x"}), "preferred_output must be a list"),
        (pair(preferred_output=[{"role": "user", "content": "x"}]), 'preferred_output[0].role must be "assistant"'),
        (pair(non_preferred_output=[{"role": "assistant", "content": " "}]), "non_preferred_output[0].content must be a non-empty string"),
        (pair(preferred_output=[{"role": "assistant", "content": "x", "weight": 1}]), "takes no weight"),
        (pair(non_preferred_output=PAIR["preferred_output"]), "are the same reply"),
        ({"input": PAIR["input"]}, "needs a reference field beside input"),
        ({"input": PAIR["input"], "reference": 4}, "reference must be a string"),
        ({"input": {"messages": "hi"}, "reference": "x"}, "input.messages must be a non-empty list"),
        ('{"text": NaN}', "invalid JSON"),
        ('{"text": "a"', "invalid JSON"),
        ("[" * 100_000, "invalid JSON"),
    ],
)  # fmt: skip
def test_field_errors(record: Any, needle: str) -> None:
    raw = record.encode() if isinstance(record, str) else json.dumps(record).encode()
    report = validate_jsonl([jsonl(raw)])
    line_errors = [e for e in report.errors if e.line]
    assert [e.line for e in line_errors] == [1], report.errors
    assert report.example_count == 0
    assert needle in line_errors[0].message


def test_tolerated_shapes() -> None:
    tool_call = {
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function"}]},
            {"role": "tool", "content": "sunny"},
            {"role": "assistant", "content": "Sunny.", "weight": 1},
        ],
        "tools": [{"type": "function"}],
        "extra_key": "kept",
    }
    report = validate_jsonl([jsonl(tool_call, {"instruction": "x", "output": ""})])
    assert report.example_count == 1
    assert lines_of(report) == [2]  # mixed format, not a field error


def test_error_list_is_capped_but_all_counted() -> None:
    report = validate_jsonl([jsonl(CHAT, *([b"nope"] * 30))])
    assert report.error_count == 30
    assert len(report.errors) == MAX_REPORTED_ERRORS
    assert lines_of(report) == list(range(2, 2 + MAX_REPORTED_ERRORS))
    assert report.example_count == 1


def test_file_level_errors_come_first_and_survive_the_cap() -> None:
    report = validate_jsonl([jsonl(*([b"nope"] * 30))])
    assert report.errors[0] == LineError(0, "the file has 0 valid example(s); at least 1 required")
    assert report.error_count == 31
    assert len(report.errors) == MAX_REPORTED_ERRORS


@pytest.mark.parametrize("data", [b"", b"\n\n  \n", b"\xef\xbb\xbf"])
def test_empty_file(data: bytes) -> None:
    report = validate_jsonl([data])
    assert not report.ok
    assert report.errors == [
        LineError(0, "the file contains no examples (it is empty or only blank lines)")
    ]
    assert report.format is None


def test_min_examples() -> None:
    report = validate_jsonl([jsonl(TEXT, TEXT)], min_examples=3)
    assert lines_of(report) == [0]
    assert "at least 3" in report.errors[0].message
    assert validate_jsonl([jsonl(TEXT, TEXT)], min_examples=2).ok


def test_bom_crlf_no_final_newline_and_blank_lines() -> None:
    data = (
        b"\xef\xbb\xbf" + json.dumps(TEXT).encode() + b"\r\n\r\n   \r\n" + json.dumps(TEXT).encode()
    )
    report = validate_jsonl([data])
    assert report.ok, report.errors
    assert report.example_count == 2
    # Blank lines count for numbering: the bad line below is line 5.
    report = validate_jsonl([data + b"\r\n{bad\r\n"])
    assert lines_of(report) == [5]


def test_invalid_utf8() -> None:
    report = validate_jsonl([jsonl(TEXT) + b'{"text": "caf\xc3"}\n' + b'{"text": "\xff"}\n'])
    assert lines_of(report) == [2, 3]
    assert all("invalid UTF-8" in e.message for e in report.errors)


def test_oversize_line_is_reported_and_skipped() -> None:
    big = json.dumps({"text": "x" * datasets.MAX_LINE_BYTES}).encode()
    chunks = [jsonl(TEXT), big[:1000], big[1000:], b"\n", jsonl(TEXT)]
    report = validate_jsonl(chunks)
    assert lines_of(report) == [2]
    assert f"limit is {datasets.MAX_LINE_BYTES} bytes" in report.errors[0].message
    assert report.example_count == 2


def test_line_limit_boundary() -> None:
    with mock.patch.object(datasets, "MAX_LINE_BYTES", 20):
        exact = b'{"text": "' + b"x" * 8 + b'"}'  # 20 bytes
        assert len(exact) == 20
        assert validate_jsonl([exact + b"\r\n" + exact]).ok
        over = b'{"text": "' + b"x" * 9 + b'"}'
        report = validate_jsonl([exact + b"\n" + over + b"\r\n" + over])
        assert lines_of(report) == [2, 3]
        assert "line is 21 bytes" in report.errors[0].message


def test_iter_examples(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(jsonl(PC, PC) + b"\n")
    assert list(iter_examples(path)) == [PC, PC]
    path.write_bytes(b"\n\n")
    with pytest.raises(DatasetError) as exc:
        list(iter_examples(path))
    assert exc.value.line is None
    path.write_bytes(jsonl(PC, TEXT))
    it = iter_examples(path)
    assert next(it) == PC
    with pytest.raises(DatasetError) as exc:
        next(it)
    assert exc.value.line == 2
    assert str(exc.value).startswith("line 2: ")


def test_estimate_tokens_and_report_dict() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("a") == 1
    assert estimate_tokens("abcdefgh") == 2
    assert estimate_tokens("é" * 4) == 2  # 8 UTF-8 bytes
    report = validate_jsonl([jsonl(PC)])
    assert report.token_estimate == estimate_tokens("2+2=") + estimate_tokens("4")
    assert report.to_dict() == {
        "format": "prompt_completion",
        "example_count": 1,
        "token_estimate": 2,
        "errors": [],
        "error_count": 0,
        "ok": True,
    }


# A file exercising every path: BOM, CRLF, blank lines, multi-byte characters, bad UTF-8, bad
# JSON, a mixed format, a field error, an oversize line (with the limit lowered) and no final
# newline.
SAMPLE = (
    b"\xef\xbb\xbf"
    + json.dumps({"messages": [{"role": "user", "content": "h\u00e9 \u6f22\U0001f989"},
                               {"role": "assistant", "content": "\u00e9\u00e9"}]},
                 ensure_ascii=False).encode()
    + b"\r\n\r\n"
    + b'{"text": "\xe6\xbc"}\n'
    + b"{oops\n"
    + json.dumps({"text": "x" * 200}).encode() + b"\n"
    + json.dumps(CHAT).encode() + b"\r\n"
    + json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode() + b"\n"
    + json.dumps({"messages": [{"role": "assistant", "content": "\U0001f989" * 10}]}, ensure_ascii=False).encode()
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    data=st.one_of(st.just(SAMPLE), st.binary(max_size=300)),
    cuts=st.lists(st.integers(min_value=0, max_value=len(SAMPLE)), max_size=40),
)
def test_chunk_boundaries_do_not_change_the_report(data: bytes, cuts: list[int]) -> None:
    with mock.patch.object(datasets, "MAX_LINE_BYTES", 120):
        whole = validate_jsonl([data])
        points = sorted({min(c, len(data)) for c in cuts})
        chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
        assert b"".join(chunks) == data
        assert validate_jsonl(iter(chunks)) == whole
        assert validate_jsonl(data[i : i + 1] for i in range(len(data))) == whole


def test_sample_report_is_what_we_expect() -> None:
    with mock.patch.object(datasets, "MAX_LINE_BYTES", 120):
        report = validate_jsonl([SAMPLE])
    assert report.format == "messages"
    assert report.example_count == 3
    assert lines_of(report) == [3, 4, 5, 7]


def test_memory_stays_flat_on_a_huge_line() -> None:
    import tracemalloc

    def chunks() -> Any:
        yield json.dumps(TEXT).encode() + b"\n"
        block = b"x" * (1 << 16)
        for _ in range(320):  # a single 20 MiB line
            yield block
        yield b"\n" + json.dumps(TEXT).encode()

    tracemalloc.start()
    try:
        report = validate_jsonl(chunks())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines_of(report) == [2]
    assert "line is 20971520 bytes" in report.errors[0].message
    assert report.example_count == 2
    assert peak < 6 * datasets.MAX_LINE_BYTES
