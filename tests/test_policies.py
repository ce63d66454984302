"""TransformersWrapper and vLLMWrapper on TensorDicts (TorchRL's API): valid samples, agreeing log-probs,
TorchRL's layouts, arguments and errors."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, lazy_stack, set_list_to_stack

from llmrl_core.data.history import History
from llmrl_core.modules.backends.transformers.scoring import teacher_forced_log_probs
from llmrl_core.modules.backends.types import SamplingConfig
from llmrl_core.modules.policies import ChatHistory, Masks, Text, Tokens, TransformersWrapper, vLLMWrapper

CHATS = [
    [{"role": "user", "content": "What is 2+3?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a primary color."}],
    [{"role": "user", "content": "Count from one to five."}],
]
SAMPLING = {"max_new_tokens": 24, "do_sample": True, "temperature": 1.0}


@pytest.fixture(autouse=True)
def _list_to_stack():
    with set_list_to_stack(True):
        yield


def _ragged(key: tuple[str, str], rows: list[torch.Tensor]) -> TensorDict:
    """One tensor per sample under ``key`` (a lazy stack, as the wrappers write them)."""
    return lazy_stack([TensorDict({key: row}) for row in rows])


def _prompts() -> TensorDict:
    return TensorDict(history=ChatHistory(prompt=History.from_chats(CHATS)), batch_size=(len(CHATS),))


@pytest.fixture(scope="module")
def hf_policy(hf_model_fp32):
    model, tokenizer = hf_model_fp32
    return TransformersWrapper(model, tokenizer=tokenizer, generate_kwargs=SAMPLING)


@pytest.fixture(scope="module")
def vllm_policy(vllm_engine_fp32):
    return vLLMWrapper(vllm_engine_fp32, generate_kwargs={"max_tokens": 24, "temperature": 1.0, "seed": 3})


def _check_valid(out: TensorDict, tokenizer, max_new_tokens: int = 24) -> None:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    texts = out["text", "response"]
    assert len(texts) == len(CHATS)
    for text, tokens, lps, prompt, full, mask in zip(
        texts,
        out.get(("tokens", "response"), as_list=True),
        out.get(("log_probs", "response"), as_list=True),
        out.get(("tokens", "prompt"), as_list=True),
        out.get(("tokens", "full"), as_list=True),
        out.get(("masks", "all_attention_mask"), as_list=True),
        strict=True,
    ):
        assert 0 < len(tokens) <= max_new_tokens
        assert eos not in tokens[:-1].tolist()  # a response stops at its end of turn
        assert lps.shape == tokens.shape and torch.all(lps <= 0) and torch.all(torch.isfinite(lps))
        assert torch.equal(full, torch.cat([prompt, tokens])) and mask.all() and mask.shape == full.shape
        assert tokenizer.decode(tokens.tolist()) == text
    history = out["history"]
    assert history.response.shape[:2] == (len(CHATS), 1) and history.response.role == [["assistant"]] * len(CHATS)
    for i, chat in enumerate(CHATS):
        assert history.full[i].batch_size[0] == len(chat) + 1


def test_both_backends_sample_valid_responses(hf_policy, vllm_policy):
    _check_valid(hf_policy(_prompts()), hf_policy.tokenizer)
    _check_valid(vllm_policy(_prompts()), vllm_policy.tokenizer)


def test_log_probs_agree_across_backends(hf_policy, vllm_policy):
    """Each backend's sampler log-probs match the other backend's teacher-forced scores of the same tokens (fp32)."""
    for sampler, scorer in ((vllm_policy, hf_policy), (hf_policy, vllm_policy)):
        out = sampler(_prompts())
        tokens_scorer = scorer.get_new_version(generate=False, input_mode="tokens")
        assert tokens_scorer.in_keys == [("tokens", "full")]
        scored = tokens_scorer(_ragged(("tokens", "full"), out.get(("tokens", "full"), as_list=True)))
        diffs = [
            (full[-len(lp) :] - lp).abs()
            for full, lp in zip(
                scored.get(("log_probs", "full"), as_list=True),
                out.get(("log_probs", "response"), as_list=True),
                strict=True,
            )
        ]
        diffs = torch.cat(diffs)
        assert diffs.mean().item() < 1e-3 and diffs.max().item() < 1e-2, (type(sampler).__name__, diffs.max())


def test_prompts_are_identical_in_every_input_mode(hf_model_fp32):
    model, tokenizer = hf_model_fp32
    greedy = {"max_new_tokens": 4, "do_sample": False}
    by_history = TransformersWrapper(model, tokenizer=tokenizer, generate_kwargs=greedy)(_prompts())
    texts = History.from_chats(CHATS).apply_chat_template(tokenizer=tokenizer, add_generation_prompt=True)
    assert by_history["text", "prompt"] == texts
    as_text = TransformersWrapper(model, tokenizer=tokenizer, input_mode="text", generate_kwargs=greedy)
    by_text = as_text(TensorDict(text=Text(prompt=texts), batch_size=(3,)))
    as_tokens = TransformersWrapper(model, tokenizer=tokenizer, input_mode="tokens", generate_kwargs=greedy)
    prompt_ids = by_history.get(("tokens", "prompt"), as_list=True)
    by_tokens = as_tokens(_ragged(("tokens", "prompt"), prompt_ids))
    for out in (by_text, by_tokens):
        for a, b in zip(out.get(("tokens", "prompt"), as_list=True), prompt_ids, strict=True):
            assert torch.equal(a, b)
        for a, b in zip(
            out.get(("tokens", "response"), as_list=True),
            by_history.get(("tokens", "response"), as_list=True),
            strict=True,
        ):
            assert torch.equal(a, b)
    assert as_text.out_keys == ["text", "masks", "tokens", "log_probs"]
    assert as_tokens.out_keys == ["masks", "tokens", "log_probs"]
    with pytest.raises(ValueError, match=r"Expected '\('tokens', 'prompt'\)' key for tokens input mode"):
        as_tokens(_prompts())
    with pytest.raises(TypeError, match="Expected History object"):
        TransformersWrapper(model, tokenizer=tokenizer)(TensorDict({("history", "prompt"): torch.zeros(3, 1)}, [3]))


@pytest.mark.parametrize(
    ("pad_output", "packing"),
    [(False, {}), (True, {}), (False, {"pad_model_input": False, "score_token_budget": 64, "score_temperature": 0.7})],
)
def test_scoring_log_probs_and_entropy_match_a_direct_forward(hf_model_fp32, pad_output, packing):
    """Padded scoring, and packed scoring (``pad_model_input=False``: several sequences in one row of at most
    ``score_token_budget`` tokens) at a sampling temperature, against one forward pass per sequence."""
    model, tokenizer = hf_model_fp32
    prompts = [tokenizer(t)["input_ids"] for t in History.from_chats(CHATS).apply_chat_template(tokenizer=tokenizer)]
    responses = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in ["2 + 3 = 5.", "Red.", "One two"]]
    seqs = [torch.tensor(p + r) for p, r in zip(prompts, responses, strict=True)]
    temperature = packing.get("score_temperature", 1.0)
    scorer = TransformersWrapper(
        model, tokenizer=tokenizer, input_mode="tokens", generate=False, pad_output=pad_output, **packing
    )
    out = scorer(_ragged(("tokens", "full"), seqs))
    rows = out.get(("log_probs", "full"), as_list=True)
    if pad_output:
        dense = out.get(("log_probs", "full"))
        longest = max(len(s) for s in seqs)
        assert dense.shape == out.get(("tokens", "full")).shape == (3, longest)
        assert out.get(("masks", "all_attention_mask")).sum(1).tolist() == [len(s) for s in seqs]
        rows = [row[longest - len(s) :] for row, s in zip(dense, seqs, strict=True)]  # left padding
        assert torch.equal(
            dense[~out.get(("masks", "all_attention_mask"))],
            torch.zeros(int((~out.get(("masks", "all_attention_mask"))).sum())),
        )
    for seq, lps, prompt in zip(seqs, rows, prompts, strict=True):
        with torch.no_grad():
            logp = torch.log_softmax(model(seq[None]).logits[0].float() / temperature, -1)
        expected = torch.cat([torch.zeros(1), logp[:-1].gather(-1, seq[1:, None]).squeeze(-1)])
        # padded batch vs one sequence: other matmul shapes, ~1e-5 apart in fp32 on an AVX-512 CPU
        torch.testing.assert_close(lps, expected, atol=5e-5, rtol=0)
        _, entropy = teacher_forced_log_probs(model, seq[None], return_entropy=True, temperature=temperature)
        torch.testing.assert_close(entropy[0, 1:], -(logp.exp() * logp).sum(-1)[:-1], atol=1e-4, rtol=0)
        assert entropy[0, 0] == 0 and len(prompt) < len(seq)


def test_greedy_generation_is_deterministic_and_backends_agree(hf_model_fp32, vllm_engine_fp32):
    model, tokenizer = hf_model_fp32
    hf = TransformersWrapper(model, tokenizer=tokenizer, generate_kwargs={"max_new_tokens": 16, "do_sample": False})
    vllm = vLLMWrapper(vllm_engine_fp32, generate_kwargs={"max_new_tokens": 16, "do_sample": False})
    hf_out, vllm_out = hf(_prompts()), vllm(_prompts())
    assert hf_out["text", "response"] == vllm_out["text", "response"] == hf(_prompts())["text", "response"]
    for a, b in zip(
        hf_out.get(("tokens", "response"), as_list=True),
        vllm_out.get(("tokens", "response"), as_list=True),
        strict=True,
    ):
        assert torch.equal(a, b)


@pytest.mark.parametrize("pad_output", [False, True])
def test_output_layout_and_inplace_follow_torchrl(hf_model_fp32, pad_output):
    model, tokenizer = hf_model_fp32
    policy = TransformersWrapper(
        model, tokenizer=tokenizer, generate_kwargs={"max_new_tokens": 6, "do_sample": False}, pad_output=pad_output
    )
    assert policy.in_keys == [("history", "prompt")] and policy.inplace is True
    assert policy.out_keys == ["text", "masks", "tokens", "log_probs", "history"]
    data = _prompts()
    out = policy(data)
    assert out is data and isinstance(out["tokens"], Tokens) and isinstance(out["masks"], Masks)
    assert out["tokens"].padded is pad_output and out["log_probs"].padded is pad_output
    prompts = out.get(("tokens", "prompt"), as_list=True)
    responses = out.get(("tokens", "response"), as_list=True)
    if pad_output:
        pad = tokenizer.pad_token_id
        prompt, response, full = (out.get(("tokens", k)) for k in ("prompt", "response", "full"))
        mask = out.get(("masks", "all_attention_mask"))
        assert prompt.dtype == response.dtype == torch.int64 and mask.dtype == torch.bool
        assert full.shape == mask.shape == (3, prompt.shape[1] + response.shape[1])
        assert out.get(("log_probs", "response")).shape == response.shape
        short = int(mask[:, : prompt.shape[1]].sum(1).argmin())
        assert prompt[short, 0] == pad and not mask[short, 0]  # prompts are left-padded
        assert torch.equal(full, torch.cat([prompt, response], 1))
    else:
        assert [len(p) for p in prompts] != [len(prompts[0])] * 3  # ragged, one tensor per sample
        assert all(p.dtype == torch.int64 for p in prompts + responses)
    # a sample dimension: batch (B, n), inplace must be False
    sampler = TransformersWrapper(
        model, tokenizer=tokenizer, num_samples=2, generate_kwargs={"max_new_tokens": 4, "do_sample": True}
    )
    assert sampler.inplace is False and sampler.generate_kwargs["num_return_sequences"] == 2
    many = sampler(_prompts())
    assert many.batch_size == (3, 2) and many["history"].full.shape[:2] == (3, 2)
    assert set(many.keys()) == {"text", "masks", "tokens", "log_probs", "history"}
    # inplace=False: a new TensorDict with the outputs only; "empty": an empty copy of the input
    fresh = TransformersWrapper(
        model, tokenizer=tokenizer, inplace=False, generate_kwargs={"max_new_tokens": 2, "do_sample": False}
    )
    data = _prompts().set("other", torch.zeros(3))
    result = fresh(data)
    assert result is not data and "other" not in result.keys() and "tokens" not in data.keys()


def test_get_new_version_and_model_by_name(hf_model_fp32):
    model, tokenizer = hf_model_fp32
    policy = TransformersWrapper(model, tokenizer=tokenizer, generate_kwargs={"max_new_tokens": 3, "do_sample": False})
    scorer = policy.get_new_version(generate=False, log_probs_key="ref_log_probs")
    assert scorer.model is model and scorer.generate is False and scorer.return_log_probs is True
    assert scorer.in_keys == [("history", "full")] and scorer.log_probs_key == "ref_log_probs"
    out = policy(_prompts())
    scored = scorer(TensorDict(history=ChatHistory(full=out["history"].full), batch_size=(3,)))
    masks = scored.get(("masks", "all_assistant_mask"), as_list=True)
    assert [m.any().item() for m in masks] == [True] * 3
    by_name = TransformersWrapper("default", generate=False)
    assert by_name.tokenizer is not None and by_name.input_key == ("history", "full")


def test_argument_errors_follow_torchrl(hf_model_fp32):
    model, tokenizer = hf_model_fp32

    def make(**kwargs):
        return TransformersWrapper(model, tokenizer=tokenizer, **kwargs)

    cases = [
        (dict(input_mode="chat"), "input_mode must be one of 'history', 'text', 'tokens'. Got 'chat'"),
        (dict(generate=False, return_log_probs=False), "return_log_probs must be True when generate=False."),
        (dict(pad_model_input=True), "pad_model_input is not supported when generate=True."),
        (dict(pad_output=1), "pad_output must be a boolean"),
        (dict(num_samples=2, inplace=True), "inplace must be False"),
        (dict(num_samples=2, generate_kwargs={"n": 3}), r"num_samples differs from generate_kwargs\['n'\]."),
        (
            dict(batching=False, min_batch_size=2),
            "min_batch_size and max_batch_size must be None if batching is False.",
        ),
        (dict(min_batch_size=4, max_batch_size=2), r"min_batch_size \(4\) must be <= max_batch_size \(2\)"),
        (dict(generate_kwargs={"do_sample": False, "temperature": 0.7}), "When do_sample=False"),
        (dict(generate_kwargs={"temperature": -1}), "Temperature must be non-negative"),
        (dict(generate_kwargs={"top_p": 1.5}), "top_p must be between 0 and 1"),
        (dict(generate_kwargs={"top_k": 0}), "top_k must be positive"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            make(**kwargs)
    assert make(generate_kwargs={"max_tokens": 5, "max_new_tokens": 9}).generate_kwargs["max_new_tokens"] == 5
    assert make(batching=True).batching
    with pytest.raises(RuntimeError, match="log_prob not callable when generate=True"):
        make().log_prob(_prompts())
    with pytest.raises(ValueError, match="pad_model_input is not supported by vLLMWrapper"):
        vLLMWrapper(object(), pad_model_input=True)


def test_bad_sampling_settings_are_rejected():
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingConfig(max_new_tokens=0)


def test_llm_on_device_rejects_unknown_devices():
    from llmrl_core.modules.backends.vllm.worker import LLMOnDevice

    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda"):
        LLMOnDevice(device="tpu:0")


def test_make_vllm_worker_takes_torchrls_arguments(monkeypatch, default_model_path):
    """TorchRL's ``make_vllm_worker`` (keyword-only arguments) through the porting rule: its errors, and what a
    local engine is built from (the engine class is replaced by a recorder: starting vLLM is tested elsewhere)."""
    from llmrl_core.modules import make_vllm_worker
    from llmrl_core.modules.backends.vllm import worker as vllm_worker

    with pytest.raises(RuntimeError, match="llmrl has no Ray: pass make_ray_worker=False"):
        make_vllm_worker(model_name=str(default_model_path))
    with pytest.raises(ValueError, match="Cannot specify both num_devices and devices"):
        make_vllm_worker(model_name="m", devices=[0], num_devices=1, make_ray_worker=False)
    with pytest.raises(ValueError, match="enable_fp32_output"):
        make_vllm_worker(model_name="m", make_ray_worker=False, enable_fp32_output=True)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="Invalid device index: 0"):
            make_vllm_worker(model_name="m", devices=[0], make_ray_worker=False)
        with pytest.raises(ValueError, match="num_devices=1, but this machine has 0 GPU"):
            make_vllm_worker(model_name="m", num_devices=1, make_ray_worker=False)

    class Recorder:
        def __init__(self, config):
            self.config = config

    monkeypatch.setattr(vllm_worker, "vLLMWorker", Recorder)
    worker = make_vllm_worker(
        model_name=str(default_model_path), make_ray_worker=False, max_model_len=512, enable_prefix_caching=False
    )
    config = worker.config
    assert config.model == str(default_model_path) and config.max_model_len == 512
    assert config.extra == {"enable_prefix_caching": False} and config.tensor_parallel_size == 1


def test_torchrls_module_names_import_by_the_porting_rule():
    """``from torchrl.modules.llm import ...`` names of TorchRL's reference page, ported."""
    from llmrl_core import modules
    from llmrl_core.modules.backends.vllm.worker import LLMOnDevice, vLLMWorker
    from llmrl_core.modules.policies.distributions import CategoricalSequential
    from llmrl_core.weight_sync.process_group import stateless_init_process_group

    assert modules.CategoricalSequential is CategoricalSequential and modules.vLLMWorker is vLLMWorker
    assert modules.LLMOnDevice is LLMOnDevice and modules.stateless_init_process_group is stateless_init_process_group
    if not torch.cuda.is_available():  # TorchRL's defaults: 127.0.0.1 (here), a free port, cuda:0
        with pytest.raises(RuntimeError, match="NCCL weight sync needs CUDA"):
            modules.stateless_init_process_group(None, None, 0, 1)


def test_padded_token_prompts_keep_a_chats_end_of_turn_tokens_and_the_first_log_prob_is_the_models(hf_model_fp32):
    """SmolLM2's pad token is its ``<|im_end|>``, which closes every chat turn. Token prompts given padded without a
    mask lose only the padding at the row's ends: the turns' ``<|im_end|>`` stay, so tokens mode (ragged or padded)
    answers as text mode does. (TorchRL 0.14.1 drops or masks them, so its tokens mode answers another prompt, and
    writes 0.0 as the first response token's log-prob.) The first log-prob is the model's, from a direct forward."""
    model, tokenizer = hf_model_fp32
    pad = tokenizer.pad_token_id
    chats = [CHATS[0], CHATS[1]]
    texts = History.from_chats(chats).apply_chat_template(tokenizer=tokenizer, add_generation_prompt=True)
    ids = [torch.tensor(tokenizer(t)["input_ids"]) for t in texts]
    assert all(int((row[:-1] == pad).sum()) >= 1 for row in ids)  # every prompt closes a turn with the pad id
    kwargs = {"generate_kwargs": {"max_new_tokens": 5, "do_sample": False}, "return_log_probs": True}
    by_text = TransformersWrapper(model, tokenizer=tokenizer, input_mode="text", **kwargs)(
        TensorDict(text=Text(prompt=texts, batch_size=(2,)), batch_size=(2,))
    )
    tokens_policy = TransformersWrapper(model, tokenizer=tokenizer, input_mode="tokens", **kwargs)
    ragged = tokens_policy(TensorDict(tokens=lazy_stack([Tokens(prompt=row) for row in ids]), batch_size=(2,)))
    left = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True, padding_value=pad, padding_side="left")
    padded = tokens_policy(TensorDict(tokens=Tokens(prompt=left, batch_size=(2,), padded=True), batch_size=(2,)))
    want = by_text.get(("tokens", "response"), as_list=True)
    for out in (ragged, padded):
        assert [p.tolist() for p in out.get(("tokens", "prompt"), as_list=True)] == [r.tolist() for r in ids]
        assert [r.tolist() for r in out.get(("tokens", "response"), as_list=True)] == [r.tolist() for r in want]
    first = by_text.get(("log_probs", "response"), as_list=True)
    with torch.no_grad():
        for row, response, lp in zip(ids, want, first, strict=True):
            logits = model(row.unsqueeze(0)).logits[0, -1]
            expected = torch.log_softmax(logits.float(), -1)[response[0]]
            assert float(lp[0]) != 0.0 and abs(float(lp[0]) - float(expected)) < 1e-4
