"""The 25 IFEval instruction checkers, the text measurements behind them, the registry and the shipped prompts."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import pytest

from llmrl_core.builtin_data.ifeval_data import IFEVAL_NUM_ROWS, ifeval_path, load_ifeval
from llmrl_core.envs.ifeval.registry import (
    INSTRUCTION_IDS,
    InstructionArgumentError,
    UnknownInstructionError,
    check_instruction,
    normalize_kwargs,
    validate_instructions,
)
from llmrl_core.envs.ifeval.text import count_capital_words, count_sentences, count_words, detect_language

FIVE_DIVIDED = "One.\n***\nTwo.\n***\nThree."
PARAS = "Weekend plans are fun.\n\nAsk her kindly.\n\nBe yourself.\n\nGood luck."

# (instruction id, kwargs, response, expected). Every id has at least one True and one False row.
# Expected values from TorchRL 0.14.1 (its IFEval checkers run on these exact inputs, langdetect seeded 0)
# for every row except those marked "by hand": TorchRL needs nltk's Punkt data for number_sentences and
# capital_word_frequency, and picks a random letter when asked to count a symbol.
CASES = [
    ("keywords:existence", {"keywords": ["cat", "knock"]}, "The Cat knocked twice.", True),
    ("keywords:existence", {"keywords": ["cat", "knock"]}, "The cat left.", False),
    ("keywords:existence", {"keywords": ["c++"]}, "I write C++ daily.", True),  # by hand: literal, not a regex
    ("keywords:frequency", {"keyword": "war", "frequency": 3, "relation": "at least"}, "War, war and WAR.", True),
    ("keywords:frequency", {"keyword": "war", "frequency": 3, "relation": "at least"}, "War and peace.", False),
    ("keywords:frequency", {"keyword": "sarah", "frequency": 2, "relation": "less than"}, "Sarah said hi.", True),
    ("keywords:frequency", {"keyword": "sarah", "frequency": 2, "relation": "less than"}, "Sarah, sarah!", False),
    ("keywords:forbidden_words", {"forbidden_words": ["rock", "jazz"]}, "Rocky roads and rockets.", True),
    ("keywords:forbidden_words", {"forbidden_words": ["rock", "jazz"]}, "I love Rock music.", False),
    ("keywords:letter_frequency", {"letter": "o", "let_frequency": 3, "let_relation": "at least"}, "Oh no, Otto", True),
    ("keywords:letter_frequency", {"letter": "o", "let_frequency": 3, "let_relation": "at least"}, "Hi there", False),
    ("keywords:letter_frequency", {"letter": "t", "let_frequency": 2, "let_relation": "less than"}, "Hat", True),
    # by hand: the shipped prompts ask for '#' (hashtags) and '!' this way; the symbol itself is counted
    ("keywords:letter_frequency", {"letter": "#", "let_frequency": 4, "let_relation": "at least"}, "#a #b #c #d", True),
    ("keywords:letter_frequency", {"letter": "#", "let_frequency": 4, "let_relation": "at least"}, "#a #b", False),
    ("language:response_language", {"language": "de"}, "Das ist ein kurzer deutscher Text über das Wetter.", True),
    ("language:response_language", {"language": "de"}, "This is a short English text about the weather.", False),
    ("language:response_language", {"language": "hi"}, "यह आज के मौसम के बारे में हिंदी पाठ है।", True),
    ("language:response_language", {"language": "de"}, "12345 !!!", False),  # by hand: undetectable is not German
    # by hand (sentences): "A." is an initial, "Dr." an abbreviation; see also test_count_sentences_by_hand
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"}, "One. Two!", True),
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"}, "A. Bee? Sea! Dee.", False),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "at least"}, "Dr. Smith came.", False),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "at least"}, "He came. I left.", True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3}, FIVE_DIVIDED, True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3}, "***\n" + FIVE_DIVIDED + "\n***", True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3}, "One.\n***\n***\nTwo.\n***\nThree.", False),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, FIVE_DIVIDED, False),
    ("length_constraints:number_words", {"num_words": 5, "relation": "at least"}, "one two three four five", True),
    ("length_constraints:number_words", {"num_words": 5, "relation": "at least"}, "one two three-four", False),
    ("length_constraints:number_words", {"num_words": 3, "relation": "less than"}, "hi there", True),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 4, "nth_paragraph": 1, "first_word": "weekend"},
        PARAS,
        True,
    ),  # fmt: skip
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 4, "nth_paragraph": 2, "first_word": "ask"},
        '"' + PARAS,
        True,
    ),  # fmt: skip
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 4, "nth_paragraph": 1, "first_word": "ask"},
        PARAS,
        False,
    ),  # fmt: skip
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 3, "nth_paragraph": 1, "first_word": "weekend"},
        PARAS,
        False,
    ),  # fmt: skip
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], see [address].", True),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], see you.", False),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Bye.\nP.S. call me", True),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Bye.\np. s. call me", True),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Bye.\nP.S. call me", False),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Bye.\nP.P.S call me", True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3}, "Intro\n* a\n* b\n- c", True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3}, "* a\n* b", False),
    ("detectable_format:number_bullet_lists", {"num_bullets": 1}, "**bold** line\n* a", True),
    ("detectable_format:constrained_response", {}, "Hmm. My answer is maybe.", True),
    ("detectable_format:constrained_response", {}, "My answer is yes", False),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 3}, "*a* and **b** and *c*", True),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 3}, "*a* and ** ** and *c*", False),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "Section", "num_sections": 2},
        "Section 1\nfoo\nSection 2\nbar",
        True,
    ),  # fmt: skip
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "Section", "num_sections": 2},
        "SECTION 1\nfoo\nSECTION 2\nbar",
        False,
    ),  # fmt: skip
    ("detectable_format:json_format", {}, '```json\n{"a": [1, 2]}\n```', True),
    ("detectable_format:json_format", {}, '{"a": 1}', True),
    ("detectable_format:json_format", {}, 'Here:\n{"a": 1}', False),
    ("detectable_format:title", {}, "<<Poem of Joy>>\nRoses are red", True),
    ("detectable_format:title", {}, "<< >>\nRoses are red", False),
    ("combination:two_responses", {}, "First answer.\n******\nSecond answer.", True),
    ("combination:two_responses", {}, "Same.\n******\nSame.", False),
    ("combination:two_responses", {}, "A\n******\n******\nB", False),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a poem."}, "write a poem. Roses are red.", True),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a poem."}, "Sure! Write a poem.", False),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, 'Done. "any other questions?"', True),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Any other questions? Bye.", False),
    ("startend:quotation", {}, '  "All of it."  ', True),
    ("startend:quotation", {}, 'Here: "All of it."', False),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "at least"},
        "The NASA and ESA teams met.",
        True,
    ),  # fmt: skip  by hand
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "at least"},
        "The Nasa team and WELL-KNOWN guests.",
        False,
    ),  # fmt: skip  by hand: a hyphenated word counts once
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 3, "capital_relation": "less than"},
        "STOP and GO.",
        True,
    ),  # fmt: skip  by hand
    ("change_case:english_capital", {}, "THIS IS ALL UPPERCASE ENGLISH TEXT ABOUT THE WEATHER TODAY.", True),
    ("change_case:english_capital", {}, "This is mixed case English text about the weather today.", False),
    ("change_case:english_capital", {}, "DAS IST EIN DEUTSCHER TEXT ÜBER DAS WETTER HEUTE.", False),
    ("change_case:english_lowercase", {}, "this is all lowercase english text about the weather today.", True),
    ("change_case:english_lowercase", {}, "This is not all lowercase english text about the weather.", False),
    ("punctuation:no_comma", {}, "No commas here at all.", True),
    ("punctuation:no_comma", {}, "One, two.", False),
]


def test_every_instruction_id_has_a_passing_and_a_failing_case():
    outcomes = {(iid, expected) for iid, _, _, expected in CASES}
    assert {iid for iid, _ in outcomes} == set(INSTRUCTION_IDS)
    assert len(INSTRUCTION_IDS) == 25
    for iid in INSTRUCTION_IDS:
        assert (iid, True) in outcomes and (iid, False) in outcomes, iid


@pytest.mark.parametrize(("instruction_id", "kwargs", "response", "expected"), CASES)
def test_checker(instruction_id, kwargs, response, expected):
    assert check_instruction(instruction_id, response, kwargs) is expected


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("", 0),
        ("Hello world", 1),
        ("Hello world. How are you? Fine!", 3),
        ("Dr. Smith met Mrs. Jones at 3.5 p.m. today.", 1),
        ("We use e.g. apples, i.e. fruit. Then stop.", 2),
        ("J. R. R. Tolkien wrote books. So do I. Really?!", 3),
        ('He said "stop." Then he left.', 2),
        ("1. Apples\n2. Pears\n3. Plums", 1),
        ("It was 2020. Then came 2021.", 2),
        ("Wait... what happened?", 2),
        ("Line one\nline two without a period", 1),
    ],
)
def test_count_sentences_by_hand(text, count):
    assert count_sentences(text) == count


def test_word_and_capital_word_counts():
    assert count_words("Don't stop-me now, it's 5 o'clock!") == 10  # \w+ runs, like IFEval's RegexpTokenizer
    assert count_words("") == 0
    assert count_capital_words("I SAID NO-WAY, ok? USA!") == 4  # I, SAID, NO-WAY, USA
    assert count_capital_words("no caps here 123") == 0


def test_language_detection_is_deterministic_and_tolerant():
    text = "Ceci est un court texte en français sur le temps qu'il fait."
    assert {detect_language(text) for _ in range(5)} == {"fr"}
    assert detect_language("12345 ...") is None
    assert check_instruction("language:response_language", "这是一个关于今天天气的中文句子。", {"language": "zh"})


def test_unknown_instruction_id_names_the_id():
    with pytest.raises(UnknownInstructionError, match=r"'keywords:existance'.*did you mean 'keywords:existence'"):
        check_instruction("keywords:existance", "text", {"keywords": ["a"]})
    with pytest.raises(UnknownInstructionError, match="'nonsense'"):
        validate_instructions(["nonsense"], [{}])


def test_kwargs_validation_errors_name_the_instruction_and_field():
    number_words = "length_constraints:number_words"
    with pytest.raises(InstructionArgumentError, match=r"number_words: missing kwarg\(s\) \['relation'\]"):
        check_instruction(number_words, "a b", {"num_words": 3})
    with pytest.raises(InstructionArgumentError, match=r"unknown kwarg\(s\) \['num_word'\]"):
        check_instruction(number_words, "a b", {"num_word": 3, "relation": "at least"})
    with pytest.raises(InstructionArgumentError, match="'relation' must be one of"):
        check_instruction(number_words, "a b", {"num_words": 3, "relation": "at most"})
    with pytest.raises(InstructionArgumentError, match="'num_words' must be an integer"):
        check_instruction(number_words, "a b", {"num_words": "3", "relation": "at least"})
    with pytest.raises(InstructionArgumentError, match="'keywords' must be a non-empty list"):
        check_instruction("keywords:existence", "a", {"keywords": "cat"})
    with pytest.raises(InstructionArgumentError, match="letter must be a single character"):
        check_instruction(
            "keywords:letter_frequency", "a", {"letter": "ab", "let_frequency": 1, "let_relation": "at least"}
        )
    with pytest.raises(InstructionArgumentError, match=r"row 7: instruction_id_list has 2 ids but kwargs has 1"):
        validate_instructions(["punctuation:no_comma", "startend:quotation"], [{}], where="row 7")


def test_hugging_face_style_kwargs_with_none_values_are_accepted():
    # google/IFEval on the Hub stores every kwarg name in every row, None where unused; floats may appear.
    hf_kwargs = {"num_highlights": None, "relation": "at least", "num_words": 3.0, "keywords": None}
    assert normalize_kwargs("length_constraints:number_words", hf_kwargs) == {"relation": "at least", "num_words": 3}
    assert check_instruction("length_constraints:number_words", "a b c", hf_kwargs)
    assert check_instruction("punctuation:no_comma", "a b", {"num_words": None, "keywords": None})


def test_shipped_prompt_file_is_the_documented_copy_and_every_row_validates():
    path = ifeval_path()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == "67ffeee0fcb87c317c5b08a2de85557b4a7e96ada6178aa645b4954fe4b53d49"
    assert digest in (path.parent / "SOURCE.txt").read_text()
    assert "Apache License" in (path.parent / "LICENSE").read_text()
    assert (path.parent / "NOTICE").is_file()
    rows = load_ifeval()
    assert len(rows) == IFEVAL_NUM_ROWS == 541
    ids = Counter(iid for row in rows for iid in row["instruction_id_list"])
    assert set(ids) == set(INSTRUCTION_IDS) and sum(ids.values()) == 834
    for row in rows:
        validate_instructions(row["instruction_id_list"], row["kwargs"], where=f"key {row['key']}")
    assert load_ifeval(limit=3) == rows[:3]


def test_loader_errors_name_file_line_and_field(tmp_path):
    good = {"key": 1, "prompt": "Hi", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}
    cases = [
        ("{not json", r"bad\.jsonl:2: not valid JSON"),
        (json.dumps({**good, "kwargs": [{}, {}]}), r"bad\.jsonl:2: 'instruction_id_list' has 1 entries but 'kwargs'"),
        (
            json.dumps({k: v for k, v in good.items() if k != "prompt"}),
            r"bad\.jsonl:2: missing field\(s\) \['prompt'\]",
        ),
        (json.dumps({**good, "key": "one"}), r"bad\.jsonl:2: field 'key' must be an integer"),
    ]
    for line, pattern in cases:
        path = tmp_path / "bad.jsonl"
        path.write_text(json.dumps(good) + "\n" + line + "\n")
        with pytest.raises(ValueError, match=pattern):
            load_ifeval(path)
