"""``rollout.backend: transformers``: the Transformers engine behind the rollout actors' interface, and a GRPO flow
that runs with vLLM made unimportable."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from cli_runs import cli_env, run_llmrl

from llmrl_core.modules.backends.types import EngineConfig, SamplingConfig
from llmrl_core.pipeline.config_io import load_config
from llmrl_core.pipeline.grpo_config import GRPOConfig
from runtime.weight_sync import Endpoint, choose_weight_route

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def engine(default_model_path):
    from llmrl_core.modules.backends.vllm.worker import start_engine

    worker = start_engine(EngineConfig(model=default_model_path, backend="transformers", dtype="float32", device="cpu"))
    yield worker
    worker.close()


def _prompts(tokenizer) -> list[list[int]]:
    chats = [[{"role": "user", "content": q}] for q in ("What is 2 + 3?", "Name a colour.")]
    text = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in text]


def _by_hand(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """One forward of prompt + response: log_softmax(logits / T) at each response token."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_the_engine_samples_groups_with_the_log_probs_of_its_sampling_distribution(engine):
    from llmrl_core.modules.backends.transformers.worker import TransformersWorker

    assert isinstance(engine, TransformersWorker)
    prompts = _prompts(engine.get_tokenizer())
    sampling = SamplingConfig(max_new_tokens=20, temperature=0.7, seed=11)
    groups = engine.generate(prompts, sampling, n=3)
    assert [len(g) for g in groups] == [3, 3]
    for prompt, group in zip(prompts, groups, strict=True):
        assert len({tuple(c.token_ids) for c in group}) > 1  # a group's samples differ
        for c in group:
            assert c.prompt_token_ids == prompt and c.finish_reason in ("stop", "length")
            assert len(c.logprobs) == len(c.token_ids) <= 20
            expected = _by_hand(engine.model, prompt, c.token_ids, 0.7)  # processed_logprobs: T applied
            assert (expected - torch.tensor(c.logprobs)).abs().max().item() < 1e-4
            if c.finish_reason == "stop":
                assert c.token_ids[-1] == engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    again = engine.generate(prompts, sampling, n=3)
    assert [c.token_ids for g in again for c in g] == [c.token_ids for g in groups for c in g]  # seeded


def test_raw_log_probs_are_the_teacher_forced_ones_and_stop_strings_end_a_response(default_model_path):
    from llmrl_core.modules.backends.transformers.worker import TransformersWorker

    worker = TransformersWorker(
        EngineConfig(model=default_model_path, dtype="float32", device="cpu", logprobs_mode="raw_logprobs"),
        max_batch=1,  # one sequence per generate call: batching changes nothing a caller sees
    )
    try:
        prompts = _prompts(worker.get_tokenizer())
        out = worker.generate(prompts, SamplingConfig(max_new_tokens=24, temperature=0.9, seed=2, stop=[" "]), n=2)
        for prompt, group in zip(prompts, out, strict=True):
            for c in group:
                scored = worker.score([prompt], [c.token_ids])[0]
                assert (scored - torch.tensor(c.logprobs)).abs().max().item() < 1e-4
                assert (_by_hand(worker.model, prompt, c.token_ids, 1.0) - scored).abs().max().item() < 1e-4
                decoded = worker.tokenizer.decode(c.token_ids, skip_special_tokens=True)
                if c.finish_reason == "stop" and " " in decoded:  # ended by the stop string, not a stop token
                    assert " " not in worker.tokenizer.decode(c.token_ids[:-1], skip_special_tokens=True)
                    assert c.text == decoded[: decoded.index(" ")] and " " not in c.text
    finally:
        worker.close()


def test_weights_load_by_version_and_a_state_dict_that_does_not_fit_is_refused(engine, tmp_path):
    from safetensors.torch import save_file

    from llmrl_core.weight_sync.fingerprint import weights_fingerprint

    base = {k: v.clone() for k, v in engine.model.state_dict().items()}
    prompt = _prompts(engine.get_tokenizer())[0]
    response = engine.generate([prompt], SamplingConfig(max_new_tokens=8, temperature=0))[0][0].token_ids
    before = engine.score([prompt], [response])[0]
    changed = {k: v + 0.01 * torch.randn_like(v) if k.endswith("mlp.down_proj.weight") else v for k, v in base.items()}
    changed.pop("lm_head.weight", None)  # a checkpoint of a tied model may carry one of the two names
    save_file(changed, str(tmp_path / "v1.safetensors"))
    try:
        assert engine.load_weights(str(tmp_path / "v1.safetensors"), 1) == 1 and engine.policy_version == 1
        tied = bool(engine.model.config.tie_word_embeddings)
        assert engine.weights_fingerprint() == {
            "fingerprint": weights_fingerprint(changed, "float32", tied=tied),
            "dtype": "float32",
        }
        assert (engine.score([prompt], [response])[0] - before).abs().max().item() > 1e-4
        with pytest.raises(ValueError, match=r"version 2 do not fit.*unexpected \['extra.weight'\]"):
            engine.load_weights({**changed, "extra.weight": torch.zeros(1)}, 2)
        assert engine.policy_version == 1  # the refused load changed nothing
        with pytest.raises(RuntimeError, match="rollout.weight_sync=checkpoint"):
            engine.weight_group_size()
    finally:
        engine.load_weights(base, 0)
    assert (engine.score([prompt], [response])[0] - before).abs().max().item() < 1e-5


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rollout.weight_sync=nccl", "rollout.weight_sync must be auto, checkpoint or cuda_ipc with rollout.backend=t"),
        ("rollout.tensor_parallel_size=2", "rollout.tensor_parallel_size must be 1 with rollout.backend=trans"),
        ("env.agent=tests.agent_examples.calculator_agent:solve_async", "transformers cannot serve env.agent"),
    ],
)
def test_settings_the_transformers_engine_cannot_run_are_refused_by_name(override, message):
    with pytest.raises(Exception, match=message):
        load_config(GRPOConfig, None, ["rollout.backend=transformers", override])


def test_the_weight_route_of_transformers_engines():
    """No broadcast group on this engine: the checkpoint, or CUDA IPC when asked for and every engine runs on the
    trainer's GPU (opt-in: ``auto`` keeps the checkpoint / shared file until it has run on a GPU)."""
    gpu = Endpoint("h", "cuda", ("0",))
    apart = Endpoint("h", "cuda", ("1",), backend="transformers")
    beside = Endpoint("h", "cuda", ("0",), backend="transformers")
    route = choose_weight_route("auto", gpu, [apart])
    assert route.name == "checkpoint" and "rollout.backend=transformers engines load each version" in route.reason
    route = choose_weight_route("auto", gpu, [beside, beside])
    assert route.name == "checkpoint" and "rollout.weight_sync=cuda_ipc hands it over on the GPU" in route.reason
    assert choose_weight_route("cuda_ipc", gpu, [beside, beside]).name == "cuda_ipc"
    with pytest.raises(ValueError, match="engine 1 runs on GPU 1"):
        choose_weight_route("cuda_ipc", gpu, [beside, apart])  # one engine elsewhere
    cpu = Endpoint("h", "cpu", backend="transformers")
    assert choose_weight_route("auto", Endpoint("h", "cpu"), [cpu]).name == "checkpoint"
    assert choose_weight_route("auto", Endpoint("other", "cuda", ("0",)), [beside]).name == "checkpoint"  # 2 hosts
    assert choose_weight_route("cuda_ipc", gpu, [beside]).name == "cuda_ipc"
    with pytest.raises(ValueError, match="cuda_ipc hands the weights over on the trainer's GPU, and engine 0 runs"):
        choose_weight_route("cuda_ipc", gpu, [apart])
    for mode in ("nccl", "gloo"):
        with pytest.raises(ValueError, match=f"weight_sync={mode}: rollout.backend=transformers engines join no"):
            choose_weight_route(mode, gpu, [apart])
    assert choose_weight_route("checkpoint", gpu, [beside]).name == "checkpoint"
    assert choose_weight_route("auto", gpu, [Endpoint("h", "cuda", ("1",))]).name == "nccl"  # vLLM engines


def test_the_memory_plan_counts_the_cuda_ipc_copy_of_a_transformers_run(default_model_path):
    """One GPU, transformers engine, ``rollout.weight_sync=cuda_ipc``: the trainer's fp32 copy of the weights is in the
    plan; with ``auto`` (the shared file) it is not, and with the engine on another GPU the route is refused (no
    plan line: the placement check names the setting)."""
    from runtime.memory_check import plan_run

    capacity = {"cpu": 64 * 2**30, "cuda:0": 80 * 2**30, "cuda:1": 80 * 2**30}

    def copies(sync: str, gpus: list[str]) -> list[str]:
        cfg = load_config(GRPOConfig, None, ["rollout.backend=transformers", f"rollout.weight_sync={sync}"])
        plan = plan_run(cfg, gpus=gpus, capacity=capacity)
        return [line.device for line in plan.lines if line.item == "weights shared over CUDA IPC"]

    assert copies("cuda_ipc", ["0"]) == ["cuda:0"]
    assert copies("auto", ["0"]) == []
    assert copies("cuda_ipc", ["0", "1"]) == []


@pytest.mark.slow
def test_a_grpo_run_on_the_transformers_engine_needs_no_vllm(tmp_path, default_model_path):
    """``llmrl run grpo`` with rollout.backend=transformers and ``import vllm`` failing in every process: two
    iterations and the final evaluation run; the stored sampler log-probs agree with the trainer's."""
    blocker = tmp_path / "no_vllm" / "vllm"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text('raise ImportError("vllm is not installed on this machine (test)")\n')
    runs = tmp_path / "runs"
    overrides = [
        "run_id=hf1",
        f"runs_dir={runs}",
        "iterations=2",
        "data.prompts_per_iteration=2",
        "data.group_size=2",
        "rollout.backend=transformers",
        "rollout.max_new_tokens=24",
        "rollout.dtype=float32",
        "train.mixed_precision=no",
        "rollout.temperature=0.7",
        "train.lr=1e-5",
        "final_eval.questions=4",
        "final_eval.samples=1",
        "progress=false",
    ]
    env = cli_env(PYTHONPATH=os.pathsep.join([str(blocker.parent), str(ROOT)]))
    done = run_llmrl("run", "grpo", "--config", "recipes/gsm8k-demo.yaml", settings=overrides, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "held-out accuracy" in out
    assert "rollout.backend=transformers engines load each version from its checkpoint" in out

    from storage.trajectories import TrajectoryStore

    store = TrajectoryStore(runs / "trajectories")
    for version in (0, 1):
        records = store.read_records("hf1", version=version)
        assert len(records) == 4
        assert all(r.sampling_params["logprobs_mode"] == "processed_logprobs" for r in records)
        metrics = json.loads((runs / "hf1" / "state" / f"published-v{version + 1}.json").read_text())["metrics"]
        assert metrics["agreement_abs_diff_mean"] < 1e-3, metrics  # fp32 engine and trainer, same temperature


def _main_job(tmp_path: Path, backend: str) -> tuple[float, float, float, float, str]:
    """The main job (``llmrl run grpo``, its 10 versions and 100 held-out problems) on ``backend``; returns the
    held-out line's base, last, delta and its standard error, and the console."""
    import re

    settings = [f"runs_dir={tmp_path / backend}", f"rollout.backend={backend}", "progress=false"]
    proc = run_llmrl("run", "grpo", settings=settings, timeout=3600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    line = re.search(r"held-out accuracy (\d\.\d\d) -> (\d\.\d\d) \(([+-]\d\.\d\d) ± (\d\.\d\d)", out)
    assert line, out[-4000:]
    base, last, delta, se = (float(line.group(i)) for i in (1, 2, 3, 4))
    return base, last, delta, se, out


@pytest.mark.extended  # the long tier: pytest -m extended (README "Tests"); ~25 min on 2 cores
def test_the_main_job_learns_on_the_transformers_engine_as_on_vllm(tmp_path):
    """The main job as a user runs it, once on vLLM and once with rollout.backend=transformers (same seed, same
    prompts; the engines sample differently): the transformers run learns (held-out accuracy up by more than twice
    its standard error) and its gain is the vLLM run's within noise (three standard errors of the difference)."""
    hf = _main_job(tmp_path, "transformers")
    vllm = _main_job(tmp_path, "vllm")
    print(f"held-out: transformers {hf[:4]}, vllm {vllm[:4]}")
    assert hf[2] > 2 * hf[3], hf[4][-2000:]
    assert abs(hf[2] - vllm[2]) <= 3 * (hf[3] ** 2 + vllm[3] ** 2) ** 0.5, (hf[:4], vllm[:4])
