"""The accepted dataset record shapes: which format a record claims, and the field checks of
each (``trainhub_contract.datasets`` applies them line by line). Standard library only."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

FORMATS = ("messages", "alpaca", "prompt_completion", "text", "preference", "eval")
# The supervised formats; ``preference`` (OpenAI's DPO shape) is what a dpo job trains on;
# ``eval`` (a conversation to answer and reference fields) is what a job's graders score.
SUPERVISED_FORMATS = FORMATS[:4]
PREFERENCE, EVAL = "preference", "eval"
ROLES = ("system", "user", "assistant", "tool")
SHAPES = (
    'accepted shapes: {"messages": [...]}, {"prompt": ..., "completion": ...}, '
    '{"instruction": ..., "output": ...} (optional "input"), {"text": ...}; for dpo: '
    '{"input": {"messages": [...]}, "preferred_output": [...], "non_preferred_output": [...]}; '
    'for evals: {"input": {"messages": [...]}, "reference": ...}'
)


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate: about 4 UTF-8 bytes per token, at least 1 if non-empty."""
    return (len(text.encode("utf-8", "surrogatepass")) + 3) // 4


def detect_format(record: dict[str, Any]) -> str | None:
    """The format a record claims by its keys (fields are checked separately), or None."""
    if not isinstance(record, dict):
        return None
    if "preferred_output" in record or "non_preferred_output" in record:
        return PREFERENCE
    if "messages" in record:
        return "messages"
    if "prompt" in record and "completion" in record:
        return "prompt_completion"
    if "instruction" in record and "output" in record:
        return "alpaca"
    if "text" in record:
        return "text"
    if "input" in record:
        return EVAL
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


def _check_output(record: dict[str, Any], name: str) -> tuple[str | None, list[str]]:
    """One side of a preference pair: a list of exactly one assistant message."""
    output = record.get(name)
    if not isinstance(output, list) or len(output) != 1 or not isinstance(output[0], dict):
        return f"{name} must be a list of exactly one assistant message", []
    message = output[0]
    if message.get("role") != "assistant":
        return f'{name}[0].role must be "assistant" (got {json.dumps(message.get("role"))})', []
    if "weight" in message:
        return f"{name}[0] takes no weight (both outputs of a pair are compared whole)", []
    content, calls = message.get("content"), message.get("tool_calls")
    if content is None and isinstance(calls, list) and calls:
        return None, [json.dumps(calls)]
    if not _nonempty(content):
        return f"{name}[0].content must be a non-empty string (or null with tool_calls)", []
    return None, [str(content)]


def _check_input(record: dict[str, Any]) -> tuple[str | None, list[str]]:
    """``input``: the conversation so far (messages, optional tools), as OpenAI shapes it for
    DPO and evals."""
    prompt = record.get("input")
    if not isinstance(prompt, dict) or "messages" not in prompt:
        return "input must be an object with messages (the conversation so far)", []
    if set(prompt) - {"messages", "tools", "parallel_tool_calls"}:
        extra = sorted(set(prompt) - {"messages", "tools", "parallel_tool_calls"})[0]
        return f"input.{extra} is not a known field (messages, tools, parallel_tool_calls)", []
    messages = prompt["messages"]
    if not isinstance(messages, list) or not messages:
        return "input.messages must be a non-empty list of {role, content} objects", []
    texts: list[str] = []
    for i, m in enumerate(messages):
        where = f"input.messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            return f"{where} must be an object whose role is one of {', '.join(ROLES)}", []
        content = m.get("content")
        if content is None and m.get("role") == "assistant" and m.get("tool_calls"):
            texts.append(json.dumps(m["tool_calls"]))
        elif isinstance(content, str):
            texts.append(content)
        else:
            return f"{where}.content must be a string (null only for assistant tool_calls)", []
    if "tools" in prompt and not isinstance(prompt["tools"], list):
        return "input.tools must be a list when present", []
    return None, texts


def _check_preference(record: dict[str, Any]) -> tuple[str | None, list[str]]:
    """OpenAI's DPO line: ``input`` and one preferred and one non-preferred assistant reply."""
    error, texts = _check_input(record)
    if error:
        return error, []
    for name in ("preferred_output", "non_preferred_output"):
        error, said = _check_output(record, name)
        if error:
            return error, []
        texts += said
    if record["preferred_output"] == record["non_preferred_output"]:
        return "preferred_output and non_preferred_output are the same reply", []
    return None, texts


def _check_eval(record: dict[str, Any]) -> tuple[str | None, list[str]]:
    """An eval item: ``input`` to answer, and string fields a grader's ``{{item.<field>}}``
    names (``reference``, say)."""
    error, texts = _check_input(record)
    if error:
        return error, []
    fields = {k: v for k, v in record.items() if k != "input"}
    if not fields:
        return 'an eval line needs a reference field beside input (e.g. "reference": "...")', []
    for key, value in fields.items():
        if not isinstance(value, str):
            return f"{key} must be a string (a reference a grader compares the answer with)", []
    return None, [*texts, *fields.values()]


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
    PREFERENCE: _check_preference,
    EVAL: _check_eval,
}


def check_record(fmt: str, record: dict[str, Any]) -> tuple[str | None, list[str]]:
    """The fields of a record of format ``fmt``: (error message or None, texts to count)."""
    return _CHECKS[fmt](record)
