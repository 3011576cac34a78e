"""Dataset examples -> token ids and labels, with loss only where the format allows.

- ``messages``: the model's chat template via ``apply_chat_template(...,
  return_assistant_tokens_mask=True)``; loss on assistant tokens only. Templates without
  ``{% generation %}`` markers cannot say which tokens are the assistant's, so those fall back
  to full-sequence loss (and say so in :attr:`FormatStats.warnings`). Assistant messages with
  ``"weight": 0`` are excluded from the loss.
- ``alpaca`` and ``prompt_completion``: a fixed prompt template; loss on the response /
  completion (and the end-of-sequence token) only. Prompt and response are tokenized
  separately, as they are at inference (the prompt alone, then generation).
- ``text``: loss on every token.

Sequences are truncated to ``max_seq_length``; examples left with no trainable token (for
instance an assistant reply cut off by truncation) are dropped and counted.

The tokenizer is any Hugging Face tokenizer; nothing from transformers is imported here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

IGNORE_INDEX = -100

# The Stanford Alpaca prompt, the de-facto standard for instruction/input/output data.
ALPACA_TEMPLATE = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_TEMPLATE_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n"
)
_GENERATION_TAG = re.compile(r"{%-?\s*generation\s*-?%}")
_WEIGHT_IGNORED = (
    "the chat template's assistant spans do not line up one-to-one with the assistant "
    "messages, so weight 0 was ignored (every assistant message is trained)"
)


class FormatError(ValueError):
    """An example the tokenizer or chat template could not handle (``index`` is 1-based)."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(f"example {index}: {message}")
        self.index = index
        self.message = message


@dataclass
class FormatStats:
    examples: int = 0  # examples read
    kept: int = 0
    dropped: int = 0  # no trainable token left after truncation
    truncated: int = 0
    tokens: int = 0  # tokens of the kept examples, after truncation
    trainable_tokens: int = 0
    loss_on: str = ""  # what the loss covers, in words
    warnings: list[str] = field(default_factory=list)


def has_generation_markers(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: the default one is what apply uses
        template = template.get("default")
    return isinstance(template, str) and bool(_GENERATION_TAG.search(template))


def _eos(tokenizer: Any) -> list[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    return [eos] if isinstance(eos, int) else []


def _encode_text(tokenizer: Any, text: str, *, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def _prompt_response(tokenizer: Any, prompt: str, response: str) -> tuple[list[int], list[int]]:
    prompt_ids = _encode_text(tokenizer, prompt, special=True) if prompt else []
    eos = _eos(tokenizer)
    if eos and prompt_ids[-1:] == eos:  # tokenizers that append EOS must not end the prompt
        prompt_ids = prompt_ids[:-1]
    response_ids = _encode_text(tokenizer, response, special=False) + eos
    return prompt_ids + response_ids, [IGNORE_INDEX] * len(prompt_ids) + response_ids


def alpaca_prompt(record: dict[str, Any]) -> str:
    if record.get("input"):
        return ALPACA_TEMPLATE.format(instruction=record["instruction"], input=record["input"])
    return ALPACA_TEMPLATE_NO_INPUT.format(instruction=record["instruction"])


def _runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) spans of consecutive 1s."""
    spans, start = [], None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(mask)))
    return spans


def _encode_messages(
    tokenizer: Any, record: dict[str, Any], markers: bool, stats: FormatStats
) -> tuple[list[int], list[int]]:
    enc = tokenizer.apply_chat_template(
        record["messages"],
        tools=record.get("tools"),
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=markers,
    )
    ids = list(enc["input_ids"])
    if not markers:
        return ids, list(ids)
    mask = list(enc["assistant_masks"])
    weights = [m.get("weight", 1) for m in record["messages"] if m.get("role") == "assistant"]
    if 0 in weights:
        spans = _runs(mask)
        if len(spans) == len(weights):
            for (start, end), weight in zip(spans, weights, strict=True):
                if weight == 0:
                    mask[start:end] = [0] * (end - start)
        elif _WEIGHT_IGNORED not in stats.warnings:
            stats.warnings.append(_WEIGHT_IGNORED)
    return ids, [t if m else IGNORE_INDEX for t, m in zip(ids, mask, strict=True)]


def encode_examples(
    records: Iterable[dict[str, Any]], fmt: str, tokenizer: Any, max_seq_length: int
) -> tuple[list[dict[str, list[int]]], FormatStats]:
    """Tokenize ``records`` (all of format ``fmt``); returns the kept examples and counts.

    Raises :class:`FormatError` when the tokenizer or template fails on an example.
    """
    stats = FormatStats()
    markers = fmt == "messages" and has_generation_markers(tokenizer)
    if fmt == "messages":
        if getattr(tokenizer, "chat_template", None) is None:
            raise FormatError(
                1,
                "the model's tokenizer has no chat template, so messages cannot be formatted; "
                "use a chat/instruct model or convert the data to prompt/completion",
            )
        stats.loss_on = "assistant tokens" if markers else "all tokens"
        if not markers:
            stats.warnings.append(
                "the chat template has no {% generation %} markers, so the loss covers the whole "
                "conversation (system and user turns too), not only the assistant's replies"
            )
    else:
        stats.loss_on = "all tokens" if fmt == "text" else "response tokens"

    out: list[dict[str, list[int]]] = []
    for index, record in enumerate(records, start=1):
        stats.examples += 1
        try:
            if fmt == "messages":
                ids, labels = _encode_messages(tokenizer, record, markers, stats)
            elif fmt == "alpaca":
                ids, labels = _prompt_response(tokenizer, alpaca_prompt(record), record["output"])
            elif fmt == "prompt_completion":
                ids, labels = _prompt_response(tokenizer, record["prompt"], record["completion"])
            elif fmt == "text":
                ids = _encode_text(tokenizer, record["text"], special=True) + _eos(tokenizer)
                labels = list(ids)
            else:
                raise FormatError(index, f"unknown dataset format {fmt!r}")
        except FormatError:
            raise
        except Exception as exc:  # template errors come as jinja/ValueError/TypeError alike
            raise FormatError(index, f"could not be tokenized: {exc}") from exc
        if len(ids) > max_seq_length:
            stats.truncated += 1
            ids, labels = ids[:max_seq_length], labels[:max_seq_length]
        # labels[0] never trains anything: the model predicts position i from tokens < i.
        trainable = sum(1 for label in labels[1:] if label != IGNORE_INDEX)
        if trainable == 0:
            stats.dropped += 1
            continue
        stats.kept += 1
        stats.tokens += len(ids)
        stats.trainable_tokens += trainable
        out.append({"input_ids": ids, "labels": labels})
    return out, stats


class PadCollator:
    """Right-pads a batch: input_ids with the pad id, labels with -100, plus attention_mask."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, batch: list[dict[str, list[int]]]) -> dict[str, Any]:
        import torch

        width = max(len(ex["input_ids"]) for ex in batch)
        ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ex in enumerate(batch):
            n = len(ex["input_ids"])
            ids[row, :n] = torch.tensor(ex["input_ids"], dtype=torch.long)
            labels[row, :n] = torch.tensor(ex["labels"], dtype=torch.long)
            mask[row, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def pad_token_id(tokenizer: Any) -> int:
    for attr in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, attr, None)
        if isinstance(value, int):
            return value
    return 0
