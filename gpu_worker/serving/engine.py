"""The embedded inference engine: one base model (transformers) and up to ``max_adapters``
named LoRA adapters (PEFT) on it, least recently used unloaded first, generating one request at
a time.

It stands where vLLM stands on a GPU (the same HTTP API, gpu_worker.serving.server): on a CPU,
for the demo and the tests, generation goes through ``model.generate`` exactly as a script
with ``PeftModel`` would, so a greedy answer from the server is the answer the adapter gives.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class EngineError(Exception):
    """A request the engine refuses: ``status`` is the HTTP status, ``param`` the field."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param = message, status, param


@dataclass(frozen=True)
class Sampling:
    """What a request asks of generation (OpenAI's names); temperature 0 is greedy."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass
class Generation:
    """A finished (or finishing) generation: its tokens, text and why it ended."""

    prompt_tokens: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "length"


@dataclass
class Adapter:
    name: str
    path: str
    loaded_at: float = field(default_factory=time.time)


class Engine:
    def __init__(self, model_ref: str, *, max_adapters: int = 4, served_name: str | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_ref = model_ref
        self.served_name = served_name or model_ref
        self.max_adapters = max(1, max_adapters)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = torch.bfloat16 if self.device == "cuda" else torch.float32
        self.tokenizer: Any = AutoTokenizer.from_pretrained(model_ref)
        base: Any = AutoModelForCausalLM.from_pretrained(model_ref, dtype=dtype)
        self.base: Any = base.to(self.device).eval()
        self.model: Any = self.base  # a PeftModel once an adapter is loaded
        self.adapters: OrderedDict[str, Adapter] = OrderedDict()  # least recently used first
        self.lock = threading.Lock()  # one generation (or adapter change) at a time
        self.created = int(time.time())

    # --- adapters -----------------------------------------------------------------------------

    def load_adapter(self, name: str, path: str) -> list[str]:
        """Load the adapter at ``path`` (a PEFT adapter directory) as ``name``; returns the
        names it unloaded to make room (least recently used first)."""
        if not name or name == self.served_name:
            raise EngineError(f"lora_name must be a new name, not {name!r}", param="lora_name")
        folder = Path(path)
        if not (folder / "adapter_config.json").is_file():
            raise EngineError(
                f"lora_path {path!r} is not an adapter directory (no adapter_config.json)",
                param="lora_path",
            )
        with self.lock:
            if name in self.adapters:
                raise EngineError(f"The lora adapter '{name}' has already been loaded.")
            evicted = []
            while len(self.adapters) >= self.max_adapters:
                oldest = next(iter(self.adapters))
                self._unload_locked(oldest)
                evicted.append(oldest)
            from peft import PeftModel

            try:
                if self.model is self.base:
                    self.model = PeftModel.from_pretrained(
                        self.base, str(folder), adapter_name=name
                    )
                else:
                    self.model.load_adapter(str(folder), adapter_name=name)
            except Exception as exc:  # a config or tensors that do not fit this base model
                raise EngineError(f"cannot load the adapter at {path!r}: {exc}") from exc
            self.model.eval()
            self.adapters[name] = Adapter(name, str(folder))
        return evicted

    def unload_adapter(self, name: str) -> None:
        with self.lock:
            if name not in self.adapters:
                raise EngineError(f"The lora adapter '{name}' cannot be found.", status=404)
            self._unload_locked(name)

    def _unload_locked(self, name: str) -> None:
        del self.adapters[name]
        if not self.adapters:  # PEFT keeps no model without an adapter: back to the base
            self.model = self.model.unload()
            self.base = self.model
            return
        self.model.delete_adapter(name)

    def models(self) -> list[dict[str, Any]]:
        """vLLM's model list: the base, then each adapter with the base as its parent."""
        base = {"id": self.served_name, "object": "model", "created": self.created,
                "owned_by": "trainhub", "root": self.model_ref, "parent": None}  # fmt: skip
        return [base] + [
            {
                "id": a.name,
                "object": "model",
                "created": int(a.loaded_at),
                "owned_by": "trainhub",
                "root": a.path,
                "parent": self.served_name,
            }
            for a in self.adapters.values()
        ]

    # --- generation ---------------------------------------------------------------------------

    def chat_prompt(self, messages: list[dict[str, Any]], tools: list[Any] | None) -> list[int]:
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise EngineError("this model has no chat template: use /v1/completions")
        try:
            rendered: Any = self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=True, add_generation_prompt=True, return_dict=True
            )
        except Exception as exc:  # jinja and tokenizer errors alike: the messages are at fault
            raise EngineError(f"messages cannot be formatted: {exc}", param="messages") from exc
        return list(rendered["input_ids"])

    def text_prompt(self, prompt: str) -> list[int]:
        return list(self.tokenizer(prompt)["input_ids"])

    def check_model(self, model_name: str) -> None:
        """A 404 EngineError unless ``model_name`` is served here: the base or a loaded adapter."""
        if model_name != self.served_name and model_name not in self.adapters:
            raise EngineError(f"The model '{model_name}' does not exist.", 404, "model")

    def generate(
        self,
        model_name: str,
        prompt_ids: list[int],
        sampling: Sampling,
        on_text: Callable[[str], None] | None = None,
    ) -> Generation:
        """Generate from ``prompt_ids`` with ``model_name`` (the base or a loaded adapter);
        ``on_text`` gets each new piece of text as it is decided."""
        self.check_model(model_name)
        with self.lock:
            if model_name in self.adapters:
                self.adapters.move_to_end(model_name)  # most recently used
            return self._generate_locked(model_name, prompt_ids, sampling, on_text)

    def _generate_locked(
        self,
        model_name: str,
        prompt_ids: list[int],
        sampling: Sampling,
        on_text: Callable[[str], None] | None,
    ) -> Generation:
        import contextlib

        import torch

        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        out = Generation(prompt_tokens=len(prompt_ids))
        ids = torch.tensor([prompt_ids], device=self.device)
        adapter = contextlib.nullcontext()
        if model_name in self.adapters:
            self.model.set_adapter(model_name)
        elif self.model is not self.base:
            adapter = self.model.disable_adapter()
        greedy = sampling.temperature == 0
        eos = self._eos_ids()
        text = _IncrementalText(self.tokenizer)
        with adapter, torch.no_grad():
            for token in _tokens(self.model, ids, sampling, greedy, eos):
                if token in eos:
                    out.finish_reason = "stop"
                    break
                out.token_ids.append(token)
                piece, stopped = text.add(token, sampling.stop)
                if piece and on_text is not None:
                    on_text(piece)
                if stopped:
                    out.finish_reason = "stop"
                    break
        tail = text.rest(sampling.stop)  # what was held back for a stop string that never came
        if tail and on_text is not None:
            on_text(tail)
        out.text = text.final(sampling.stop)
        return out

    def _eos_ids(self) -> set[int]:
        found: set[int] = set()
        for value in (self.tokenizer.eos_token_id, self.base.generation_config.eos_token_id):
            if isinstance(value, int):
                found.add(value)
            elif isinstance(value, list):
                found.update(v for v in value if isinstance(v, int))
        return found


def _tokens(model: Any, ids: Any, sampling: Sampling, greedy: bool, eos: set[int]) -> Iterator[int]:
    """New token ids one by one, from ``model.generate`` run in a thread with a streamer (the
    same decoding a script calling generate gets)."""
    import queue

    from transformers.generation.streamers import BaseStreamer

    handoff: queue.Queue[int | BaseException | None] = queue.Queue()

    class Streamer(BaseStreamer):
        def __init__(self) -> None:
            self.prompt_seen = False

        def put(self, value: Any) -> None:
            if not self.prompt_seen:  # generate hands over the prompt first
                self.prompt_seen = True
                return
            for token in value.reshape(-1).tolist():
                handoff.put(int(token))

        def end(self) -> None:
            handoff.put(None)

    kwargs: dict[str, Any] = {
        "input_ids": ids,
        "attention_mask": ids.new_ones(ids.shape),
        "max_new_tokens": sampling.max_tokens,
        "do_sample": not greedy,
        "streamer": Streamer(),
        "eos_token_id": sorted(eos) or None,
        "pad_token_id": next(iter(sorted(eos)), 0),
    }
    if not greedy:
        kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p)
    else:  # the model's generation config may ask for sampling settings greedy ignores
        kwargs.update(temperature=None, top_p=None, top_k=None)

    def run() -> None:
        try:
            model.generate(**kwargs)
        except BaseException as exc:  # handed to the reading side, which raises it
            handoff.put(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    try:
        while (item := handoff.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        worker.join()


class _IncrementalText:
    """Decoded text that grows token by token without splitting a character, and the check
    for stop strings (the text before one is kept, the stop string is not)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = ""

    def add(self, token: int, stop: tuple[str, ...]) -> tuple[str, bool]:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # half a character: wait for the rest
            return "", False
        cut = _stop_at(text, stop)
        if cut is not None:
            piece, self.sent = text[len(self.sent) : cut], text[:cut]
            return piece, True
        # Hold back what could be the start of a stop string.
        hold = max((len(s) - 1 for s in stop if s), default=0)
        ready = len(text) - hold if hold else len(text)
        piece = text[len(self.sent) : max(ready, len(self.sent))]
        self.sent += piece
        return piece, False

    def final(self, stop: tuple[str, ...]) -> str:
        text = str(self.tokenizer.decode(self.ids, skip_special_tokens=True))
        cut = _stop_at(text, stop)
        return text[:cut] if cut is not None else text

    def rest(self, stop: tuple[str, ...]) -> str:
        """What was held back and is now final (the end of the generation)."""
        return self.final(stop)[len(self.sent) :]


def _stop_at(text: str, stop: tuple[str, ...]) -> int | None:
    found = [text.find(s) for s in stop if s and s in text]
    return min(found) if found else None
