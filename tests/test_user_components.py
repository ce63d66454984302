"""User components by config (``module:Class`` settings): a subclass of TorchRL's ``vLLMWrapper``
(``rollout.policy_class``), of ``GRPOLoss`` (``train.loss_class``), of ``MCAdvantage`` (``train.advantage_class``), of
``RetrieveLogProb`` (``train.kl_transform_class``, the reference stage), of ``KLComputation``
(``train.kl_reward_class``, the KL taken out of the rewards) and of the env ``Transform``
(``env.transforms``) runs inside the GRPO flow, each effect visible in the stored rows or the
logged metrics; a wrong base or a typo is refused before anything starts, naming the setting."""

from __future__ import annotations

import json
import textwrap
from typing import Any
from unittest import mock

import pytest

from llmrl_core.weight_sync import vLLMUpdater

USER_MODULE = textwrap.dedent(
    """
    import json

    import torch

    from llmrl_core.envs.transforms import KLComputation, RetrieveLogProb
    from llmrl_core.envs.transforms.td_base import Transform
    from llmrl_core.modules import vLLMWrapper
    from llmrl_core.objectives import GRPOLoss, MCAdvantage


    class RecordingWrapper(vLLMWrapper):
        '''Records each call's batch size and the engine's policy version in a JSON-lines file.'''

        def __init__(self, *args, log_path=None, **kwargs):
            super().__init__(*args, **kwargs)
            self.log_path = log_path

        def forward(self, tensordict, **kwargs):
            with open(self.log_path, "a") as log:
                log.write(json.dumps({"rows": tensordict.batch_size[0], "version": self.engine.policy_version}) + "\\n")
            return super().forward(tensordict, **kwargs)


    class ShiftedLoss(GRPOLoss):
        '''GRPO plus a constant term (no gradient change): the logged loss_objective moves by it.'''

        def __init__(self, *args, shift=0.0, **kwargs):
            super().__init__(*args, **kwargs)
            self.shift = shift

        def forward(self, batch):
            out = super().forward(batch)
            out.loss_objective = out.loss_objective + self.shift
            return out


    class ScaledAdvantage(MCAdvantage):
        '''Group-relative advantages times ``scale``.'''

        def __init__(self, *args, scale=1.0, **kwargs):
            super().__init__(*args, **kwargs)
            self.scale = scale

        def __call__(self, rewards, group_ids=None, episode_ids=None):
            result = super().__call__(rewards, group_ids, episode_ids)
            result.advantages = result.advantages * self.scale
            return result


    class ShiftedReference(RetrieveLogProb):
        '''The reference model's log-probs minus ``shift``: the stored ref_logprobs move by it.'''

        def __init__(self, *args, shift=0.0, **kwargs):
            super().__init__(*args, **kwargs)
            self.shift = shift

        def forward(self, tensordict):
            out = super().forward(tensordict)
            rows = out.get(self.log_probs_full_key, as_list=True)
            for row_td, row in zip(out.unbind(0), rows):
                row_td.set(self.log_probs_full_key, row - self.shift)
            return out


    class ScaledKL(KLComputation):
        '''TorchRL's KL reward term with its coefficient times ``scale``.'''

        def __init__(self, *args, coeff=1.0, scale=1.0, **kwargs):
            super().__init__(*args, coeff=coeff * scale, **kwargs)


    class UserBonus(Transform):
        '''A TorchRL reward transform: ``bonus`` on every answer.'''

        def __init__(self, bonus=0.0):
            super().__init__()
            self.bonus = bonus

        def _step(self, tensordict, next_tensordict):
            size = next_tensordict.batch_size[0]
            reward = next_tensordict.get("reward", torch.zeros(size, 1))
            return next_tensordict.set("reward", reward + self.bonus)
    """
)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    folder = tmp_path / "user_code"
    folder.mkdir()
    (folder / "my_components.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(folder))
    yield "my_components"
    import sys

    sys.modules.pop("my_components", None)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rollout.policy_class=my_components:ShiftedLoss", "rollout.policy_class: .* subclass of .*vLLMWrapper"),
        ("train.loss_class=my_components:ScaledAdvantage", "train.loss_class: .* subclass of .*GRPOLoss"),
        ("train.advantage_class=my_components:Nope", "train.advantage_class: module 'my_components' has no attribute"),
        ("train.loss_class=no_such_module_xyz:Loss", "train.loss_class: cannot import module 'no_such_module_xyz'"),
        ("env.transforms=[{'my_components:ScaledAdvantage': {}}]", "env.transforms: .* subclass of .*Transform"),
        (
            "train.kl_transform_class=my_components:UserBonus",
            "train.kl_transform_class: .* subclass of .*RetrieveLogProb",
        ),
        ("train.kl_reward_class=my_components:UserBonus", "train.kl_reward_class: .* subclass of .*KLComputation"),
    ],
)
def test_a_wrong_component_is_refused_naming_its_setting(user_module, override, message):
    from llmrl_core.pipeline.config_io import ConfigError, load_config
    from llmrl_core.pipeline.grpo_config import GRPOConfig

    with pytest.raises(ConfigError, match=message):
        load_config(GRPOConfig, None, [override])


def test_the_advantage_stage_is_mcadvantage_or_the_configured_subclass(user_module):
    """``assign_advantages`` calls TorchRL's ``MCAdvantage`` (a patched class sees the call), or the configured
    subclass with its kwargs."""
    from types import SimpleNamespace

    from llmrl_core.objectives import MCAdvantage, mc_advantage
    from llmrl_core.pipeline.config_io import load_config
    from llmrl_core.pipeline.grpo_config import GRPOConfig
    from tasks import grpo_stages

    def records():
        return [
            SimpleNamespace(reward=r, reward_components={}, group_id=g)
            for r, g in ((1, "a"), (0, "a"), (0.5, "b"), (0, "b"))
        ]

    expected = mc_advantage([1, 0, 0.5, 0], ["a", "a", "b", "b"]).advantages.tolist()
    with mock.patch.object(MCAdvantage, "__call__", autospec=True, side_effect=MCAdvantage.__call__) as called:
        rows = records()
        grpo_stages.assign_advantages(load_config(GRPOConfig, None, []), rows)
    assert called.call_count == 1
    assert [r.advantage for r in rows] == pytest.approx(expected)
    cfg = load_config(
        GRPOConfig, None, ["train.advantage_class=my_components:ScaledAdvantage", "train.advantage_kwargs={scale: 3.0}"]
    )
    rows = records()
    grpo_stages.assign_advantages(cfg, rows)
    assert [r.advantage for r in rows] == pytest.approx([3.0 * a for a in expected])


def test_the_kl_reward_stage_is_klcomputation_or_the_configured_subclass(user_module):
    """With ``train.kl_in=reward``, ``assign_advantages`` takes the KL out of each row's return through TorchRL's
    ``KLComputation`` (a patched class sees the call; the penalty is ``kl_coef`` x the summed KL of the response
    tokens, by hand), or through the configured subclass with its kwargs."""
    from types import SimpleNamespace

    from llmrl_core.envs.transforms import KLComputation
    from llmrl_core.objectives import mc_advantage
    from llmrl_core.pipeline.config_io import load_config
    from llmrl_core.pipeline.grpo_config import GRPOConfig
    from tasks import grpo_stages

    def records():
        rows = (  # reward, group, sampler log-probs, reference log-probs, response mask
            (1.0, "a", [-0.5, -1.0, -2.0], [-1.0, -1.0, -0.5], [True, True, False]),
            (0.0, "a", [-0.2, -0.3], [-0.1, -0.9], [True, True]),
            (0.5, "b", [-1.0], [-3.0], [True]),
            (0.0, "b", [-0.4, -0.4], [-0.4, None], [True, True]),  # an unknown reference log-prob: left out
        )
        return [
            SimpleNamespace(
                reward=r,
                reward_components={},
                group_id=g,
                sample_index=i,
                sampler_logprobs=lp,
                ref_logprobs=ref,
                response_mask=m,
            )
            for i, (r, g, lp, ref, m) in enumerate(rows)
        ]

    kl = [0.5 + 0.0, -0.1 + 0.6, 2.0, 0.0]  # per row: the summed KL of its masked, finite tokens
    settings = ["train.kl_coef=0.1", "train.kl_in=reward"]
    with mock.patch.object(KLComputation, "_step", autospec=True, side_effect=KLComputation._step) as called:
        rows = records()
        grpo_stages.assign_advantages(load_config(GRPOConfig, None, settings), rows)
    assert called.call_count == 1
    assert [r.reward_components["kl_penalty"] for r in rows] == pytest.approx([-0.1 * k for k in kl])
    returns = [r.reward - 0.1 * k for r, k in zip(rows, kl, strict=True)]
    assert [r.advantage for r in rows] == pytest.approx(mc_advantage(returns, ["a", "a", "b", "b"]).advantages.tolist())
    cfg = load_config(
        GRPOConfig,
        None,
        [*settings, "train.kl_reward_class=my_components:ScaledKL", "train.kl_reward_kwargs={scale: 3}"],
    )
    rows = records()
    grpo_stages.assign_advantages(cfg, rows)
    assert [r.reward_components["kl_penalty"] for r in rows] == pytest.approx([-0.3 * k for k in kl])


def test_a_user_env_transform_is_built_from_its_module_and_class(user_module, default_model_path):
    from transformers import AutoTokenizer

    from llmrl_core.pipeline.config_io import load_config
    from llmrl_core.pipeline.grpo_config import GRPOConfig
    from llmrl_core.pipeline.task_config import make_task_env

    cfg = load_config(GRPOConfig, None, ["env.transforms=[{'my_components:UserBonus': {bonus: 0.5}}]"])
    env = make_task_env(cfg.task, AutoTokenizer.from_pretrained(default_model_path), input_mode="tokens", env=cfg.env)
    bonus = [t for t in env.td_transforms if type(t).__name__ == "UserBonus"]
    assert len(bonus) == 1 and bonus[0].bonus == 0.5


@pytest.mark.slow
def test_user_components_run_inside_the_grpo_flow(tmp_path, user_module):
    """One GRPO run (two versions) with all six user components: the wrapper subclass sampled every rollout (its
    log: one call per rollout of 4 rows, at the engine's version), every stored row carries the transform's bonus, the
    stored advantages are the subclass's (3x the group-relative ones of the returns), and the logged loss_objective
    carries the loss subclass's shift; the reference stage's transform subclass moved the stored reference log-probs
    by its shift, and the KL reward subclass took that KL out of the returns at twice ``kl_coef``."""
    from flows.grpo import grpo
    from llmrl_core.objectives import mc_advantage
    from storage.trajectories import TrajectoryStore

    log = tmp_path / "policy-calls.jsonl"
    pushed: list[tuple[str, int]] = []  # the publish is TorchRL's vLLMUpdater (a patched class sees each version)
    original_push = vLLMUpdater.push_weights

    def push_weights(updater: vLLMUpdater, weights: Any) -> int:
        pushed.append((updater.mode, updater.version + 1))
        return original_push(updater, weights)

    with mock.patch.object(vLLMUpdater, "push_weights", autospec=True, side_effect=push_weights):
        grpo(
            overrides=[
                "run_id=uc",
                f"runs_dir={tmp_path / 'runs'}",
                "progress=false",
                "iterations=2",
                "data.prompts_per_iteration=2",
                "data.group_size=2",
                "rollout.max_new_tokens=24",
                "rollout.dtype=float32",
                "train.mixed_precision=no",
                "train.lr=1e-5",
                "rollout.policy_class=my_components:RecordingWrapper",
                f"rollout.policy_kwargs={{log_path: '{log}'}}",
                "train.loss_class=my_components:ShiftedLoss",
                "train.loss_kwargs={shift: 100.0}",
                "train.advantage_class=my_components:ScaledAdvantage",
                "train.advantage_kwargs={scale: 3.0}",
                "env.transforms=[{'my_components:UserBonus': {bonus: 0.5}}]",
                "train.kl_coef=0.01",
                "train.kl_transform_class=my_components:ShiftedReference",
                "train.kl_transform_kwargs={shift: 1.0}",
                "train.kl_in=reward",
                "train.kl_reward_class=my_components:ScaledKL",
                "train.kl_reward_kwargs={scale: 2.0}",
            ]
        )
    assert pushed == [("checkpoint", 0), ("checkpoint", 1), ("checkpoint", 2)]
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c["version"] for c in calls] == [0, 1] and all(c["rows"] == 4 for c in calls)
    store = TrajectoryStore(tmp_path / "runs" / "trajectories")
    for version in (0, 1):
        records = store.read_records("uc", version=version)
        assert len(records) == 4
        assert all(r.reward_components["UserBonus"] == pytest.approx(0.5) for r in records)
        if version == 0:  # the reference is the base model: fp32 engine and reference agree, less the shift
            for r in records:
                gap = [ref - s for ref, s in zip(r.ref_logprobs, r.sampler_logprobs, strict=True)]
                assert gap == pytest.approx([-1.0] * len(gap), abs=2e-3), gap
                # so the KL is 1 per response token, taken out of the return at the subclass's 2 x kl_coef
                tokens = sum(r.response_mask)
                assert r.reward_components["kl_penalty"] == pytest.approx(-0.02 * tokens, rel=2e-3)
        returns = [r.reward + r.reward_components["kl_penalty"] for r in records]
        expected = mc_advantage(returns, [r.group_id for r in records]).advantages.tolist()
        assert [r.advantage for r in records] == pytest.approx([3.0 * a for a in expected], abs=1e-5)
        published = json.loads((tmp_path / "runs" / "uc" / "state" / f"published-v{version + 1}.json").read_text())
        metrics = published.get("metrics", published)
        assert 99.0 < metrics["loss_objective"] < 101.0, metrics
