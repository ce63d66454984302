"""IFEval checkers of the ``language:``, ``change_case:`` and ``punctuation:`` families."""

from __future__ import annotations

from llmrl_core.envs.ifeval.text import Relation, compare, count_capital_words, is_language


def check_response_language(response: str, *, language: str) -> bool:
    """``language:response_language``: the whole response is detected as ``language`` (ISO 639-1, e.g. ``de``)."""
    return is_language(response, language)


def check_english_capital(response: str) -> bool:
    """``change_case:english_capital``: all cased characters are upper case and the text is English."""
    return response.isupper() and is_language(response, "en")


def check_english_lowercase(response: str) -> bool:
    """``change_case:english_lowercase``: all cased characters are lower case and the text is English."""
    return response.islower() and is_language(response, "en")


def check_capital_word_frequency(response: str, *, capital_frequency: int, capital_relation: Relation) -> bool:
    """``change_case:capital_word_frequency``: the number of ALL-CAPS words is ``capital_relation`` the frequency."""
    return compare(count_capital_words(response), capital_frequency, capital_relation)


def check_no_comma(response: str) -> bool:
    """``punctuation:no_comma``: the response contains no comma."""
    return "," not in response
