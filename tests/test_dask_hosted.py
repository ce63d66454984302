"""TorchRL's Ray-hosted classes on Dask: RayLLMCollector, RayKLRewardTransform, RayRetrieveKL (and the
llmrl_core.dask_hosting mechanism under them) on a real local Dask cluster.

One cluster serves the module (one worker process, as the classes' own clusters have); the test of a class
starting its own cluster is the only one that starts another.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict, is_tensor_collection, lazy_stack, set_list_to_stack

from llmrl_core.collectors import LLMCollector, RayLLMCollector
from llmrl_core.dask_hosting import DaskHost, dask_resources, refuse_ray_only
from llmrl_core.data import LLMData
from llmrl_core.envs import ChatEnv
from llmrl_core.envs.transforms.kl_hosted import RayKLRewardTransform, RayRetrieveKL

ROWS = [{"query": f"q{i}"} for i in range(6)]


# --- module-level (picklable) pieces the worker builds --------------------------------------------------
def scripted_policy(data: LLMData) -> LLMData:
    """Answers each prompt of a batch with its position (no model)."""
    return LLMData(text_response=[f"ok {i}" for i in range(data.batch_size)], finish_reasons=["stop"] * data.batch_size)


def scripted_policy_factory():
    return scripted_policy


def scripted_env() -> ChatEnv:
    """Two slots, one turn per episode."""
    return ChatEnv(batch_size=2, chat_template_name="chatml", max_turns=1)


def tiny_llama(seed: int, vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(config).eval()


def scoring_wrapper(tokenizer_path: str, seed: int, **kwargs):
    """A scoring TransformersWrapper (``generate=False``) over a tiny random Llama: the model factories."""
    from transformers import AutoTokenizer

    from llmrl_core.modules.policies import TransformersWrapper

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    return TransformersWrapper(tiny_llama(seed, len(tokenizer)), tokenizer=tokenizer, generate=False, **kwargs)


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.n = start

    def add(self, by: int = 1) -> int:
        self.n += by
        return self.n

    def __iter__(self):
        return iter(range(self.n))


class Relay:
    """Holds a DaskHost handle (pickled into this actor) and calls through it."""

    def __init__(self, host: DaskHost) -> None:
        self.host = host

    def add(self) -> int:
        return self.host.call("add")


# --- helpers ------------------------------------------------------------------------------------------------
def plain(value):
    """A batch as nested lists/dicts of Python values, for ``==`` (TensorDicts through ``tolist``)."""
    if is_tensor_collection(value):
        return plain(value.tolist())
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from one_worker_cluster import one_worker_cluster

    with one_worker_cluster(tmp_path_factory.mktemp("dask")) as client:
        yield client


# --- the mechanism --------------------------------------------------------------------------------------------
def test_dask_host_runs_the_object_in_an_actor(client):
    with client.as_current():  # the current client is found (distributed.get_client())
        host = DaskHost(Counter, kwargs={"start": 2}, actor_name="llmrl-test-counter")
    with host:
        assert not host.owns_cluster and host.where()["pid"] != os.getpid()
        assert host.call("add") == 3 and host.call("add", by=4) == 7 and host.get("n") == 7
        host.set("n", 2)
        assert [host.submit_next().result() for _ in range(4)] == [(True, 0), (True, 1), (False, None), (True, 0)]
        with pytest.raises(AttributeError, match="no attribute 'missing'"):  # the remote error comes back
            host.call("missing")
        twin = DaskHost(Counter, kwargs={"start": 100}, client=client, actor_name="llmrl-test-counter")
        assert twin.get("n") == 2  # the same name reaches the same live actor (Ray's named actors)
        twin.close()
        assert host.call("add") == 3  # closing one handle leaves the actor to the other
        relay = DaskHost(Relay, args=(host,), client=client)  # a pickled handle reaches the actor from a worker
        assert relay.call("add") == 4 and host.get("n") == 4
        relay.close()
        assert host.call("add") == 5  # the copy owned nothing
        path_built = DaskHost("collections:Counter", args=("abca",), client=client)
        assert path_built.call("most_common", 1) == [("a", 2)]
        path_built.close()
    assert host.closed
    assert dask_resources(None) == {} and dask_resources(0) == {} and dask_resources(2) == {"GPU": 2.0}
    refuse_ray_only("X", ray_init_config=None, remote_config=None)  # None is fine


# A script as a TorchRL user writes it: no client, no `if __name__ == "__main__":` guard, the hosted class defined
# in the script itself, and a host left open at exit.
OWNED_CLUSTER_SCRIPT = """
import torch
from llmrl_core.dask_hosting import DaskHost

class Tally:
    def __init__(self, start):
        self.n = start
    def add(self):
        self.n += 1
        return self.n

host = DaskHost(Tally, kwargs={"start": 1}, num_cpus=2)
assert host.owns_cluster and host.call("add") == 2
cluster = host._lease.cluster
assert cluster.scheduler_address.startswith("tcp://127.0.0.1:"), cluster.scheduler_address
assert list(host.client.run(torch.get_num_threads).values()) == [2]  # num_cpus on an owned worker
host.close()
assert cluster.status.name == "closed", cluster.status
left_open = DaskHost(Tally, args=(5,))  # closed at interpreter exit
assert left_open.call("add") == 6
print("OK")
"""


def test_a_host_without_a_client_owns_a_local_cluster(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(OWNED_CLUSTER_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "OK", proc.stdout + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_gpu_and_device_requests_fail_clearly_without_gpus(client):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="no worker of the Dask cluster .* declares the resources"):
        DaskHost(Counter, client=client, num_gpus=1)
    with pytest.raises(ValueError, match="this machine has 0 CUDA GPU"):
        DaskHost(Counter, num_gpus=1)  # would start an owned cluster: refused before
    with pytest.raises(RuntimeError, match="device='cuda' was asked for, but the Dask worker"):
        DaskHost(Counter, client=client, device=torch.device("cuda"))
    with pytest.raises(RuntimeError, match="has 0 CUDA device"):  # the seed's Option 2, on this machine
        RayKLRewardTransform(ref_model=object(), device=torch.device("cuda"), client=client)


# --- RayLLMCollector -----------------------------------------------------------------------------------------
def test_ray_llm_collector_signature_is_torchrls():
    # TorchRL 0.14.1's RayLLMCollector.__init__ (inspect.signature in its side venv); llmrl adds keyword-only extras
    expected = [
        ("env", inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty),
        ("policy", inspect.Parameter.KEYWORD_ONLY, None),
        ("policy_factory", inspect.Parameter.KEYWORD_ONLY, None),
        ("dialog_turns_per_batch", inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.empty),
        ("total_dialog_turns", inspect.Parameter.KEYWORD_ONLY, -1),
        ("yield_only_last_steps", inspect.Parameter.KEYWORD_ONLY, None),
        ("yield_completed_trajectories", inspect.Parameter.KEYWORD_ONLY, None),
        ("postproc", inspect.Parameter.KEYWORD_ONLY, None),
        ("async_envs", inspect.Parameter.KEYWORD_ONLY, None),
        ("replay_buffer", inspect.Parameter.KEYWORD_ONLY, None),
        ("reset_at_each_iter", inspect.Parameter.KEYWORD_ONLY, False),
        ("flatten_data", inspect.Parameter.KEYWORD_ONLY, None),
        ("weight_updater", inspect.Parameter.KEYWORD_ONLY, None),
        ("ray_init_config", inspect.Parameter.KEYWORD_ONLY, None),
        ("remote_config", inspect.Parameter.KEYWORD_ONLY, None),
        ("track_policy_version", inspect.Parameter.KEYWORD_ONLY, False),
        ("sync_iter", inspect.Parameter.KEYWORD_ONLY, True),
        ("verbose", inspect.Parameter.KEYWORD_ONLY, False),
        ("num_cpus", inspect.Parameter.KEYWORD_ONLY, None),
        ("num_gpus", inspect.Parameter.KEYWORD_ONLY, None),
    ]
    params = list(inspect.signature(RayLLMCollector).parameters.values())
    assert [(p.name, p.kind, p.default) for p in params[: len(expected)]] == expected
    assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in params[len(expected) :])
    # the KL variants: TorchRL's signatures as recorded in its side venv (tests/goldens/torchrl/api_probes.json)
    probes = json.loads((Path(__file__).parent / "goldens" / "torchrl" / "api_probes.json").read_text())
    for cls in (RayKLRewardTransform, RayRetrieveKL):
        golden = probes["signatures"][cls.__name__]["parameters"]
        ours = list(inspect.signature(cls).parameters.values())
        named = [p for p in golden if p["kind"] != "VAR_KEYWORD"]
        assert [(p.name, p.kind.name, repr(p.default)) for p in ours[: len(named)]] == [
            (p["name"], p["kind"], p["default"]) for p in named
        ]
        assert ours[-1].kind is inspect.Parameter.VAR_KEYWORD and golden[-1]["kind"] == "VAR_KEYWORD"


def test_ray_only_arguments_are_refused():
    for name in ("ray_init_config", "remote_config"):
        with pytest.raises(ValueError, match=f"{name}=.* is a Ray setting, and RayLLMCollector runs on Dask"):
            RayLLMCollector(scripted_env, policy=scripted_policy, dialog_turns_per_batch=2, **{name: {"num_cpus": 1}})
    with pytest.raises(ValueError, match="runtime_env=.* RayKLRewardTransform runs on Dask"):
        RayKLRewardTransform(ref_model_factory=scripted_policy_factory, runtime_env={"pip": ["x"]})
    with pytest.raises(ValueError, match="remote_config=.* RayRetrieveKL runs on Dask"):
        RayRetrieveKL(None, ref_model=1, gen_model_factory=scripted_policy_factory, remote_config={})


def test_ray_llm_collector_gives_the_local_collectors_batches(client):
    kwargs = dict(
        policy_factory=scripted_policy_factory, dialog_turns_per_batch=2, prompts=ROWS, total_trajectories=6,
        track_policy_version=True,
    )  # fmt: skip
    local = LLMCollector(scripted_env, **kwargs)
    expected = []
    for batch in local:
        expected.append(plain(batch))
        local.update_policy_weights_()  # no weight updater: the version advances
    buffer = []

    class Buffer:  # a replay buffer stays in this process: each batch is delivered here
        def extend(self, batch):
            buffer.append(batch)

    with RayLLMCollector(scripted_env, replay_buffer=Buffer(), client=client, **kwargs) as remote:
        assert remote.where()["pid"] != os.getpid()
        assert remote.get_policy_version() == 0 and remote.dialog_turns_per_batch == 2
        yielded = []
        for batch in remote:
            yielded.append(batch)
            assert remote.update_policy_weights_() == len(yielded)
        assert yielded == [None] * 3  # TorchRL: batches go to the replay buffer, not to the loop
        got = [plain(b) for b in buffer]
        assert got == expected and len(got) == 3
        assert [row["policy_version"] for batch in got for row in batch] == [0, 0, 1, 1, 2, 2]
        assert remote.policy_version == 3 and remote.increment_version() == 4 and remote.get_policy_version() == 4
        assert remote.init_random_frames == 0
        with pytest.raises(NotImplementedError, match="no start"):
            remote.start()
    assert remote._host.closed

    # sync_iter=False: the next batch is collected while this one is handled; same batches without updates
    local = [plain(b) for b in LLMCollector(scripted_env, **kwargs)]
    with RayLLMCollector(scripted_env, sync_iter=False, client=client, **kwargs) as remote:
        assert [plain(b) for b in remote] == local
    with RayLLMCollector(scripted_env, client=client, **kwargs) as remote:  # TorchRL's next(): None at the end
        assert [plain(remote.next()) for _ in range(3)] == local and remote.next() is None
    # the remote collector's own argument errors come back as they are
    with pytest.raises(TypeError, match="exactly one of policy and policy_factory"):
        RayLLMCollector(scripted_env, dialog_turns_per_batch=2, client=client)


# --- the KL transforms ---------------------------------------------------------------------------------------
def test_kl_variants_argument_errors():
    with pytest.raises(ValueError, match="Cannot provide both 'ref_model' and 'ref_model_factory'. Choose one."):
        RayKLRewardTransform(ref_model=1, ref_model_factory=scripted_policy_factory)
    with pytest.raises(ValueError, match="Must provide exactly one of 'ref_model' or 'ref_model_factory'."):
        RayKLRewardTransform()
    with pytest.raises(ValueError, match="Cannot provide both 'gen_model' and 'gen_model_factory'. Choose one."):
        RayRetrieveKL(gen_model_factory=scripted_policy_factory)  # gen_model defaults to "from_collector"
    with pytest.raises(ValueError, match="Cannot provide both 'ref_model' and 'ref_model_factory'. Choose one."):
        RayRetrieveKL(None, ref_model=1, ref_model_factory=scripted_policy_factory)


CHATS = [
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello, how are you?"},
        {"role": "assistant", "content": "I'm doing well, thank you!"},
    ],
    [{"role": "user", "content": "What's 2+2?"}, {"role": "assistant", "content": "4"}],
]


def _kl_transforms_landed() -> bool:
    from llmrl_core.envs.transforms import kl

    return "gen_log_probs_full_key" in inspect.signature(kl.RetrieveKL).parameters and hasattr(
        kl.KLRewardTransform, "_step"
    )


@pytest.mark.engine
@pytest.mark.skipif(not _kl_transforms_landed(), reason="the TensorDict KL transforms have not landed")
def test_hosted_kl_transforms_equal_the_local_ones(client, default_model_path):
    from llmrl_core.data.history import History
    from llmrl_core.envs.transforms.kl import KLRewardTransform, RetrieveKL
    from llmrl_core.modules.policies import ChatHistory

    with set_list_to_stack(True):
        chat = ChatHistory(full=History.from_chats(CHATS))

        def history_data() -> TensorDict:
            return TensorDict(history=chat, next=TensorDict(history=chat, batch_size=(2,)), batch_size=(2,))

        gen = functools.partial(scoring_wrapper, default_model_path, 2, input_mode="history", pad_output=True)
        ref = functools.partial(scoring_wrapper, default_model_path, 3, input_mode="history", pad_output=True)
        gen_key, ref_key = {"log_probs_key": "gen_log_probs"}, {"log_probs_key": "ref_log_probs"}
        local = RetrieveKL(gen(**gen_key), ref(**ref_key), assistant_only=True)
        # Option 1 of the seed: factories, called on the worker
        with RayRetrieveKL(
            None, None, gen_model_factory=functools.partial(gen, **gen_key),
            ref_model_factory=functools.partial(ref, **ref_key), assistant_only=True, client=client,
        ) as hosted:  # fmt: skip
            expected = local(history_data())
            got = hosted(history_data())
            assert plain(got) == plain(expected)
            assert got["next", "kl_penalty"].shape == (2, expected["next", "kl_penalty"].shape[1])
            step = hosted._step(history_data(), history_data()["next"])  # the env hook
            assert plain(step) == plain(local._step(history_data(), history_data()["next"]))

        # KLRewardTransform, Option 2 of the seed: the reference model passed directly (pickled to the worker)
        tokens_ref = scoring_wrapper(default_model_path, 3, input_mode="tokens")
        ids = [torch.tensor([1, 2, 3, 4, 5]), torch.tensor([6, 7, 8])]
        step = lazy_stack(
            [
                TensorDict({("tokens", "full"): t, ("log_probs", "full"): -torch.rand(len(t)),
                            ("masks", "all_assistant_mask"): torch.arange(len(t)) >= 2})
                for t in ids
            ]
        )  # fmt: skip

        def reward_data():
            return step.copy().set("next", TensorDict(reward=torch.tensor([[1.0], [2.0]]), batch_size=(2,)))

        with RayKLRewardTransform(tokens_ref, coef=0.5, client=client) as hosted:
            expected = KLRewardTransform(tokens_ref, coef=0.5)(reward_data())
            got = hosted(reward_data())
            assert plain(got) == plain(expected)
            assert hosted.in_keys == ["reward", ("tokens", "full")]
            assert "RetrieveKL" not in repr(hosted) and "KLRewardTransform" in repr(hosted)


def test_ray_mc_advantage_completes_a_group_across_writers(client):
    """``RayMCAdvantage``: the queues live in one Dask actor, so two writers (two objects naming the same actor)
    complete one group together; the advantages are MCAdvantage's (TorchRL's docstring example: -0.7071, 0.7071)."""
    from llmrl_core.objectives import RayMCAdvantage

    def traj(group: int, rewards: list[float]) -> TensorDict:
        steps = len(rewards)
        done = torch.tensor([False] * (steps - 1) + [True]).reshape(steps, 1)
        reward = torch.tensor(rewards).reshape(steps, 1)
        return TensorDict(group_id=torch.full((steps,), group), next=TensorDict(reward=reward, done=done,
                          batch_size=[steps]), batch_size=[steps])  # fmt: skip

    kwargs = {"grpo_size": 2, "prompt_key": "group_id", "trajectory_return": "sum", "client": client}
    with RayMCAdvantage(**kwargs, actor_name="llmrl-test-mc-advantage") as first:
        second = RayMCAdvantage(**kwargs, actor_name="llmrl-test-mc-advantage")
        assert first.inv(traj(0, [0.0])) is None and second.inv(traj(1, [1.0, 0.0])) is None
        assert (first.queued_groups, second.queued_trajectories) == (2, 2)
        out = second.inv(traj(0, [1.0]))
        assert out["advantage"].reshape(-1).tolist() == pytest.approx([-0.7071068, 0.7071068])
        assert out["group_id"].tolist() == [0, 0] and first.in_keys[0] == "group_id"
        stats = first.get_stats()
        assert (stats["written_groups"], stats["queued_groups"], stats["completed_trajectories"]) == (1, 1, 3)
        first.clear_queues()
        assert second.queued_groups == 0
    with pytest.raises(ValueError, match="ray_init_config=.* is a Ray setting"):
        RayMCAdvantage(grpo_size=2, ray_init_config={"ignore_reinit_error": True}, client=client)
