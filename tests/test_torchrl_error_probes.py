"""llmrl raises what TorchRL 0.14.1 raises for the misuses its documents name (and accepts the valid calls beside
them): every probe of tests/torchrl_error_probes.py, run against llmrl's classes (the one porting rule), compared
with what the same call did in TorchRL (tests/goldens/torchrl/api_probes.json)."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest
from torchrl_error_probes import error_probes

from llmrl_core.collectors import LLMCollector
from llmrl_core.data import History
from llmrl_core.envs import ChatEnv, DatasetChatEnv
from llmrl_core.envs.transforms import DataLoadingPrimer, KLComputation, KLRewardTransform, RetrieveKL, RetrieveLogProb
from llmrl_core.envs.transforms.kl import RayKLRewardTransform, RayRetrieveKL
from llmrl_core.modules import TransformersWrapper

PROBES_FILE = Path(__file__).parent / "goldens" / "torchrl" / "api_probes.json"
RECORDED = {probe["name"]: probe for probe in json.loads(PROBES_FILE.read_text())["error_probes"]}
API = {
    "LLMCollector": LLMCollector, "History": History, "ChatEnv": ChatEnv, "DatasetChatEnv": DatasetChatEnv,
    "DataLoadingPrimer": DataLoadingPrimer, "KLComputation": KLComputation, "KLRewardTransform": KLRewardTransform,
    "RetrieveKL": RetrieveKL, "RetrieveLogProb": RetrieveLogProb, "RayKLRewardTransform": RayKLRewardTransform,
    "RayRetrieveKL": RayRetrieveKL, "TransformersWrapper": TransformersWrapper,
}  # fmt: skip


# Where llmrl departs from what TorchRL 0.14.1 does, on purpose: the call is what TorchRL's documents show (their
# text is the spec) or TorchRL fails inside itself (a crash, not a documented refusal). name -> what llmrl does.
DEPARTURES = {
    "KLComputation: docstring keyword names": "accepted: the docstring's keyword names are the spec",
    "KLComputation: reward (2, 10, 1) with log-probs (2, 10) (the docstring's data, valid keywords)": "accepted",
    "KLComputation: missing log-probs": "ValueError naming the keys (TorchRL: an AttributeError inside itself)",
    "KLComputation: reward without the extra trailing dim": "ValueError naming the shapes (TorchRL: a nested-tensor "
    "internal error)",
    "KLRewardTransform: two positional models (the legacy docstring call)": "accepted: the legacy docstring call",
    "KLRewardTransform: use_ray_service=True": "accepted: the Dask-hosted RayKLRewardTransform (TorchRL crashes)",
    "ChatEnv: reset without the 'query' key": "accepted: TorchRL's older `text=` reset field is read",
    "DatasetChatEnv: list_to_stack disabled": "accepted: llmrl does not need tensordict's list_to_stack",
    "LLMCollector: async_envs=True with a plain env": "accepted: llmrl's async schedule runs a list of plain envs",
    "LLMCollector: no dialog_turns_per_batch (required in the seed's signature)": "accepted: the seeds' own "
    "examples leave it out (TorchRL crashes on None % int)",
}


def _same_error(ours: BaseException, recorded: str) -> bool:
    """llmrl's exception is TorchRL's kind: an instance of the recorded builtin class, else of the same name."""
    kind = getattr(builtins, recorded, None)
    return isinstance(ours, kind) if isinstance(kind, type) else type(ours).__name__ == recorded


@pytest.fixture(scope="module")
def probes(default_model_path):
    return {name: fn for name, _, _, fn in error_probes(API, default_model_path)}


def test_every_recorded_probe_is_run(probes):
    assert set(probes) == set(RECORDED) and len(RECORDED) == 50
    assert set(DEPARTURES) <= set(RECORDED)


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_llmrl_raises_what_torchrl_raises(name, probes):
    theirs = RECORDED[name]
    try:
        result = probes[name]()
    except Exception as err:  # noqa: BLE001 - the kind is what is compared
        ours = type(err).__name__
        if name in DEPARTURES:
            assert DEPARTURES[name].startswith(ours), f"{name}: llmrl raised {ours} ({err}); see DEPARTURES"
            return
        assert theirs["raised"], f"{name}: llmrl raised {ours}: {err}; TorchRL accepted the call"
        assert _same_error(err, theirs["type"]), f"{name}: llmrl raised {ours} ({err}); TorchRL: {theirs['message']}"
        return
    close = getattr(result, "close", None)
    if callable(close):
        close()
    if name in DEPARTURES:
        assert DEPARTURES[name].startswith("accepted"), f"{name}: llmrl accepted it; expected {DEPARTURES[name]}"
        return
    assert not theirs["raised"], f"{name}: llmrl accepted the call; TorchRL raised {theirs['type']}"
