"""The GSM8K copy shipped in the package: intact, licensed, and parsed with clear errors."""

from __future__ import annotations

import hashlib

import pytest

from llmrl_core import builtin_data

# SHA-256 of the upstream openai/grade-school-math files (recorded in gsm8k/SOURCE.txt): pins the shipped copies.
EXPECTED_SHA256 = {
    "train": "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
    "test": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
}


@pytest.mark.parametrize("split,rows", [("train", 7473), ("test", 1319)])
def test_shipped_gsm8k_is_the_upstream_file(split, rows):
    path = builtin_data.gsm8k_path(split)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == EXPECTED_SHA256[split]
    data = builtin_data.load_gsm8k(split)
    assert len(data) == rows
    assert all("####" in r["answer"] for r in data)


def test_license_and_source_are_shipped():
    folder = builtin_data.gsm8k_path().parent
    assert "MIT License" in (folder / "LICENSE").read_text()
    assert "grade-school-math" in (folder / "SOURCE.txt").read_text()


def test_gold_answer_and_errors(tmp_path, monkeypatch):
    first = builtin_data.load_gsm8k("test", limit=1)[0]
    assert builtin_data.gsm8k_gold(first["answer"]) == "18"
    with pytest.raises(ValueError, match="####"):
        builtin_data.gsm8k_gold("no marker")
    with pytest.raises(ValueError, match="unknown GSM8K split"):
        builtin_data.gsm8k_path("validation")
    bad = tmp_path / "gsm8k" / "test.jsonl"
    bad.parent.mkdir()
    bad.write_text('{"question": "q", "answer": "a #### 1"}\n{"question": "q2"}\n')
    monkeypatch.setattr(builtin_data, "_ROOT", tmp_path)
    with pytest.raises(ValueError, match=r"test.jsonl:2: missing field\(s\) \['answer'\]"):
        builtin_data.load_gsm8k("test")
