"""A job's graded checkpoints, as a job-create body asks for them (gpu_worker.grading runs them):

``evals: {file: "file-…", grader: {...OpenAI's string_check or text_similarity...},
max_tokens: 64}`` and ``checkpoint_selection: last | best_valid_loss | best_eval``. Checked here
before anything is queued: the file is this project's and in the eval format, the grader is one
trainhub scores, and a selection has the figures it compares.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from jobs.errors import InvalidRequest
from jobs.models import TrainingFile
from trainhub_contract.dataset_formats import EVAL
from trainhub_contract.graders import GraderError, parse_grader
from trainhub_contract.spec import (
    CHECKPOINT_SELECTIONS,
    DEFAULT_EVAL_TOKENS,
    MAX_EVAL_TOKENS,
)

MAX_EVAL_ITEMS = 500  # answered at every checkpoint: gpu_worker.grading.MAX_EVAL_ITEMS
EVALS_KEYS = ("file", "grader", "max_tokens")


def _error(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, code=code, param=param)


def evals_fields(
    data: Mapping[str, Any],
    find_file: Callable[[object, str], TrainingFile],
    validation_file: TrainingFile | None,
) -> dict[str, Any]:
    """The TrainingJob fields for ``data``'s evals and checkpoint_selection."""
    selection = data.get("checkpoint_selection", "last")
    if selection not in CHECKPOINT_SELECTIONS:
        raise _error(
            f"checkpoint_selection must be one of {', '.join(CHECKPOINT_SELECTIONS)} "
            f"(got {selection!r}).",
            "checkpoint_selection",
        )
    if selection == "best_valid_loss" and validation_file is None:
        raise _error(
            "checkpoint_selection best_valid_loss compares validation losses: give a "
            "validation_file.",
            "checkpoint_selection",
        )
    evals = data.get("evals")
    if evals is None:
        if selection == "best_eval":
            raise _error(
                "checkpoint_selection best_eval compares eval scores: give evals "
                '({"file": ..., "grader": ...}).',
                "checkpoint_selection",
            )
        return {"checkpoint_selection": selection}
    if not isinstance(evals, Mapping):
        raise _error('evals must be an object: {"file", "grader", "max_tokens"}.', "evals",
                     "invalid_type")  # fmt: skip
    unknown = sorted(set(evals) - set(EVALS_KEYS))
    if unknown:
        raise _error(
            f"evals.{unknown[0]} is not a known field ({', '.join(EVALS_KEYS)}).",
            f"evals.{unknown[0]}",
        )
    found = find_file(evals.get("file"), "evals.file")
    if found.status == TrainingFile.Status.PROCESSED and found.format != EVAL:
        raise _error(
            f"File '{found.public_id}' is in the {found.format} format; evals take lines of "
            '{"input": {"messages": [...]}, "reference": "..."}.',
            "evals.file",
            "invalid_file",
        )
    if found.example_count > MAX_EVAL_ITEMS:
        raise _error(
            f"File '{found.public_id}' has {found.example_count} items; evals hold at most "
            f"{MAX_EVAL_ITEMS} (each is answered at every checkpoint).",
            "evals.file",
        )
    try:
        parse_grader(evals.get("grader"))  # refuses what the executor could not score
    except GraderError as exc:
        raise _error(f"{exc.param}: {exc.message}.", f"evals.{exc.param}") from None
    tokens = evals.get("max_tokens", DEFAULT_EVAL_TOKENS)
    if (
        not isinstance(tokens, int)
        or isinstance(tokens, bool)
        or not 1 <= tokens <= MAX_EVAL_TOKENS
    ):
        raise _error(
            f"evals.max_tokens must be an integer from 1 to {MAX_EVAL_TOKENS}.", "evals.max_tokens"
        )
    return {
        "checkpoint_selection": selection,
        "evals_file": found,
        "grader": dict(evals["grader"]),
        "eval_max_tokens": tokens,
    }


def evals_file_problem(found: TrainingFile | None) -> str | None:
    """Why a validated evals file cannot be used (checked again once it is validated)."""
    if found is None or found.status != TrainingFile.Status.PROCESSED or found.format == EVAL:
        return None
    return f"File '{found.public_id}' is in the {found.format} format, not the eval format."
