"""The registry of the 25 IFEval instruction ids: id -> checker function, with kwargs validation.

A dataset row gives, per instruction, an id such as ``"length_constraints:number_words"`` and a kwargs dict
such as ``{"num_words": 300, "relation": "at least"}``. :func:`check_instruction` looks the id up, validates
the kwargs against the checker's signature (names, types, allowed relations) and calls it. ``None`` values are
dropped first: the Hugging Face copy of IFEval (``google/IFEval``) stores every kwarg name in every row, with
``None`` where unused. Missing values are an error, never replaced by random ones as IFEval's generator does.
"""

from __future__ import annotations

import difflib
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import llmrl_core.envs.ifeval.checks_case as checks_case
import llmrl_core.envs.ifeval.checks_format as checks_format
import llmrl_core.envs.ifeval.checks_keywords as checks_keywords
import llmrl_core.envs.ifeval.checks_length as checks_length
import llmrl_core.envs.ifeval.checks_startend as checks_startend

Checker = Callable[..., bool]

INSTRUCTION_CHECKERS: Mapping[str, Checker] = MappingProxyType(
    {
        "keywords:existence": checks_keywords.check_keywords_existence,
        "keywords:frequency": checks_keywords.check_keyword_frequency,
        "keywords:forbidden_words": checks_keywords.check_forbidden_words,
        "keywords:letter_frequency": checks_keywords.check_letter_frequency,
        "language:response_language": checks_case.check_response_language,
        "length_constraints:number_sentences": checks_length.check_number_sentences,
        "length_constraints:number_paragraphs": checks_length.check_number_paragraphs,
        "length_constraints:number_words": checks_length.check_number_words,
        "length_constraints:nth_paragraph_first_word": checks_length.check_nth_paragraph_first_word,
        "detectable_content:number_placeholders": checks_format.check_number_placeholders,
        "detectable_content:postscript": checks_format.check_postscript,
        "detectable_format:number_bullet_lists": checks_format.check_number_bullet_lists,
        "detectable_format:constrained_response": checks_format.check_constrained_response,
        "detectable_format:number_highlighted_sections": checks_format.check_number_highlighted_sections,
        "detectable_format:multiple_sections": checks_format.check_multiple_sections,
        "detectable_format:json_format": checks_format.check_json_format,
        "detectable_format:title": checks_format.check_title,
        "combination:two_responses": checks_startend.check_two_responses,
        "combination:repeat_prompt": checks_startend.check_repeat_prompt,
        "startend:end_checker": checks_startend.check_end_checker,
        "startend:quotation": checks_startend.check_quotation,
        "change_case:capital_word_frequency": checks_case.check_capital_word_frequency,
        "change_case:english_capital": checks_case.check_english_capital,
        "change_case:english_lowercase": checks_case.check_english_lowercase,
        "punctuation:no_comma": checks_case.check_no_comma,
    }
)
INSTRUCTION_IDS: tuple[str, ...] = tuple(INSTRUCTION_CHECKERS)


class UnknownInstructionError(ValueError):
    """An instruction id that is not one of the 25 IFEval ids."""


class InstructionArgumentError(ValueError):
    """Kwargs that do not fit an instruction: unknown or missing names, wrong types, unknown relation."""


def _parameters(checker: Checker) -> dict[str, Any]:
    """Keyword-only parameters of a checker and their (resolved) type hints."""
    hints = typing.get_type_hints(checker)
    params = inspect.signature(checker).parameters.values()
    return {p.name: hints[p.name] for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


_PARAMETERS: Mapping[str, dict[str, Any]] = MappingProxyType(
    {instruction_id: _parameters(checker) for instruction_id, checker in INSTRUCTION_CHECKERS.items()}
)


def get_checker(instruction_id: str) -> Checker:
    """The checker function of ``instruction_id``; :class:`UnknownInstructionError` names an unknown id."""
    try:
        return INSTRUCTION_CHECKERS[instruction_id]
    except (KeyError, TypeError):
        close = difflib.get_close_matches(str(instruction_id), INSTRUCTION_IDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UnknownInstructionError(
            f"unknown IFEval instruction id {instruction_id!r}{hint}; known ids: {', '.join(INSTRUCTION_IDS)}"
        ) from None


def instruction_parameters(instruction_id: str) -> dict[str, Any]:
    """Kwarg names of ``instruction_id`` mapped to their types (empty for instructions without kwargs)."""
    get_checker(instruction_id)
    return dict(_PARAMETERS[instruction_id])


def _coerce(instruction_id: str, name: str, value: Any, kind: Any) -> Any:
    """Check (and for integral floats, convert) one kwarg value against its declared type."""

    def fail(expected: str) -> typing.NoReturn:
        raise InstructionArgumentError(
            f"{instruction_id}: kwarg {name!r} must be {expected}, got {value!r} ({type(value).__name__})"
        )

    if typing.get_origin(kind) is typing.Literal:
        if value not in typing.get_args(kind):
            fail(f"one of {typing.get_args(kind)}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int | float):
            fail("an integer")
        if isinstance(value, float) and not value.is_integer():
            fail("an integer")
        return int(value)
    if kind is str:
        if not isinstance(value, str) or not value.strip():
            fail("a non-empty string")
        return value
    if typing.get_origin(kind) is list:
        if isinstance(value, str) or not isinstance(value, Sequence) or not value:
            fail("a non-empty list of strings")
        if not all(isinstance(item, str) and item.strip() for item in value):
            fail("a non-empty list of strings")
        return list(value)
    raise TypeError(f"{instruction_id}: unsupported parameter type {kind!r} for {name!r}")  # a registry bug


def normalize_kwargs(instruction_id: str, kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validated kwargs for ``instruction_id``: ``None`` values dropped, every name known, none missing."""
    params = instruction_parameters(instruction_id)
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise InstructionArgumentError(f"{instruction_id}: kwargs must be a mapping, got {type(kwargs).__name__}")
    given = {name: value for name, value in (kwargs or {}).items() if value is not None}
    unknown = sorted(set(given) - set(params))
    if unknown:
        raise InstructionArgumentError(
            f"{instruction_id}: unknown kwarg(s) {unknown}; this instruction takes {sorted(params) or 'none'}"
        )
    missing = sorted(set(params) - set(given))
    if missing:
        raise InstructionArgumentError(f"{instruction_id}: missing kwarg(s) {missing}")
    return {name: _coerce(instruction_id, name, value, params[name]) for name, value in given.items()}


def check_instruction(instruction_id: str, response: str, kwargs: Mapping[str, Any] | None = None) -> bool:
    """Whether ``response`` follows the instruction ``instruction_id`` with ``kwargs`` (strict: as written)."""
    checker = get_checker(instruction_id)
    arguments = normalize_kwargs(instruction_id, kwargs)
    try:
        return bool(checker(response, **arguments))
    except ValueError as err:
        raise InstructionArgumentError(f"{instruction_id}: {err}") from err


def validate_instructions(
    instruction_id_list: Sequence[str], kwargs_list: Sequence[Mapping[str, Any] | None], where: str = ""
) -> None:
    """Check a row's instruction ids and kwargs up front; errors are prefixed with ``where`` (file:line, key)."""
    prefix = f"{where}: " if where else ""
    if isinstance(instruction_id_list, str) or not isinstance(instruction_id_list, Sequence):
        raise InstructionArgumentError(f"{prefix}instruction_id_list must be a list of ids")
    if not instruction_id_list:
        raise InstructionArgumentError(f"{prefix}instruction_id_list is empty")
    if len(instruction_id_list) != len(kwargs_list):
        raise InstructionArgumentError(
            f"{prefix}instruction_id_list has {len(instruction_id_list)} ids but kwargs has {len(kwargs_list)} entries"
        )
    for instruction_id, kwargs in zip(instruction_id_list, kwargs_list, strict=True):
        try:
            normalize_kwargs(instruction_id, kwargs)
        except ValueError as err:
            raise type(err)(f"{prefix}{err}") from None
