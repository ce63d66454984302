"""TorchRL's import paths, ported by the README's rule: ``from torchrl.<pkg>.llm[.<sub>] import N`` becomes
``from llmrl_core.<pkg>[.<sub>] import N`` for every public module of TorchRL 0.14.1's LLM packages and every name it
offers (``api_probes.json`` ``module_names``, recorded by ``scripts/torchrl_goldens.py`` in the side venv), except the
names llmrl does not implement, listed below with the reason. The list is checked both ways: a name listed as not
ported must really be missing, so porting one means taking it off the list."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

GOLDEN = json.loads((Path(__file__).parent / "goldens/torchrl/api_probes.json").read_text())["module_names"]

_NOT_PORTED_GROUPS: dict[str, tuple[str, ...]] = {
    "SGLang serving: llmrl serves with vLLM (and a transformers engine)": (
        "AsyncSGLang",
        "RLSGLangEngine",
        "SGLangWrapper",
        "get_open_port",
        "wait_for_server",
    ),
    "TorchRL's Ray/async vLLM engine classes: llmrl's engines are its vLLMWorker actors on Dask": (
        "AsyncVLLM",
        "LLM",
        "LoadBalancer",
        "LocalLLMWrapper",
        "RLvLLMEngine",
        "RayLLMWorker",
        "Worker",
        "make_async_vllm_engine",
        "stateless_init_process_group_async",
        "enable_fp32_overrides",
        "fp32_overrides_enabled",
        "register_fp32_overrides",
        "vLLMUpdaterMeta",
        "vLLMUpdaterV2",
        "RemoteTransformersWrapper",
    ),
    "IFEval's row class (llmrl's IFEval rows are the shipped data's dicts)": ("IFEvalData",),
    "TorchRL's Python process services: llmrl's PythonInterpreter runs model-written code in its sandbox": (
        "PersistentPythonProcess",
        "PythonExecutorService",
    ),
    "MLGym's internal transforms: llmrl's MLGymWrapper/make_mlgym are its own": (
        "EvaluationOutputParser",
        "IsolateCodeBlock",
        "MLGymBaseTransform",
        "MLGymRewardAssignment",
        "MessageToHistory",
        "ReadState",
        "ResetModule",
        "StateToMessage",
        "TaskSampler",
        "get_args",
    ),
    "TorchRL's earlier RLHF data pipeline (torchrl.data.llm dataset/prompt/reward/utils)": (
        "AdaptiveKLController",
        "ConstantKLController",
        "KLControllerBase",
        "PairwiseDataset",
        "PromptData",
        "PromptTensorDictTokenizer",
        "RewardData",
        "RolloutFromModel",
        "TensorDictTokenizer",
        "TokenizedDatasetLoader",
        "create_infinite_iterator",
        "get_dataloader",
        "pre_tokenization_hook",
        "add_chat_template",
    ),
    "other TorchRL internals: TRL interop, incremental tokenization, log-prob distribution": (
        "HFRewardModelWrapper",
        "TorchRLBufferDataset",
        "IncrementalTokenizer",
        "LogProbDistribution",
    ),
}
NOT_PORTED = {name: why for why, names in _NOT_PORTED_GROUPS.items() for name in names}
# (module, name) pairs whose name llmrl has, but elsewhere than TorchRL's module: the reason is the module's
NOT_AT_THIS_PATH = {
    ("torchrl.modules.llm.policies.common", "LLMWrapperBase"): "llmrl_core.modules.policies (its own module imports "
    "common: defining or re-exporting it there would be circular)",
    ("torchrl.envs.llm.libs.mlgym", "TemplateTransform"): "MLGym's own template transform; llmrl's TemplateTransform "
    "is llmrl_core.envs.transforms.format's",
}


def ported(module: str) -> str:
    """The README's import rule: ``torchrl.<pkg>.llm[.<sub>]`` -> ``llmrl_core.<pkg>[.<sub>]``."""
    parts = module.split(".")
    assert parts[0] == "torchrl" and parts[2] == "llm", module
    return ".".join(["llmrl_core", parts[1], *parts[3:]])


def expected_names(module: str) -> list[str]:
    names = GOLDEN[module]
    return [n for n in names if n not in NOT_PORTED and (module, n) not in NOT_AT_THIS_PATH]


MODULES = sorted(m for m, names in GOLDEN.items() if isinstance(names, list) and expected_names(m))


def test_the_golden_lists_torchrls_llm_modules():
    assert len(GOLDEN) > 50 and "torchrl.envs.llm.reward" in GOLDEN and "torchrl.collectors.llm.base" in GOLDEN
    assert "GSM8KRewardParser" in GOLDEN["torchrl.envs.llm.reward.gsm8k"]


@pytest.mark.parametrize("module", MODULES)
def test_each_torchrl_module_path_imports_its_names_under_llmrl(module):
    ours = importlib.import_module(ported(module))
    missing = [name for name in expected_names(module) if not hasattr(ours, name)]
    assert not missing, f"{ported(module)} lacks {missing} (TorchRL's {module} has them)"


def test_the_names_listed_as_not_ported_are_missing():
    """Keeps the list true: a name llmrl gains must come off it."""
    present = []
    for module, names in GOLDEN.items():
        if not isinstance(names, list):
            continue
        try:
            ours = importlib.import_module(ported(module))
        except ModuleNotFoundError:
            continue
        present += [f"{ported(module)}.{n}" for n in names if n in NOT_PORTED and hasattr(ours, n)]
    assert not present, f"listed as not ported but present: {present}"
    listed_everywhere = {n for names in GOLDEN.values() if isinstance(names, list) for n in names}
    assert not set(NOT_PORTED) - listed_everywhere, "a not-ported name TorchRL does not have"


def test_a_ported_class_is_the_same_object_at_every_path():
    from llmrl_core.envs import GSM8KRewardParser, PythonInterpreter
    from llmrl_core.envs.reward.gsm8k import GSM8KRewardParser as at_reward_path
    from llmrl_core.envs.transforms.tools import PythonInterpreter as at_tools_path

    assert at_reward_path is GSM8KRewardParser and at_tools_path is PythonInterpreter


def test_minor_sft_loss_and_the_k3_estimate_by_hand():
    """TorchRL's two loss helpers, against hand computations: ``minor_sft_loss`` is
    ``-log(sigmoid(beta * (lp - ref)))`` reduced; ``k3_kl_token_estimate(target, lp)`` is ``e^d - 1 - d``,
    ``d = target - lp``, per token."""
    import math

    import torch

    from llmrl_core.objectives import k3_kl_token_estimate, minor_sft_loss

    lp, ref = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]]), torch.tensor([[-1.5, -1.0], [-0.5, -2.0]])
    by_hand = [-math.log(1 / (1 + math.exp(-0.1 * (a - b)))) for a, b in zip(lp.flatten(), ref.flatten(), strict=True)]
    assert minor_sft_loss(lp, ref, 0.1, "none").flatten().tolist() == pytest.approx(by_hand)
    assert float(minor_sft_loss(lp, ref, 0.1, "sum")) == pytest.approx(sum(by_hand))
    assert float(minor_sft_loss(lp, ref, 0.1, "mean")) == pytest.approx(sum(by_hand) / 4)
    with pytest.raises(ValueError, match="different shapes"):
        minor_sft_loss(lp, ref[:, :1], 0.1, "mean")
    with pytest.raises(ValueError, match="Invalid reduction: max"):
        minor_sft_loss(lp, ref, 0.1, "max")
    d = ref - lp
    expected = [math.exp(x) - 1 - x for x in d.flatten().tolist()]
    assert k3_kl_token_estimate(ref, lp).flatten().tolist() == pytest.approx(expected)
