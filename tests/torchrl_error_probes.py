"""The documented misuses of TorchRL's LLM API (and a few valid calls beside them), as calls that any
implementation of the API can run: ``error_probes(api, model_path)`` builds them over the classes in ``api``
(TorchRL's, in ``scripts/torchrl_goldens.py``'s side venv, which records what each raises in
``tests/goldens/torchrl/api_probes.json``; llmrl's, in ``tests/test_torchrl_error_probes.py``, which checks that
llmrl raises the same). ``api`` maps names to classes: LLMCollector, History, ChatEnv, DatasetChatEnv,
DataLoadingPrimer, KLComputation, KLRewardTransform, RetrieveKL, RetrieveLogProb, RayKLRewardTransform,
RayRetrieveKL, TransformersWrapper.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch


def error_probes(api: Mapping[str, Any], model_path: str) -> list[tuple[str, str | None, str, Callable[[], Any]]]:
    """``(name, seed, call, fn)`` per probe: ``fn()`` makes the call (see the module docstring)."""
    from tensordict import TensorDict, set_list_to_stack
    from torch.utils.data import DataLoader
    from transformers import AutoModelForCausalLM, AutoTokenizer

    LLMCollector, History, ChatEnv, DatasetChatEnv = (  # noqa: N806 - the API's class names
        api["LLMCollector"],
        api["History"],
        api["ChatEnv"],
        api["DatasetChatEnv"],
    )
    DataLoadingPrimer, KLComputation, KLRewardTransform = (  # noqa: N806
        api["DataLoadingPrimer"],
        api["KLComputation"],
        api["KLRewardTransform"],
    )
    RetrieveKL, RetrieveLogProb, RayKLRewardTransform, RayRetrieveKL, TransformersWrapper = (  # noqa: N806
        api["RetrieveKL"],
        api["RetrieveLogProb"],
        api["RayKLRewardTransform"],
        api["RayRetrieveKL"],
        api["TransformersWrapper"],
    )

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()

    def wrapper(**kw):
        base = {"tokenizer": tokenizer, "input_mode": "history", "generate": False, "return_log_probs": True}
        base.update(kw)
        return TransformersWrapper(model, **base)

    tokens_ref = wrapper(input_mode="tokens")
    gen = wrapper(log_probs_key="gen_log_probs", pad_output=True)
    ref = wrapper(log_probs_key="ref_log_probs", pad_output=True)
    generating = wrapper(generate=True, return_log_probs=None)
    generating_padded = wrapper(generate=True, return_log_probs=True, pad_output=True)

    def env(**kw):
        prompts = [{"query": "What is 2 + 2?"}, {"query": "Name a colour."}]
        return ChatEnv.from_dataloader(DataLoader(prompts, batch_size=1), tokenizer=tokenizer, **kw)

    def kl_td(gen_lp, ref_lp, reward=None):
        nxt = {("gen_log_probs", "full"): gen_lp, ("ref_log_probs", "full"): ref_lp}
        if reward is not None:
            nxt["reward"] = reward
        return TensorDict(next=TensorDict(nxt, batch_size=(2,)), batch_size=(2,))

    def dataset_env_without_list_to_stack(tmp=Path("/tmp/torchrl_goldens_ds")):
        tmp.mkdir(exist_ok=True)
        (tmp / "train.jsonl").write_text(json.dumps({"text": "What is 2 + 2?"}) + "\n")
        with set_list_to_stack(False):
            return DatasetChatEnv(dataset=str(tmp))

    def collector_postproc_twice():
        collector = LLMCollector(env(), policy=generating, dialog_turns_per_batch=1, postproc=lambda td: td)
        collector.set_postproc(lambda td: td)

    s004, s003, s002 = "004_f621bca59e0c4348.txt", "003_ce42da60f6f21460.txt", "002_826a258ee385f037.txt"
    probes = [
        (
            "KLRewardTransform: both ref_model and ref_model_factory",
            s004,
            "KLRewardTransform(ref_model=m, ref_model_factory=lambda: m)",
            lambda: KLRewardTransform(ref_model=tokens_ref, ref_model_factory=lambda: tokens_ref),
        ),
        (
            "KLRewardTransform: neither ref_model nor ref_model_factory",
            s004,
            "KLRewardTransform()",
            lambda: KLRewardTransform(),
        ),
        (
            "KLRewardTransform: ref_model that generates",
            s004,
            "KLRewardTransform(TransformersWrapper(..., generate=True))",
            lambda: KLRewardTransform(generating),
        ),
        (
            "KLRewardTransform: ref_model not in tokens input mode",
            s004,
            "KLRewardTransform(TransformersWrapper(..., input_mode='history', generate=False))",
            lambda: KLRewardTransform(wrapper()),
        ),
        (
            "KLRewardTransform: out_keys of the wrong length",
            s004,
            "KLRewardTransform(m, out_keys=['reward', 'kl'])",
            lambda: KLRewardTransform(tokens_ref, out_keys=["reward", "kl"]),
        ),
        (
            "KLRewardTransform: two in_keys",
            s004,
            "KLRewardTransform(m, in_keys=['a', 'b'])",
            lambda: KLRewardTransform(tokens_ref, in_keys=["a", "b"]),
        ),
        (
            "KLRewardTransform: two positional models (the legacy docstring call)",
            s004,
            "KLRewardTransform(gen_model, ref_model)",
            lambda: KLRewardTransform(tokens_ref, tokens_ref),
        ),
        (
            "KLRewardTransform: tokens-mode ref_model (valid)",
            s004,
            "KLRewardTransform(m)",
            lambda: KLRewardTransform(tokens_ref),
        ),
        (
            "KLRewardTransform: use_ray_service=True",
            s004,
            "KLRewardTransform(m, use_ray_service=True)",
            lambda: KLRewardTransform(tokens_ref, use_ray_service=True),
        ),
        (
            "RayKLRewardTransform: both ref_model and ref_model_factory",
            s004,
            "RayKLRewardTransform(ref_model=m, ref_model_factory=lambda: m)",
            lambda: RayKLRewardTransform(ref_model=tokens_ref, ref_model_factory=lambda: tokens_ref),
        ),
        ("RayKLRewardTransform: neither", s004, "RayKLRewardTransform()", lambda: RayKLRewardTransform()),
        (
            "RetrieveLogProb: model with generate=True",
            s004,
            "RetrieveLogProb(TransformersWrapper(..., generate=True))",
            lambda: RetrieveLogProb(generating),
        ),
        (
            "RetrieveLogProb: model with return_log_probs=False",
            s004,
            "RetrieveLogProb(TransformersWrapper(..., generate=False, return_log_probs=False))",
            lambda: RetrieveLogProb(wrapper(return_log_probs=False)),
        ),
        (
            "RetrieveLogProb: assistant_only with input_mode='text'",
            s004,
            "RetrieveLogProb(TransformersWrapper(..., input_mode='text', generate=False), assistant_only=True)",
            lambda: RetrieveLogProb(wrapper(input_mode="text")),
        ),
        (
            "RetrieveLogProb: input_mode='text' with assistant_only=False (valid)",
            s004,
            "RetrieveLogProb(TransformersWrapper(..., input_mode='text'), assistant_only=False)",
            lambda: RetrieveLogProb(wrapper(input_mode="text"), assistant_only=False),
        ),
        (
            "RetrieveLogProb: log_probs_full_key not ending with 'full' (warning)",
            s004,
            "RetrieveLogProb(m, log_probs_full_key='lp')",
            lambda: RetrieveLogProb(wrapper(), log_probs_full_key="lp"),
        ),
        (
            "RetrieveKL: equal log_probs_key on both models",
            s004,
            "RetrieveKL(gen_model=m1, ref_model=m2) with m1.log_probs_key == m2.log_probs_key == 'log_probs'",
            lambda: RetrieveKL(gen_model=wrapper(), ref_model=wrapper()),
        ),
        (
            "RetrieveKL: pad_output mismatch",
            s004,
            "RetrieveKL(gen(pad_output=True), ref(pad_output=False))",
            lambda: RetrieveKL(gen_model=gen, ref_model=wrapper(log_probs_key="ref_log_probs", pad_output=False)),
        ),
        (
            "RetrieveKL: generating gen_model",
            s004,
            "RetrieveKL(gen_model=TransformersWrapper(..., generate=True, return_log_probs=True, pad_output=True), "
            "ref_model=ref)",
            lambda: RetrieveKL(gen_model=generating_padded, ref_model=ref),
        ),
        (
            "RetrieveKL: generating ref_model",
            s004,
            "RetrieveKL(gen_model=gen, ref_model=TransformersWrapper(..., generate=True, return_log_probs=True, "
            "pad_output=True))",
            lambda: RetrieveKL(gen_model=gen, ref_model=generating_padded),
        ),
        (
            "RetrieveKL: ref_model=None",
            s004,
            "RetrieveKL(gen_model=gen, ref_model=None)",
            lambda: RetrieveKL(gen_model=gen, ref_model=None),
        ),
        (
            "RetrieveKL: gen_model=None",
            s004,
            "RetrieveKL(gen_model=None, ref_model=ref)",
            lambda: RetrieveKL(gen_model=None, ref_model=ref),
        ),
        (
            "RetrieveKL: both gen_model and gen_model_factory",
            s004,
            "RetrieveKL(gen_model=gen, gen_model_factory=lambda: gen, ref_model=ref)",
            lambda: RetrieveKL(gen_model=gen, gen_model_factory=lambda: gen, ref_model=ref),
        ),
        (
            "RetrieveKL: both ref_model and ref_model_factory",
            s004,
            "RetrieveKL(gen_model=gen, ref_model=ref, ref_model_factory=lambda: ref)",
            lambda: RetrieveKL(gen_model=gen, ref_model=ref, ref_model_factory=lambda: ref),
        ),
        (
            "RetrieveKL: factories only (valid)",
            s004,
            "RetrieveKL(gen_model_factory=lambda: gen, ref_model_factory=lambda: ref)",
            lambda: RetrieveKL(gen_model_factory=lambda: gen, ref_model_factory=lambda: ref),
        ),
        (
            "RetrieveKL: 'from_collector' used outside an env",
            s004,
            "RetrieveKL(ref_model=ref)(TensorDict(batch_size=(2,)))",
            lambda: RetrieveKL(ref_model=ref)(TensorDict(batch_size=(2,))),
        ),
        (
            "RayRetrieveKL: both gen_model and gen_model_factory",
            s004,
            "RayRetrieveKL(gen_model=gen, gen_model_factory=lambda: gen)",
            lambda: RayRetrieveKL(gen_model=gen, gen_model_factory=lambda: gen),
        ),
        (
            "RayRetrieveKL: both ref_model and ref_model_factory",
            s004,
            "RayRetrieveKL(gen_model=None, ref_model=ref, ref_model_factory=lambda: ref)",
            lambda: RayRetrieveKL(gen_model=None, ref_model=ref, ref_model_factory=lambda: ref),
        ),
        (
            "KLComputation: docstring keyword names",
            s004,
            "KLComputation(gen_log_probs_key=..., ref_log_probs_key=..., kl_key='kl_penalty', coef=1.0)",
            lambda: KLComputation(
                gen_log_probs_key=("gen_log_probs", "full"),
                ref_log_probs_key=("ref_log_probs", "full"),
                kl_key="kl_penalty",
                coef=1.0,
            ),
        ),
        (
            "KLComputation: missing log-probs",
            s004,
            "KLComputation(('gen_log_probs', 'full'), ('ref_log_probs', 'full'))(TensorDict(next={}))",
            lambda: KLComputation(("gen_log_probs", "full"), ("ref_log_probs", "full"))(
                TensorDict(next=TensorDict(batch_size=(2,)), batch_size=(2,))
            ),
        ),
        (
            "KLComputation: per-sample shape mismatch",
            s004,
            "gen (2, 10) vs ref (2, 9)",
            lambda: KLComputation(("gen_log_probs", "full"), ("ref_log_probs", "full"), add_to_reward=False)(
                kl_td(torch.zeros(2, 10), torch.zeros(2, 9))
            ),
        ),
        (
            "KLComputation: reward (2, 10, 1) with log-probs (2, 10) (the docstring's data, valid keywords)",
            s004,
            "KLComputation(('gen_log_probs', 'full'), ('ref_log_probs', 'full'), kl_key='kl_penalty', "
            "add_to_reward=True, coeff=1.0)(data)",
            lambda: KLComputation(
                ("gen_log_probs", "full"), ("ref_log_probs", "full"), kl_key="kl_penalty", add_to_reward=True, coeff=1.0
            )(kl_td(torch.full((2, 10), -1.0), torch.full((2, 10), -1.5), torch.ones(2, 10, 1))),
        ),
        (
            "KLComputation: add_to_reward=False",
            s004,
            "KLComputation(('gen_log_probs', 'full'), ('ref_log_probs', 'full'), add_to_reward=False)(data)",
            lambda: KLComputation(("gen_log_probs", "full"), ("ref_log_probs", "full"), add_to_reward=False)(
                kl_td(torch.full((2, 10), -1.0), torch.full((2, 10), -1.5))
            ),
        ),
        (
            "KLComputation: reward without the extra trailing dim",
            s004,
            "reward (2, 10) with KL (2, 10)",
            lambda: KLComputation(("gen_log_probs", "full"), ("ref_log_probs", "full"))(
                kl_td(torch.zeros(2, 10), torch.zeros(2, 10), torch.zeros(2, 10))
            ),
        ),
        ("ChatEnv: batch_size=()", s003, "ChatEnv(batch_size=())", lambda: ChatEnv(batch_size=())),
        ("ChatEnv: invalid input_mode", s003, "ChatEnv(input_mode='foo')", lambda: ChatEnv(input_mode="foo")),
        ("ChatEnv: reset without a tensordict", s003, "ChatEnv().reset()", lambda: ChatEnv().reset()),
        (
            "ChatEnv: reset without the 'query' key",
            s003,
            "ChatEnv().reset(TensorDict(text='hi', batch_size=[1]))",
            lambda: ChatEnv().reset(TensorDict(text="hi", batch_size=[1])),
        ),
        (
            "DatasetChatEnv: list_to_stack disabled",
            s003,
            "with set_list_to_stack(False): DatasetChatEnv(dataset=dir)",
            dataset_env_without_list_to_stack,
        ),
        (
            "LLMCollector: yield_only_last_steps=True, yield_completed_trajectories=False",
            s002,
            "LLMCollector(env, policy=p, dialog_turns_per_batch=1, yield_only_last_steps=True, "
            "yield_completed_trajectories=False)",
            lambda: LLMCollector(
                env(),
                policy=generating,
                dialog_turns_per_batch=1,
                yield_only_last_steps=True,
                yield_completed_trajectories=False,
            ),
        ),
        (
            "LLMCollector: yield_only_last_steps with flatten_data",
            s002,
            "LLMCollector(env, ..., yield_only_last_steps=True, flatten_data=False)",
            lambda: LLMCollector(
                env(), policy=generating, dialog_turns_per_batch=1, yield_only_last_steps=True, flatten_data=False
            ),
        ),
        (
            "LLMCollector: yield_only_last_steps with reset_at_each_iter",
            s002,
            "LLMCollector(env, ..., yield_only_last_steps=True, reset_at_each_iter=True)",
            lambda: LLMCollector(
                env(), policy=generating, dialog_turns_per_batch=1, yield_only_last_steps=True, reset_at_each_iter=True
            ),
        ),
        (
            "LLMCollector: queue and replay_buffer",
            s002,
            "LLMCollector(env, ..., queue=q, replay_buffer=rb)",
            lambda: LLMCollector(
                env(), policy=generating, dialog_turns_per_batch=1, queue=object(), replay_buffer=object()
            ),
        ),
        (
            "LLMCollector: async_envs=True with a plain env",
            s002,
            "LLMCollector(env, ..., async_envs=True)",
            lambda: LLMCollector(env(), policy=generating, dialog_turns_per_batch=1, async_envs=True),
        ),
        (
            "LLMCollector: yield_completed_trajectories with a 2-d batch",
            s002,
            "LLMCollector(ChatEnv(batch_size=(1, 1)), ..., yield_completed_trajectories=True)",
            lambda: LLMCollector(
                ChatEnv(batch_size=(1, 1), tokenizer=tokenizer),
                policy=generating,
                dialog_turns_per_batch=1,
                yield_completed_trajectories=True,
            ),
        ),
        (
            "LLMCollector: set_postproc twice",
            s002,
            "LLMCollector(..., postproc=f).set_postproc(g)",
            collector_postproc_twice,
        ),
        (
            "LLMCollector: no dialog_turns_per_batch (required in the seed's signature)",
            s002,
            "LLMCollector(env, policy=p)",
            lambda: LLMCollector(env(), policy=generating),
        ),
        (
            "LLMCollector: policy and policy_factory",
            s002,
            "LLMCollector(env, policy=p, policy_factory=lambda: p)",
            lambda: LLMCollector(env(), policy=generating, policy_factory=lambda: generating, dialog_turns_per_batch=1),
        ),
        (
            "History.apply_chat_template: no tokenizer and no template",
            None,
            "History.from_chats([[...]]).apply_chat_template()",
            lambda: History.from_chats([[{"role": "user", "content": "hi"}]]).apply_chat_template(),
        ),
        ("DataLoadingPrimer: no dataloader", None, "DataLoadingPrimer()", lambda: DataLoadingPrimer()),
    ]
    return probes
