"""IFEval checkers of the ``keywords:`` family: required, counted and forbidden words, and letter counts.

Every checker takes the response text first and the instruction's kwargs as keyword arguments, and returns
whether the response follows the instruction. Matching is case-insensitive like IFEval's. Keywords are
matched literally (IFEval passes them to ``re`` unescaped, so a keyword such as ``c++`` would be a pattern).
"""

from __future__ import annotations

import re

from llmrl_core.envs.ifeval.text import Relation, compare


def check_keywords_existence(response: str, *, keywords: list[str]) -> bool:
    """``keywords:existence``: every keyword occurs somewhere in the response (as a substring)."""
    return all(re.search(re.escape(keyword), response, flags=re.IGNORECASE) for keyword in keywords)


def check_keyword_frequency(response: str, *, keyword: str, frequency: int, relation: Relation) -> bool:
    """``keywords:frequency``: the keyword occurs ``relation`` ``frequency`` times (substring occurrences)."""
    occurrences = len(re.findall(re.escape(keyword.strip()), response, flags=re.IGNORECASE))
    return compare(occurrences, frequency, relation)


def check_forbidden_words(response: str, *, forbidden_words: list[str]) -> bool:
    """``keywords:forbidden_words``: none of the words occurs as a whole word."""
    return not any(
        re.search(r"\b" + re.escape(word) + r"\b", response, flags=re.IGNORECASE) for word in forbidden_words
    )


def check_letter_frequency(response: str, *, letter: str, let_frequency: int, let_relation: Relation) -> bool:
    """``keywords:letter_frequency``: the character occurs ``let_relation`` ``let_frequency`` times, any case.

    The shipped prompts also ask for symbols this way ('#' for hashtags, '!' for exclamation marks); the
    symbol itself is counted. (IFEval replaces a non-letter with a random letter, which makes those two
    prompts score at random.)
    """
    if len(letter) != 1:
        raise ValueError(f"letter must be a single character, got {letter!r}")
    return compare(response.lower().count(letter.lower()), let_frequency, let_relation)
