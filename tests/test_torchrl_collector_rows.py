"""The collector's dialog-turn batches against TorchRL 0.14.1's, entry by entry (``api_probes.json``
``collector_rows_layout``: the probe of ``tests/torchrl_layout_probes.py``, run there by ``scripts/torchrl_goldens.py``
and here on llmrl)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from llmrl_core.collectors import LLMCollector
from llmrl_core.data import History
from llmrl_core.envs import ChatEnv
from llmrl_core.envs.reward import GSM8KRewardParser, IfEvalScorer
from llmrl_core.modules import TransformersWrapper
from llmrl_core.modules.policies import ChatHistory, Text
from tests.torchrl_layout_probes import collector_rows_layout, library

# llmrl's own entries at a row's root (the flows and `rows(batch)` read them); TorchRL's rows have none
LLMRL_ROOT_EXTRAS = {"reward": [[2, 2, 1], "torch.float32"], "truncated": [[2, 2, 1], "torch.bool"]}
# A text-mode response keeps its end-of-turn token in llmrl (README: departures on purpose), so the four responses
# are all 6 tokens long and stack; TorchRL drops it and its rows differ in length
TEXT_RESPONSES = ("('log_probs', 'response')", "('tokens', 'response')")


def test_dialog_turn_batches_hold_torchrls_entries(default_model_path):
    """With a reward parser and a TorchRL-style policy, a dialog-turn batch has every entry TorchRL's has, with its
    shape and dtype: the policy's prompt/full ids and attention mask beside the answer, the parser's reward
    ``(…, 1, 1)`` and parts under ``"next"``, no ``("next", "truncated")`` (the env cannot cut short); llmrl adds
    only its root ``reward`` and ``truncated``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_path)
    model = AutoModelForCausalLM.from_pretrained(default_model_path, dtype=torch.float32).eval()
    api = library(
        ChatEnv, History, ChatHistory, Text, GSM8KRewardParser, IfEvalScorer, LLMCollector, TransformersWrapper
    )
    ours = collector_rows_layout(api, model, tokenizer)
    golden = json.loads((Path(__file__).parent / "goldens/torchrl/api_probes.json").read_text())[
        "collector_rows_layout"
    ]
    for mode in ("history", "text"):
        expected, got = golden[mode], ours[mode]
        assert got["batch_size"] == expected["batch_size"] == [2, 2]
        entries = dict(got["entries"])
        for key, layout in LLMRL_ROOT_EXTRAS.items():
            assert entries.pop(key) == layout and key not in expected["entries"]
        wanted = dict(expected["entries"])
        if mode == "text":
            for key in TEXT_RESPONSES:
                assert wanted.pop(key) == "ragged" and entries.pop(key)[0] == [2, 2, 6]
        assert entries == wanted
        assert wanted["('next', 'reward')"] == [[2, 2, 1, 1], "torch.float32"]
        assert wanted["('tokens', 'full')"] == "ragged" and "('next', 'truncated')" not in wanted
