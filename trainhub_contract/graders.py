"""OpenAI's two simple graders, ``string_check`` and ``text_similarity``, as its evals and graded
fine-tuning define them (https://developers.openai.com/api/docs/guides/graders): a grade from 0
to 1 of the model's output against a reference. OpenAI names the library behind some metrics
but not its settings, so each says which definition it reproduces (standard library only):

- ``fuzzy_match``: rapidfuzz's ``fuzz.ratio`` / 100, ``2 * LCS / (len(a) + len(b))`` over
  characters, case kept; two empty strings give 1. An exact LCS, not ``difflib``, whose
  SequenceMatcher can count fewer matches (it fixes the longest block first) and turns on a
  junk heuristic past 200 characters.
- ``bleu``: sacrebleu's ``sentence_bleu`` / 100: 13a tokens, case kept, clipped 1- to 4-grams,
  brevity penalty, "exp" smoothing (Chen & Cherry 2014 method 3, NIST's: the k-th order with
  no match counts ``1 / (2**k * total)``) and the effective order (orders longer than the
  output are left out). Without these, any output under four tokens would score 0.
- ``gleu``: NLTK's ``sentence_gleu`` (Google BLEU) on the same tokens: shared 1- to 4-grams
  over the larger of the two texts' n-gram counts.
- ``rouge_1`` … ``rouge_5``, ``rouge_l``: Google ``rouge-score``'s F1, no stemmer: lowercased
  runs of letters and digits, shared n-grams or the longest common subsequence. It keeps ASCII
  letters only; this keeps every letter, so the two agree on ASCII text.

Not here: ``cosine`` (embeddings from an OpenAI model) and ``meteor`` (WordNet and a stemmer).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

GRADER_TYPES = ("string_check", "text_similarity")
MAX_NAME_CHARS = 200  # the name labels results and log lines
STRING_CHECK_OPERATIONS = ("eq", "ne", "like", "ilike")
SIMILARITY_METRICS = (
    "fuzzy_match",
    "bleu",
    "gleu",
    "rouge_1",
    "rouge_2",
    "rouge_3",
    "rouge_4",
    "rouge_5",
    "rouge_l",
)
# OpenAI's metrics that cannot be computed faithfully here, with the reason a user is told.
_UNSUPPORTED_METRICS = {
    "cosine": "it compares embeddings from an OpenAI model",
    "meteor": "it needs WordNet synonyms and a stemmer",
}
# OpenAI's other grader types, named in the error so a user knows they exist but are not offered.
_OTHER_OPENAI_TYPES = ("python", "score_model", "label_model", "multi")

_KEYS = {
    "string_check": frozenset({"type", "name", "input", "reference", "operation"}),
    "text_similarity": frozenset(
        {"type", "name", "input", "reference", "evaluation_metric", "pass_threshold"}
    ),
}
_INPUT_TEMPLATE = "{{sample.output_text}}"
_INPUT_RE = re.compile(r"\{\{\s*sample\.output_text\s*\}\}")
_REFERENCE_RE = re.compile(r"\{\{\s*item\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


class GraderError(ValueError):
    """A grader definition that cannot be used; ``param`` is the dotted field at fault, as in
    OpenAI's error objects (``grader.operation``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def __str__(self) -> str:
        return f"{self.param}: {self.message}"


@dataclass(frozen=True)
class Grader:
    """A parsed grader. ``operation`` is set for string_check, ``evaluation_metric`` (and, when
    given, ``pass_threshold``) for text_similarity. The output is always the sample's text; the
    reference is the item's ``reference_field``."""

    type: str
    name: str
    operation: str | None = None
    evaluation_metric: str | None = None
    pass_threshold: float | None = None
    reference_field: str = "reference"


def parse_grader(data: object) -> Grader:
    """A grader from its JSON object, shaped as OpenAI's; GraderError names the field at fault."""
    if not isinstance(data, dict):
        raise GraderError(f"must be a JSON object, got {type(data).__name__}", "grader")
    kind = data.get("type")
    if kind not in GRADER_TYPES:
        raise GraderError(
            f"must be one of {_listing(GRADER_TYPES)}, got {kind!r}"
            f" (OpenAI's {_listing(_OTHER_OPENAI_TYPES)} graders are not supported)",
            "grader.type",
        )
    unknown = sorted(str(key) for key in data if key not in _KEYS[kind])
    if unknown:
        raise GraderError(
            f"unknown field for a {kind} grader; allowed: {_listing(sorted(_KEYS[kind]))}",
            f"grader.{unknown[0]}",
        )
    name = _required_str(data, "name")
    if not name.strip():
        raise GraderError("must not be empty: it names the grader in results", "grader.name")
    if len(name) > MAX_NAME_CHARS:
        raise GraderError(f"must be at most {MAX_NAME_CHARS} characters", "grader.name")
    if not _INPUT_RE.fullmatch(_required_str(data, "input")):
        raise GraderError(
            f"must be {_INPUT_TEMPLATE!r}: the model's output is what gets graded", "grader.input"
        )
    reference = _REFERENCE_RE.fullmatch(_required_str(data, "reference"))
    if reference is None:
        raise GraderError(
            "must be '{{item.<field>}}', a top-level field of the dataset line such as"
            " '{{item.reference}}' (literal text and nested paths are not supported)",
            "grader.reference",
        )
    if kind == "string_check":
        operation = _required_choice(data, "operation", STRING_CHECK_OPERATIONS)
        return Grader(kind, name, operation=operation, reference_field=reference.group(1))
    metric = data.get("evaluation_metric")
    if isinstance(metric, str) and metric in _UNSUPPORTED_METRICS:
        raise GraderError(
            f"{metric!r} is not supported here ({_UNSUPPORTED_METRICS[metric]});"
            f" use one of {_listing(SIMILARITY_METRICS)}",
            "grader.evaluation_metric",
        )
    metric = _required_choice(data, "evaluation_metric", SIMILARITY_METRICS)
    return Grader(
        kind,
        name,
        evaluation_metric=metric,
        pass_threshold=_pass_threshold(data.get("pass_threshold")),
        reference_field=reference.group(1),
    )


def score(grader: Grader, output: str, reference: str) -> float:
    """The grade, from 0 to 1, of ``output`` against ``reference``."""
    if grader.type == "string_check" and grader.operation in _STRING_CHECKS:
        return 1.0 if _STRING_CHECKS[grader.operation](output, reference) else 0.0
    if grader.type == "text_similarity" and grader.evaluation_metric in _METRICS:
        return _METRICS[grader.evaluation_metric](output, reference)
    raise GraderError(f"cannot score {grader!r}; build graders with parse_grader", "grader")


def passed(grader: Grader, value: float) -> bool:
    """Whether a grade passes: at least ``pass_threshold`` when one is set (OpenAI's rule),
    otherwise only a full grade, as for string_check. OpenAI's fine-tuning graders carry no
    threshold, so a text_similarity grader may come without one."""
    if grader.pass_threshold is not None:
        return value >= grader.pass_threshold
    return value >= 1.0


def _listing(values: Sequence[str]) -> str:
    return ", ".join(values)


def _required_str(data: dict[object, object], key: str) -> str:
    value = data.get(key)
    if value is None:
        raise GraderError("is required", f"grader.{key}")
    if not isinstance(value, str):
        raise GraderError(f"must be a string, got {type(value).__name__}", f"grader.{key}")
    return value


def _required_choice(data: dict[object, object], key: str, choices: Sequence[str]) -> str:
    value = data.get(key)
    if value not in choices:
        got = "nothing" if value is None else repr(value)
        raise GraderError(f"must be one of {_listing(choices)}, got {got}", f"grader.{key}")
    return str(value)


def _pass_threshold(value: object) -> float | None:
    if value is None:
        return None
    # bool is an int to Python, but `true` is no threshold.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise GraderError(f"must be a number from 0 to 1, got {value!r}", "grader.pass_threshold")
    if not 0.0 <= value <= 1.0:
        raise GraderError(
            f"must be from 0 to 1 (grades are), got {value!r}", "grader.pass_threshold"
        )
    return float(value)


# OpenAI: eq and ne compare exactly, case included; like is "the output contains the
# reference", ilike the same without case.
_STRING_CHECKS: dict[str, Callable[[str, str], bool]] = {
    "eq": lambda output, reference: output == reference,
    "ne": lambda output, reference: output != reference,
    "like": lambda output, reference: reference in output,
    "ilike": lambda output, reference: reference.casefold() in output.casefold(),
}


# mteval-v13a's rules, as sacrebleu's default tokeniser applies them (its SGML-entity
# unescaping aside): ASCII punctuation becomes its own token, except the apostrophe; the hyphen
# only after a digit; the period and comma unless a digit stands on both sides (3.14, 1,000).
_BLEU_SPLIT = (
    re.compile(r"""([!"#$%&()*+/:;<=>?@\[\\\]^_`{|}~])"""),
    re.compile(r"(?<![0-9])([.,])|([.,])(?![0-9])"),
    re.compile(r"(?<=[0-9])(-)"),
)
_BLEU_ORDER = 4
# rouge-score's tokens, with any letter or digit rather than ASCII ones only.
_WORD_RE = re.compile(r"[^\W_]+")


def _bleu_tokens(text: str) -> list[str]:
    for pattern in _BLEU_SPLIT:
        text = pattern.sub(lambda m: f" {m.group(0)} ", text)
    return text.split()


def _rouge_tokens(text: str) -> list[str]:
    return _WORD_RE.findall(text.lower())


def _ngrams(tokens: Sequence[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def _shared(a: Counter[tuple[str, ...]], b: Counter[tuple[str, ...]]) -> int:
    """N-grams in common, each counted as often as it occurs in both (clipped)."""
    return sum((a & b).values())


def _f1(shared: int, output_count: int, reference_count: int) -> float:
    if shared == 0:
        return 0.0
    precision, recall = shared / output_count, shared / reference_count
    return 2 * precision * recall / (precision + recall)


def _lcs_length(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """Length of the longest common subsequence, bit-parallel (Allison-Dix / Hyyrö): one bit
    per element of ``a`` in an int, so the work per element of ``b`` is a few big-int
    operations instead of a row of a len(a) x len(b) table."""
    if not a or not b:
        return 0
    where: dict[Hashable, int] = {}
    for i, element in enumerate(a):
        where[element] = where.get(element, 0) | (1 << i)
    full = (1 << len(a)) - 1
    row = full
    for element in b:
        matched = row & where.get(element, 0)
        row = ((row + matched) | (row - matched)) & full
    # Each zero bit left in the row is one element of the common subsequence.
    return len(a) - row.bit_count()


def _fuzzy_match(output: str, reference: str) -> float:
    total = len(output) + len(reference)
    if total == 0:
        return 1.0
    return 2 * _lcs_length(output, reference) / total


def _bleu(output: str, reference: str) -> float:
    hyp, ref = _bleu_tokens(output), _bleu_tokens(reference)
    matches, totals = [], []
    for n in range(1, _BLEU_ORDER + 1):
        hyp_ngrams = _ngrams(hyp, n)
        matches.append(_shared(hyp_ngrams, _ngrams(ref, n)))
        totals.append(hyp_ngrams.total())
    if not any(matches):
        return 0.0
    log_sum, order, unmatched_orders = 0.0, 0, 0
    for matched, total in zip(matches, totals, strict=True):
        if total == 0:  # the output is shorter than n tokens: the effective order stops here
            break
        order += 1
        if matched:
            log_sum += math.log(matched / total)
        else:
            unmatched_orders += 1
            log_sum += math.log(1 / (2**unmatched_orders * total))
    brevity = 1.0 if len(hyp) >= len(ref) else math.exp(1 - len(ref) / len(hyp))
    return brevity * math.exp(log_sum / order)


def _gleu(output: str, reference: str) -> float:
    hyp, ref = _bleu_tokens(output), _bleu_tokens(reference)
    hyp_ngrams: Counter[tuple[str, ...]] = Counter()
    ref_ngrams: Counter[tuple[str, ...]] = Counter()
    for n in range(1, _BLEU_ORDER + 1):
        hyp_ngrams += _ngrams(hyp, n)
        ref_ngrams += _ngrams(ref, n)
    larger = max(hyp_ngrams.total(), ref_ngrams.total())
    return _shared(hyp_ngrams, ref_ngrams) / larger if larger else 0.0


def _rouge_n(n: int) -> Callable[[str, str], float]:
    def rouge(output: str, reference: str) -> float:
        hyp = _ngrams(_rouge_tokens(output), n)
        ref = _ngrams(_rouge_tokens(reference), n)
        return _f1(_shared(hyp, ref), hyp.total(), ref.total())

    return rouge


def _rouge_l(output: str, reference: str) -> float:
    hyp, ref = _rouge_tokens(output), _rouge_tokens(reference)
    return _f1(_lcs_length(hyp, ref), len(hyp), len(ref))


_METRICS: dict[str, Callable[[str, str], float]] = {
    "fuzzy_match": _fuzzy_match,
    "bleu": _bleu,
    "gleu": _gleu,
    **{f"rouge_{n}": _rouge_n(n) for n in range(1, 6)},
    "rouge_l": _rouge_l,
}
