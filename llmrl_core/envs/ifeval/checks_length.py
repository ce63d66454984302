"""IFEval checkers of the ``length_constraints:`` family: sentences, words and paragraphs.

Paragraphs are separated by the markdown divider ``***`` for ``number_paragraphs`` and by a blank line
(``"\\n\\n"``) for ``nth_paragraph_first_word``, as in IFEval.
"""

from __future__ import annotations

import re

from llmrl_core.envs.ifeval.text import Relation, compare, count_sentences, count_words

_DIVIDER = re.compile(r"\s?\*\*\*\s?")
_FIRST_WORD_STOP = frozenset(".,?!'\"")


def check_number_sentences(response: str, *, num_sentences: int, relation: Relation) -> bool:
    """``length_constraints:number_sentences``: the sentence count is ``relation`` ``num_sentences``."""
    return compare(count_sentences(response), num_sentences, relation)


def check_number_words(response: str, *, num_words: int, relation: Relation) -> bool:
    """``length_constraints:number_words``: the word count is ``relation`` ``num_words``."""
    return compare(count_words(response), num_words, relation)


def check_number_paragraphs(response: str, *, num_paragraphs: int) -> bool:
    """``length_constraints:number_paragraphs``: exactly ``num_paragraphs`` paragraphs separated by ``***``.

    An empty piece is allowed only before the first or after the last divider; an empty paragraph in the
    middle (two dividers in a row) fails the instruction.
    """
    pieces = _DIVIDER.split(response)
    count = len(pieces)
    for index, piece in enumerate(pieces):
        if piece.strip():
            continue
        if index in (0, len(pieces) - 1):
            count -= 1
        else:
            return False
    return count == num_paragraphs


def _first_word(paragraph: str) -> str:
    """IFEval's first word: the first token, leading quotes dropped, cut at the first punctuation, lower case."""
    token = paragraph.split()[0].lstrip("'").lstrip('"')
    word = []
    for char in token:
        if char in _FIRST_WORD_STOP:
            break
        word.append(char)
    return "".join(word).lower()


def check_nth_paragraph_first_word(response: str, *, num_paragraphs: int, nth_paragraph: int, first_word: str) -> bool:
    """``length_constraints:nth_paragraph_first_word``: exactly ``num_paragraphs`` paragraphs (split on blank
    lines) and paragraph ``nth_paragraph`` (1-based) starts with ``first_word`` (case-insensitive).

    Paragraphs are the non-empty pieces; IFEval counts the non-empty pieces but indexes the raw ones, so
    four newlines in a row would shift its index. We index the same non-empty pieces we count.
    """
    if nth_paragraph < 1:
        raise ValueError(f"nth_paragraph must be >= 1, got {nth_paragraph}")
    paragraphs = [piece.strip() for piece in response.split("\n\n") if piece.strip()]
    if len(paragraphs) != num_paragraphs or nth_paragraph > len(paragraphs):
        return False
    return _first_word(paragraphs[nth_paragraph - 1]) == first_word.strip().lower()
