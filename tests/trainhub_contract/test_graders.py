"""OpenAI's string_check and text_similarity graders: parsing, each metric on hand-worked
examples, and every way a grader definition is refused."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from trainhub_contract import graders
from trainhub_contract.graders import Grader, GraderError, parse_grader, passed, score

SAMPLE = "{{sample.output_text}}"


def check(operation: str) -> Grader:
    return Grader("string_check", "check", operation=operation)


def similarity(metric: str, pass_threshold: float | None = None) -> Grader:
    return Grader("text_similarity", "sim", evaluation_metric=metric, pass_threshold=pass_threshold)


def string_check_json(**changes: Any) -> dict[str, Any]:
    data = {
        "type": "string_check",
        "name": "exact",
        "operation": "eq",
        "input": SAMPLE,
        "reference": "{{item.reference}}",
    }
    return {**data, **changes}


def similarity_json(**changes: Any) -> dict[str, Any]:
    data = {
        "type": "text_similarity",
        "name": "close",
        "evaluation_metric": "bleu",
        "input": SAMPLE,
        "reference": "{{item.reference}}",
        "pass_threshold": 0.5,
    }
    return {**data, **changes}


# --- parsing -----------------------------------------------------------------------------


def test_parse_string_check() -> None:
    assert parse_grader(string_check_json()) == Grader("string_check", "exact", operation="eq")


def test_parse_text_similarity_with_item_field_and_spaced_templates() -> None:
    data = similarity_json(
        input="{{ sample.output_text }}", reference="{{ item.answer }}", pass_threshold=1
    )
    assert parse_grader(data) == Grader(
        "text_similarity",
        "close",
        evaluation_metric="bleu",
        pass_threshold=1.0,
        reference_field="answer",
    )


def test_parse_text_similarity_without_threshold_as_openai_fine_tuning_shapes_it() -> None:
    data = similarity_json()
    del data["pass_threshold"]
    assert parse_grader(data).pass_threshold is None


def test_every_listed_metric_and_operation_parses() -> None:
    for operation in graders.STRING_CHECK_OPERATIONS:
        assert parse_grader(string_check_json(operation=operation)).operation == operation
    for metric in graders.SIMILARITY_METRICS:
        grader = parse_grader(similarity_json(evaluation_metric=metric))
        assert grader.evaluation_metric == metric
        assert 0.0 <= score(grader, "a b c", "a b d") <= 1.0


def _without(data: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != key}


@pytest.mark.parametrize(
    ("data", "param", "hint"),
    [
        (["not", "an", "object"], "grader", "JSON object"),
        (string_check_json(type="python"), "grader.type", "string_check, text_similarity"),
        (_without(string_check_json(), "type"), "grader.type", "string_check, text_similarity"),
        (string_check_json(threshold=1), "grader.threshold", "allowed: input, name"),
        (string_check_json(pass_threshold=0.5), "grader.pass_threshold", "unknown field"),
        (similarity_json(operation="eq"), "grader.operation", "unknown field"),
        (string_check_json(operation="contains"), "grader.operation", "eq, ne, like, ilike"),
        (_without(string_check_json(), "operation"), "grader.operation", "got nothing"),
        (similarity_json(evaluation_metric="jaccard"), "grader.evaluation_metric", "rouge_l"),
        (similarity_json(evaluation_metric="cosine"), "grader.evaluation_metric", "embeddings"),
        (similarity_json(evaluation_metric="meteor"), "grader.evaluation_metric", "WordNet"),
        (_without(similarity_json(), "evaluation_metric"), "grader.evaluation_metric", "fuzzy"),
        (similarity_json(evaluation_metric=["bleu"]), "grader.evaluation_metric", "got ['bleu']"),
        (string_check_json(operation={"eq": 1}), "grader.operation", "eq, ne, like, ilike"),
        (string_check_json(input="{{sample.output_json}}"), "grader.input", SAMPLE),
        (string_check_json(input="Paris"), "grader.input", SAMPLE),
        (string_check_json(input=5), "grader.input", "must be a string"),
        (_without(string_check_json(), "input"), "grader.input", "required"),
        (string_check_json(reference="Paris"), "grader.reference", "{{item.<field>}}"),
        (string_check_json(reference="{{item.a.b}}"), "grader.reference", "nested"),
        (string_check_json(reference=SAMPLE), "grader.reference", "{{item.<field>}}"),
        (_without(string_check_json(), "name"), "grader.name", "required"),
        (string_check_json(name="  "), "grader.name", "must not be empty"),
        (string_check_json(name="n" * 201), "grader.name", "at most 200 characters"),
        (string_check_json(name=3), "grader.name", "must be a string"),
        (similarity_json(pass_threshold=1.5), "grader.pass_threshold", "from 0 to 1"),
        (similarity_json(pass_threshold=-0.1), "grader.pass_threshold", "from 0 to 1"),
        (similarity_json(pass_threshold="0.5"), "grader.pass_threshold", "a number"),
        (similarity_json(pass_threshold=True), "grader.pass_threshold", "a number"),
        (similarity_json(pass_threshold=math.nan), "grader.pass_threshold", "a number"),
    ],
)
def test_parse_refuses(data: object, param: str, hint: str) -> None:
    with pytest.raises(GraderError) as caught:
        parse_grader(data)
    assert caught.value.param == param
    assert hint in caught.value.message
    assert str(caught.value).startswith(f"{param}: ")


def test_score_refuses_a_grader_that_parse_would_not_build() -> None:
    with pytest.raises(GraderError):
        score(Grader("string_check", "x", evaluation_metric="bleu"), "a", "a")


# --- string_check ------------------------------------------------------------------------

# (output, reference): eq, ne, like, ilike. OpenAI: eq/ne compare exactly, case included;
# like is "the output contains the reference"; ilike is like without case.
TRUTH_TABLE = [
    ("Paris", "Paris", (1, 0, 1, 1)),
    ("paris", "Paris", (0, 1, 0, 1)),
    ("The capital is Paris.", "Paris", (0, 1, 1, 1)),
    ("THE CAPITAL IS PARIS.", "Paris", (0, 1, 0, 1)),
    ("Par", "Paris", (0, 1, 0, 0)),  # containment runs one way: the reference inside the output
    ("Paris ", "Paris", (0, 1, 1, 1)),  # no trimming
    ("Lyon", "Paris", (0, 1, 0, 0)),
]


@pytest.mark.parametrize(("output", "reference", "expected"), TRUTH_TABLE)
def test_string_check_truth_table(output: str, reference: str, expected: tuple[int, ...]) -> None:
    got = tuple(score(check(op), output, reference) for op in graders.STRING_CHECK_OPERATIONS)
    assert got == expected


def test_string_check_passes_only_a_full_grade() -> None:
    assert passed(check("eq"), 1.0)
    assert not passed(check("eq"), 0.0)


# --- fuzzy_match: 2 * LCS(characters) / (len(a) + len(b)), rapidfuzz's fuzz.ratio / 100 --------


@pytest.mark.parametrize(
    ("output", "reference", "expected"),
    [
        # rapidfuzz's own documented example: LCS 14 of 14 + 15 characters -> 28 / 29.
        ("this is a test", "this is a test!", 28 / 29),
        # kitten / sitting: LCS "ittn" = 4 -> 8 / 13.
        ("kitten", "sitting", 8 / 13),
        # state / taste: LCS "tate" = 4 -> 8 / 10.
        ("state", "taste", 0.8),
        # case counts: "aris" = 4 -> 8 / 10.
        ("Paris", "paris", 0.8),
        ("same", "same", 1.0),
        ("", "", 1.0),
        ("", "abc", 0.0),
        ("abc", "xyz", 0.0),
    ],
)
def test_fuzzy_match(output: str, reference: str, expected: float) -> None:
    assert score(similarity("fuzzy_match"), output, reference) == pytest.approx(expected)


def _lcs_table(a: str, b: str) -> int:
    row = [0] * (len(b) + 1)
    for x in a:
        previous_diagonal = 0
        for j, y in enumerate(b, start=1):
            previous_diagonal, row[j] = (
                row[j],
                previous_diagonal + 1 if x == y else max(row[j], row[j - 1]),
            )
    return row[-1]


def test_bit_parallel_lcs_agrees_with_the_textbook_table() -> None:
    rnd = random.Random(7)  # noqa: S311 - test data, not secrets
    for _ in range(300):
        a = "".join(rnd.choice("abcé ") for _ in range(rnd.randint(0, 80)))
        b = "".join(rnd.choice("abcé ") for _ in range(rnd.randint(0, 80)))
        assert graders._lcs_length(a, b) == _lcs_table(a, b), (a, b)


# --- bleu: sacrebleu's sentence BLEU (13a tokens, exp smoothing, effective order) ----------


@pytest.mark.parametrize(
    ("output", "reference", "expected"),
    [
        ("the cat sat on the mat", "the cat sat on the mat", 1.0),
        ("Paris", "Paris", 1.0),  # one token: effective order 1, no zero from missing 4-grams
        # 1-grams 5/6 (the x2, cat, on, mat), 2-grams 3/5 (the cat, on the, the mat),
        # 3-grams 1/4 (on the mat), 4-grams 0/3 -> smoothed 1 / (2 * 3); equal lengths, BP 1:
        # (5/6 * 3/5 * 1/4 * 1/6) ** (1/4) = (1/48) ** (1/4) = 0.379918...
        ("the cat sat on the mat", "the cat is on the mat", 48**-0.25),
        # 1-grams 2/2, 2-grams 1/1, no 3-grams in the output: order 2, precision 1;
        # BP exp(1 - 3/2).
        ("the cat", "the cat sat", math.exp(-0.5)),
        # case counts: 1-grams 1/2 (cat), 2-grams 0/1 -> 1 / (2 * 1): sqrt(1/2 * 1/2) = 0.5.
        ("The cat", "the cat", 0.5),
        # punctuation is its own token: "Paris", "." against "Paris": 1-grams 1/2,
        # 2-grams 0/1 -> 1/2: sqrt(1/2 * 1/2) = 0.5, longer than the reference so BP 1.
        ("Paris.", "Paris", 0.5),
        ("a b c", "x y z", 0.0),
        ("", "the cat", 0.0),
    ],
)
def test_bleu(output: str, reference: str, expected: float) -> None:
    assert score(similarity("bleu"), output, reference) == pytest.approx(expected)


# --- gleu: shared 1..4-grams over the larger n-gram count -------------------------------


@pytest.mark.parametrize(
    ("output", "reference", "expected"),
    [
        # output n-grams 3 + 2 + 1 = 6, all in the reference (4 + 3 + 2 + 1 = 10): 6 / 10.
        ("the cat sat", "the cat sat down", 0.6),
        ("the cat sat down", "the cat sat", 0.6),
        ("same words here", "same words here", 1.0),
        ("a b", "c d", 0.0),
        ("", "", 0.0),
    ],
)
def test_gleu(output: str, reference: str, expected: float) -> None:
    assert score(similarity("gleu"), output, reference) == pytest.approx(expected)


# --- rouge: F1 over lowercased letter-and-digit tokens ----------------------------------


@pytest.mark.parametrize(
    ("metric", "output", "reference", "expected"),
    [
        # 3 shared of 3 and 4: P 1, R 3/4 -> 2 * 1 * 0.75 / 1.75 = 0.857142...
        ("rouge_1", "the cat sat", "the cat sat down", 6 / 7),
        # 2 shared bigrams of 2 and 3: P 1, R 2/3 -> (4/3) / (5/3) = 0.8.
        ("rouge_2", "the cat sat", "the cat sat down", 0.8),
        # LCS 3 of 3 and 4: as rouge_1.
        ("rouge_l", "the cat sat", "the cat sat down", 6 / 7),
        # Same words, swapped: every unigram shared...
        ("rouge_1", "the mat sat on the cat", "the cat sat on the mat", 1.0),
        # ...bigrams the mat / sat on / on the / the cat shared, 4 of 5 each side...
        ("rouge_2", "the mat sat on the cat", "the cat sat on the mat", 0.8),
        # ...trigrams: only "sat on the", 1 of 4...
        ("rouge_3", "the mat sat on the cat", "the cat sat on the mat", 0.25),
        ("rouge_4", "the mat sat on the cat", "the cat sat on the mat", 0.0),
        # ...and the longest common subsequence "the sat on the", 4 of 6: 2/3.
        ("rouge_l", "the mat sat on the cat", "the cat sat on the mat", 2 / 3),
        # Five tokens each, all shared in order: the one 5-gram matches.
        ("rouge_5", "a b c d e", "a b c d e", 1.0),
        ("rouge_5", "a b c d", "a b c d", 0.0),  # no 5-gram to share
        # Case and punctuation do not count.
        ("rouge_1", "The CAT, sat!", "the cat sat", 1.0),
        ("rouge_l", "Café au lait", "café au lait", 1.0),
        ("rouge_1", "a b c", "x y z", 0.0),
        ("rouge_2", "a b c", "x y z", 0.0),
        ("rouge_l", "a b c", "x y z", 0.0),
        ("rouge_l", "", "", 0.0),
    ],
)
def test_rouge(metric: str, output: str, reference: str, expected: float) -> None:
    assert score(similarity(metric), output, reference) == pytest.approx(expected)


# --- passing -----------------------------------------------------------------------------


def test_text_similarity_passes_at_or_above_its_threshold() -> None:
    grader = similarity("rouge_1", pass_threshold=0.5)
    assert passed(grader, 0.5)
    assert not passed(grader, 0.49)


def test_text_similarity_without_threshold_passes_only_a_full_grade() -> None:
    grader = similarity("fuzzy_match")
    assert passed(grader, 1.0)
    assert not passed(grader, 0.99)
