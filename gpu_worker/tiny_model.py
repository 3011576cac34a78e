"""A tiny random-initialised Llama and its tokenizer, built entirely offline.

``python -m gpu_worker make-tiny-model DIR`` writes a directory that loads through the normal
``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` path, so the demo
and the tests exercise exactly the code a real hub model goes through. About 3M parameters:
hidden 256, 4 layers, 4 heads (2 KV heads), intermediate 704, tied embeddings, and a byte-level
BPE (any UTF-8 text encodes) trained on the bundled demo chat data. The ChatML template carries
``{% generation %}`` markers so assistant-only loss works.

Deterministic: the same seed gives byte-identical weights and tokenizer files.
transformers/tokenizers are imported inside :func:`build_tiny_model`, never at module import,
so importing this module does not defeat the executor's backend choice (Unsloth first).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from gpu_worker.formatting import ALPACA_TEMPLATE, ALPACA_TEMPLATE_NO_INPUT

# The bundled demo chat data: the tokenizer is trained on it, and the demo and tests train on it.
DEMO_DATASET_PATH = Path(__file__).parent / "data" / "demo_chat.jsonl"
# The same conversations as DPO pairs (the preferred reply ends in "!", the other as above in
# "."), and the first 12 questions as eval items with their answers as references.
DEMO_PREFERENCE_PATH = DEMO_DATASET_PATH.with_name("demo_preference.jsonl")
DEMO_EVALS_PATH = DEMO_DATASET_PATH.with_name("demo_evals.jsonl")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")
VOCAB_SIZE = 512
MAX_POSITIONS = 512
# ChatML with {% generation %} around each assistant reply (content + end-of-turn token), so
# return_assistant_tokens_mask marks exactly the tokens the model should learn to produce.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _corpus(source: Path) -> Iterator[str]:
    """Texts the BPE is trained on: the demo conversations as ChatML, plus the fixed prompt
    templates, so every dataset format tokenizes compactly."""
    yield ALPACA_TEMPLATE.format(instruction="", input="")
    yield ALPACA_TEMPLATE_NO_INPUT.format(instruction="")
    with source.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            record = json.loads(line)
            yield "".join(
                f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in record["messages"]
            )


def build_tiny_model(out_dir: Path, *, seed: int = 0, source: Path = DEMO_DATASET_PATH) -> Path:
    """Write the tiny model + tokenizer to ``out_dir`` (created if needed); returns it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(
        list(_corpus(source)),
        trainer=trainers.BpeTrainer(
            vocab_size=VOCAB_SIZE,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    # transformers leaves the fast tokenizer's __init__ unannotated.
    hf_tok = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token="<|endoftext|>",  # noqa: S106 - token strings, not passwords
        eos_token="<|im_end|>",  # noqa: S106
        pad_token="<|pad|>",  # noqa: S106
        unk_token=None,
        model_max_length=MAX_POSITIONS,
    )
    hf_tok.chat_template = CHAT_TEMPLATE

    config = LlamaConfig(
        vocab_size=len(hf_tok),
        hidden_size=256,
        # 704, not the 688 of the usual recipe: bitsandbytes' CPU inference kernel (used for
        # qlora in eval mode) needs every quantized layer's output size divisible by 32.
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
    )
    # fork_rng: seeding must not leak into the caller's global RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # transformers leaves LlamaForCausalLM.__init__ unannotated.
        model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    model.save_pretrained(out_dir)
    hf_tok.save_pretrained(out_dir)
    return out_dir
