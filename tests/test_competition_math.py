"""MATH (``MATHEnv``, ``MATHRewardParser``) against TorchRL 0.14.1 run on the same local dataset
(``scripts/torchrl_math_goldens.py`` -> ``goldens/torchrl/math.json``): the same prompts and answers reset after
reset, the same step outputs for each response, the same boxed answers and matches; and the clear error where
TorchRL's default dataset id is not on this machine."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from llmrl_core.data import History
from llmrl_core.envs import MATHEnv as FromEnvs
from llmrl_core.envs.datasets.math import MATHEnv
from llmrl_core.envs.reward.math import MATHRewardParser

GOLDEN = json.loads((Path(__file__).parent / "goldens" / "torchrl" / "math.json").read_text())
_spec = importlib.util.spec_from_file_location(
    "math_cases", Path(__file__).parents[1] / "scripts" / "torchrl_math_goldens.py"
)
CASES = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(CASES)
STEP_KEYS = ("reward", "reward_answer", "reward_think", "reward_right", "success", "done", "terminated")


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(default_model_path)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return CASES.write_dataset(tmp_path_factory.mktemp("math") / "math")


@pytest.mark.parametrize("name", sorted(CASES.RESETS))
def test_resets_give_torchrls_prompts_and_answers(name, tokenizer, folder):
    assert FromEnvs is MATHEnv
    env = MATHEnv(dataset=str(folder), tokenizer=tokenizer, shuffle=False, **CASES.RESETS[name]["kwargs"])
    for i, theirs in enumerate(GOLDEN["resets"][name]):
        td = env.reset()
        prompt = td["history", "prompt"]
        assert (prompt.role, prompt.content) == (theirs["roles"], theirs["contents"]), (name, i)
        assert list(td["answer"]) == theirs["answers"], (name, i)


@pytest.mark.parametrize("index", range(len(CASES.RESPONSES)))
def test_each_response_is_scored_as_torchrl_scores_it(index, tokenizer, folder):
    env = MATHEnv(dataset=str(folder), tokenizer=tokenizer, shuffle=False)
    td = env.reset()
    theirs = GOLDEN["responses"][index]
    reply = History(role="assistant", content=theirs["text"], batch_size=(1,)).unsqueeze(-1)
    td["history", "full"] = td["history", "prompt"].extend(reply, inplace=False, dim=-1)
    td["history", "response"] = reply
    out = env.step(td)["next"]
    for key in STEP_KEYS:
        expected = torch.tensor(theirs[key])
        assert out[key].shape == expected.shape and out[key].dtype == expected.dtype, (key, out[key])
        torch.testing.assert_close(out[key], expected, msg=f"{key} for {theirs['text']!r}")


def test_boxed_answers_and_matches_are_torchrls():
    assert [t for t, _ in GOLDEN["boxed"]] == CASES.BOXED
    assert [[t, MATHRewardParser.extract_boxed(t)] for t in CASES.BOXED] == GOLDEN["boxed"]
    assert [m[:2] for m in GOLDEN["matches"]] == CASES.MATCHES
    assert [[a, b, MATHRewardParser.answers_match(a, b)] for a, b in CASES.MATCHES] == GOLDEN["matches"]


def test_without_math_verify_answers_compare_as_normalised_text(monkeypatch):
    import importlib.util as util

    real = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda name, *a: None if name == "math_verify" else real(name, *a))
    assert not MATHRewardParser.answers_match("0.5", "\\frac{1}{2}")  # math-verify says equal
    assert MATHRewardParser.answers_match("(1, 2)", "\\left( 1, 2 \\right)")
    assert MATHRewardParser.answers_match("1,000", "$1000$")
    # ',' goes before '\,' (as in TorchRL), so LaTeX's thin space leaves its backslash behind
    assert not MATHRewardParser.answers_match("x\\!=\\,3", "x=3")


def test_rows_in_memory_and_a_collate_fn_work_as_a_folder_does(tokenizer):
    rows = [dict(r) for r in CASES.ROWS]
    env = MATHEnv(dataset=rows, tokenizer=tokenizer, shuffle=False, format_reward=0.3)
    td = env.reset()
    assert td["answer"][0] == CASES.ROWS[0]["solution"]
    assert env.td_transforms[-1].score_row("<answer>5</answer>", {"answer": CASES.ROWS[0]["solution"]})["reward"] == 0.3

    def collate(batch):  # a user's collate_fn replaces the renaming, as in TorchRL
        return [{"query": r["problem"].upper(), "answer": r["solution"]} for r in batch]

    env = MATHEnv(dataset=rows, tokenizer=tokenizer, shuffle=False, collate_fn=collate)
    assert env.reset()["history", "prompt"].content[0][-1] == CASES.ROWS[0]["problem"].upper()


def test_the_default_dataset_id_offline_says_what_to_pass(tokenizer):
    with pytest.raises(FileNotFoundError, match=r"MATHEnv: dataset 'DigitalLearningGmbH/MATH-lighteval' .*'problem'"):
        MATHEnv(tokenizer=tokenizer)
