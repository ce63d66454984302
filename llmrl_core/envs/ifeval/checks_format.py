"""IFEval checkers of the ``detectable_format:`` and ``detectable_content:`` families.

Markdown-based checks (bullets, highlights, titles, sections, postscripts, placeholders, JSON) and the fixed
"My answer is yes/no/maybe." response. Patterns follow IFEval; markers from the kwargs are matched literally.
"""

from __future__ import annotations

import json
import re

CONSTRAINED_RESPONSES: tuple[str, ...] = ("My answer is yes.", "My answer is no.", "My answer is maybe.")

_STAR_BULLET = re.compile(r"^\s*\*[^*].*$", flags=re.MULTILINE)
_DASH_BULLET = re.compile(r"^\s*-.*$", flags=re.MULTILINE)
_SINGLE_HIGHLIGHT = re.compile(r"\*[^\n*]*\*")
_DOUBLE_HIGHLIGHT = re.compile(r"\*\*[^\n*]*\*\*")
_TITLE = re.compile(r"<<[^\n]+>>")
_PLACEHOLDER = re.compile(r"\[.*?\]")
_PS_PATTERNS = {
    # IFEval accepts optional spaces inside the two standard markers ("P. S.", "P.P.S", "p. p. s").
    "p.s.": r"p\.\s?s\.",
    "p.p.s": r"p\.\s?p\.\s?s",
}


def check_constrained_response(response: str) -> bool:
    """``detectable_format:constrained_response``: contains "My answer is yes.", "... no." or "... maybe."."""
    text = response.strip()
    return any(option in text for option in CONSTRAINED_RESPONSES)


def check_json_format(response: str) -> bool:
    """``detectable_format:json_format``: the whole response parses as JSON (a markdown code fence is allowed)."""
    text = response.strip()
    for fence in ("```json", "```Json", "```JSON", "```"):
        if text.startswith(fence):
            text = text[len(fence) :]
            break
    text = text.removesuffix("```").strip()
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def check_multiple_sections(response: str, *, section_spliter: str, num_sections: int) -> bool:
    """``detectable_format:multiple_sections``: at least ``num_sections`` headers "<spliter> <number>".

    The splitter is case-sensitive ("SECTION 1" does not count for "Section"). IFEval spells the kwarg
    ``section_spliter``; we keep its spelling so dataset rows pass through unchanged.
    """
    pattern = r"\s?" + re.escape(section_spliter.strip()) + r"\s?\d+\s?"
    return len(re.split(pattern, response)) - 1 >= num_sections


def check_number_bullet_lists(response: str, *, num_bullets: int) -> bool:
    """``detectable_format:number_bullet_lists``: exactly ``num_bullets`` lines that start with ``*`` or ``-``."""
    return len(_STAR_BULLET.findall(response)) + len(_DASH_BULLET.findall(response)) == num_bullets


def check_number_highlighted_sections(response: str, *, num_highlights: int) -> bool:
    """``detectable_format:number_highlighted_sections``: at least ``num_highlights`` non-empty ``*spans*``.

    As in IFEval, ``**bold**`` counts once (through the double-star pattern) and ``*italic*`` once.
    """
    singles = sum(1 for span in _SINGLE_HIGHLIGHT.findall(response) if span.strip("*").strip())
    doubles = sum(1 for span in _DOUBLE_HIGHLIGHT.findall(response) if span[2:-2].strip())
    return singles + doubles >= num_highlights


def check_title(response: str) -> bool:
    """``detectable_format:title``: a non-empty title in double angular brackets, e.g. ``<<Poem of joy>>``."""
    return any(title.lstrip("<").rstrip(">").strip() for title in _TITLE.findall(response))


def check_number_placeholders(response: str, *, num_placeholders: int) -> bool:
    """``detectable_content:number_placeholders``: at least ``num_placeholders`` ``[placeholders]``."""
    return len(_PLACEHOLDER.findall(response)) >= num_placeholders


def check_postscript(response: str, *, postscript_marker: str) -> bool:
    """``detectable_content:postscript``: a postscript starting with the marker (e.g. "P.S.", "P.P.S").

    Case-insensitive; as in IFEval the marker may appear anywhere in the response, not only at the end.
    """
    marker = postscript_marker.strip().lower()
    pattern = _PS_PATTERNS.get(marker, re.escape(marker))
    return re.search(pattern, response.lower()) is not None
