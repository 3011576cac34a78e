"""The accepted dataset record shapes: which format a record claims, and the field checks of
each (``trainhub_contract.datasets`` applies them line by line). Standard library only."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

FORMATS = ("messages", "alpaca", "prompt_completion", "text")
ROLES = ("system", "user", "assistant", "tool")
SHAPES = (
    'accepted shapes: {"messages": [...]}, {"prompt": ..., "completion": ...}, '
    '{"instruction": ..., "output": ...} (optional "input"), {"text": ...}'
)


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate: about 4 UTF-8 bytes per token, at least 1 if non-empty."""
    return (len(text.encode("utf-8", "surrogatepass")) + 3) // 4


def detect_format(record: dict[str, Any]) -> str | None:
    """The format a record claims by its keys (fields are checked separately), or None."""
    if not isinstance(record, dict):
        return None
    if "messages" in record:
        return "messages"
    if "prompt" in record and "completion" in record:
        return "prompt_completion"
    if "instruction" in record and "output" in record:
        return "alpaca"
    if "text" in record:
        return "text"
    return None


# --- per-format field checks: return (error message or None, texts to count) -------------------


def _nonempty(value: object) -> bool:
    return isinstance(value, str) and value.strip() != ""


def _check_messages(record: dict[str, Any]) -> tuple[str | None, list[str]]:
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty list of {role, content} objects", []
    if "tools" in record and not isinstance(record["tools"], list):
        return "tools must be a list when present", []
    texts: list[str] = []
    trained = False
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            return f"{where} must be an object with role and content", []
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            return f"{where}.role must be one of {', '.join(ROLES)} (got {json.dumps(role)})", []
        if (
            content is None
            and role == "assistant"
            and isinstance(m.get("tool_calls"), list)
            and m["tool_calls"]
        ):
            texts.append(json.dumps(m["tool_calls"]))
            continue
        if not isinstance(content, str):
            return f"{where}.content must be a string (null only for assistant tool_calls)", []
        weight = m.get("weight", 1)
        if "weight" in m and (
            role != "assistant" or weight not in (0, 1) or isinstance(weight, bool)
        ):
            return f"{where}.weight must be 0 or 1 and only on assistant messages", []
        texts.append(content)
        trained = trained or (role == "assistant" and weight == 1 and _nonempty(content))
    if not trained:
        return (
            "messages needs at least one assistant message with non-empty content (and weight 1)",
            [],
        )
    return None, texts


def _check_prompt_completion(record: dict[str, Any]) -> tuple[str | None, list[str]]:
    if not isinstance(record["prompt"], str):
        return "prompt must be a string", []
    if not _nonempty(record["completion"]):
        return "completion must be a non-empty string", []
    return None, [record["prompt"], record["completion"]]


def _check_alpaca(record: dict[str, Any]) -> tuple[str | None, list[str]]:
    if not _nonempty(record["instruction"]):
        return "instruction must be a non-empty string", []
    if not isinstance(record["output"], str):
        return "output must be a string", []
    if not isinstance(record.get("input", ""), str):
        return "input must be a string when present", []
    return None, [record["instruction"], record.get("input", ""), record["output"]]


def _check_text(record: dict[str, Any]) -> tuple[str | None, list[str]]:
    if not _nonempty(record["text"]):
        return "text must be a non-empty string", []
    return None, [record["text"]]


_CHECKS: dict[str, Callable[[dict[str, Any]], tuple[str | None, list[str]]]] = {
    "messages": _check_messages,
    "prompt_completion": _check_prompt_completion,
    "alpaca": _check_alpaca,
    "text": _check_text,
}


def check_record(fmt: str, record: dict[str, Any]) -> tuple[str | None, list[str]]:
    """The fields of a record of format ``fmt``: (error message or None, texts to count)."""
    return _CHECKS[fmt](record)
