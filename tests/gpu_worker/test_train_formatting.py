"""gpu_worker.formatting on the tiny model's tokenizer: which tokens carry the loss."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_worker.formatting import (
    IGNORE_INDEX,
    FormatError,
    PadCollator,
    alpaca_prompt,
    encode_examples,
    has_generation_markers,
)


def _trained_text(tok: Any, example: dict[str, list[int]]) -> str:
    return tok.decode([t for t in example["labels"] if t != IGNORE_INDEX])


def _chat(*turns: tuple[str, str, int]) -> dict[str, Any]:
    return {
        "messages": [
            {"role": r, "content": c, **({"weight": w} if r == "assistant" and w != 1 else {})}
            for r, c, w in turns
        ]
    }


def test_messages_train_only_the_assistant_turns(tok: Any) -> None:
    record = _chat(("system", "Be brief.", 1), ("user", "Hi?", 1), ("assistant", "Hello.", 1),
                   ("user", "Owl 3?", 1), ("assistant", "Grey.", 1))  # fmt: skip
    [ex], stats = encode_examples([record], "messages", tok, 256)
    assert _trained_text(tok, ex) == "Hello.<|im_end|>Grey.<|im_end|>"
    assert stats.loss_on == "assistant tokens" and not stats.warnings


def test_messages_weight_zero_turns_are_not_trained(tok: Any) -> None:
    record = _chat(("user", "Hi?", 1), ("assistant", "Bad answer.", 0), ("user", "Again?", 1),
                   ("assistant", "Good answer.", 1))  # fmt: skip
    [ex], _ = encode_examples([record], "messages", tok, 256)
    assert _trained_text(tok, ex) == "Good answer.<|im_end|>"


def test_a_template_without_generation_markers_falls_back_to_full_loss(tok: Any) -> None:
    plain = tok.chat_template.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    tok2 = type(tok).from_pretrained(tok.name_or_path)
    tok2.chat_template = plain
    assert has_generation_markers(tok) and not has_generation_markers(tok2)
    [ex], stats = encode_examples(
        [_chat(("user", "Hi?", 1), ("assistant", "Yo.", 1))], "messages", tok2, 256
    )
    assert ex["labels"] == ex["input_ids"]
    assert stats.loss_on == "all tokens"
    assert "generation" in stats.warnings[0]


def test_alpaca_and_prompt_completion_train_the_response_and_eos(tok: Any) -> None:
    [alp], _ = encode_examples(
        [{"instruction": "Name owl 3's colour.", "input": "", "output": "Grey."}],
        "alpaca",
        tok,
        256,
    )
    assert _trained_text(tok, alp) == "Grey.<|im_end|>"
    assert tok.decode(alp["input_ids"]).startswith(
        alpaca_prompt({"instruction": "Name owl 3's colour."})
    )
    [pc], stats = encode_examples(
        [{"prompt": "Q: owl 3?\nA: ", "completion": "grey"}], "prompt_completion", tok, 256
    )
    assert _trained_text(tok, pc) == "grey<|im_end|>"
    assert stats.loss_on == "response tokens"


def test_text_trains_everything(tok: Any) -> None:
    [ex], stats = encode_examples([{"text": "owls are grey"}], "text", tok, 256)
    assert (
        ex["labels"] == ex["input_ids"] and tok.decode(ex["input_ids"]) == "owls are grey<|im_end|>"
    )
    assert stats.loss_on == "all tokens"


def test_truncation_and_dropping_fully_masked_examples(tok: Any) -> None:
    records = [
        {"prompt": "x " * 100, "completion": "yes"},  # the completion is cut off: dropped
        {"prompt": "short ", "completion": "y " * 100},  # truncated but trainable: kept
    ]
    examples, stats = encode_examples(records, "prompt_completion", tok, 32)
    assert (stats.examples, stats.kept, stats.dropped, stats.truncated) == (2, 1, 1, 2)
    assert len(examples[0]["input_ids"]) == 32 == len(examples[0]["labels"])


def test_template_failures_name_the_example(tok: Any) -> None:
    bad = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None,
           "tool_calls": [{"function": {"name": "f"}}]}]}  # fmt: skip
    with pytest.raises(FormatError, match="example 2"):
        encode_examples([_chat(("user", "a", 1), ("assistant", "b", 1)), bad], "messages", tok, 64)


def test_pad_collator_pads_right_and_masks_padding() -> None:
    batch = PadCollator(pad_token_id=9)([{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]},
                                         {"input_ids": [4], "labels": [4]}])  # fmt: skip
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 9, 9]]
    assert batch["labels"].tolist() == [[-100, 2, 3], [4, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
