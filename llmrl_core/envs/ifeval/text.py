"""Text measurements shared by the IFEval checkers: words, sentences, capital words, language.

Design choices
- Words are maximal runs of ``\\w`` characters, the same rule IFEval uses (nltk's ``RegexpTokenizer(r"\\w+")``),
  written as one regular expression so no nltk is needed.
- Sentences: IFEval counts them with nltk's trained Punkt model, whose data is a separate download
  (``nltk.download("punkt")``) that cannot happen on an offline machine. We split with a small rule set
  instead: a sentence ends at ``.``, ``!`` or ``?`` (possibly repeated, possibly followed by closing quotes or
  brackets) followed by whitespace or the end of the text, except after a known abbreviation ("Dr.", "e.g."),
  a single-letter initial ("J. Smith") or a list number at the start of a line ("1. Apples"). Like Punkt,
  a bare line break does not end a sentence. On ordinary prose this gives the count a reader would; it can
  differ from Punkt's on abbreviations outside our list (Punkt learned its list from a corpus).
- Capital words (``change_case:capital_word_frequency``): IFEval tokenizes with ``nltk.word_tokenize`` (also
  Punkt data). We take words as ``\\w`` runs joined by hyphens or apostrophes ("WELL-KNOWN" is one word) and
  count those that are all upper case.
- Language: ``langdetect`` (the library IFEval itself uses; its profiles ship inside the wheel, nothing is
  downloaded). A private detector factory is seeded once, so results are deterministic and no global state
  of the library is touched. Text in which no language can be detected (digits, punctuation) counts as *not*
  in the requested language; IFEval counts it as followed, which a policy could farm.
"""

from __future__ import annotations

import re
import threading
from typing import Literal

Relation = Literal["less than", "at least"]
RELATIONS: tuple[str, ...] = ("less than", "at least")

_WORD = re.compile(r"\w+")
_CAPITAL_WORD = re.compile(r"\w+(?:[-'’]\w+)*")
# End punctuation, then optional closing quotes/brackets, then whitespace or the end of the text.
_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s|$)")
_LAST_TOKEN = re.compile(r"(\S+)$")
_ABBREVIATIONS = frozenset(
    {
        "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "capt", "lt", "col", "gen", "sgt", "rev", "hon",
        "vs", "etc", "e.g", "i.e", "cf", "al", "approx", "inc", "ltd", "co", "corp", "dept", "fig", "no", "nos",
        "vol", "p", "pp", "ph.d", "u.s", "u.k", "a.m", "p.m", "jan", "feb", "mar", "apr", "jun", "jul", "aug",
        "sep", "sept", "oct", "nov", "dec", "est", "ave", "blvd",
    }
)  # fmt: skip


def count_words(text: str) -> int:
    """Number of words: maximal runs of word characters (letters, digits, underscore)."""
    return len(_WORD.findall(text))


def _is_false_boundary(text: str, end: int, punct: str) -> bool:
    """Whether the ``.`` ending at ``end`` belongs to an abbreviation, an initial or a list number."""
    if not punct.startswith(".") or punct.strip(".\"'”’)]") or punct.count(".") > 1:
        return False
    match = _LAST_TOKEN.search(text, 0, end)
    if match is None:
        return False
    token = match.group(1).lstrip("\"'“‘([*")
    word = token.rstrip("\"'”’)]").removesuffix(".")
    if word.lower() in _ABBREVIATIONS:
        return True
    if len(word) == 1 and word.isalpha() and word.isupper() and word != "I":
        return True  # an initial, e.g. "J. Smith" (but "... so do I." ends a sentence)
    if word.isdigit():
        line_start = text.rfind("\n", 0, match.start()) + 1
        return not text[line_start : match.start()].strip()  # "1. Apples" at the start of a line
    return False


def split_sentences(text: str) -> list[str]:
    """Split ``text`` into sentences (see the module docstring for the rules); empty pieces are dropped."""
    sentences: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        if _is_false_boundary(text, match.start() + 1, match.group(0)):
            continue
        piece = text[start : match.end()].strip()
        if piece:
            sentences.append(piece)
        start = match.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def count_sentences(text: str) -> int:
    """Number of sentences in ``text``."""
    return len(split_sentences(text))


def count_capital_words(text: str) -> int:
    """Number of words written entirely in capital letters (hyphenated words count once)."""
    return sum(1 for word in _CAPITAL_WORD.findall(text) if word.isupper())


def compare(count: int, threshold: int, relation: str) -> bool:
    """IFEval's two relations: ``"less than"`` is ``count < threshold``; ``"at least"`` is ``count >= threshold``."""
    if relation == "less than":
        return count < threshold
    if relation == "at least":
        return count >= threshold
    raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")


_detector_lock = threading.Lock()
_detector_factory = None


def _factory():
    """The seeded langdetect factory, loaded once (profiles take ~0.3 s to read)."""
    global _detector_factory
    with _detector_lock:
        if _detector_factory is None:
            from langdetect.detector_factory import PROFILES_DIRECTORY, DetectorFactory

            factory = DetectorFactory()
            factory.load_profile(PROFILES_DIRECTORY)
            factory.set_seed(0)
            _detector_factory = factory
        return _detector_factory


def detect_language(text: str) -> str | None:
    """ISO 639-1 code of the language of ``text`` (langdetect, seeded); ``None`` when none can be detected."""
    from langdetect.lang_detect_exception import LangDetectException

    detector = _factory().create()
    detector.append(text)
    try:
        return detector.detect()
    except LangDetectException:
        return None


def is_language(text: str, language: str) -> bool:
    """Whether ``text`` is detected as ``language``; a bare code such as ``zh`` also accepts ``zh-cn``/``zh-tw``."""
    detected = detect_language(text)
    if detected is None:
        return False
    wanted = language.lower()
    return detected == wanted or ("-" not in wanted and detected.split("-")[0] == wanted)
