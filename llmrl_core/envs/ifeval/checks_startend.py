"""IFEval checkers of the ``startend:`` and ``combination:`` families: how a response begins, ends and splits."""

from __future__ import annotations

RESPONSE_SEPARATOR = "******"


def check_end_checker(response: str, *, end_phrase: str) -> bool:
    """``startend:end_checker``: the response ends with ``end_phrase`` (case-insensitive; outer quotes ignored)."""
    return response.strip().strip('"').lower().endswith(end_phrase.strip().lower())


def check_quotation(response: str) -> bool:
    """``startend:quotation``: the whole response is wrapped in double quotation marks."""
    text = response.strip()
    return len(text) > 1 and text[0] == '"' and text[-1] == '"'


def check_two_responses(response: str) -> bool:
    """``combination:two_responses``: two different responses separated by six asterisks ``******``.

    Empty pieces are allowed only before the first or after the last separator.
    """
    pieces = response.split(RESPONSE_SEPARATOR)
    answers = []
    for index, piece in enumerate(pieces):
        if piece.strip():
            answers.append(piece.strip())
        elif index not in (0, len(pieces) - 1):
            return False
    return len(answers) == 2 and answers[0] != answers[1]


def check_repeat_prompt(response: str, *, prompt_to_repeat: str) -> bool:
    """``combination:repeat_prompt``: the response starts with the request repeated word for word (any case)."""
    return response.strip().lower().startswith(prompt_to_repeat.strip().lower())
