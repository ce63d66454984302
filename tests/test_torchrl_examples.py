"""The source documents' own TorchRL examples, run on llmrl with only their imports changed.

Each file in ``tests/torchrl_examples/`` holds one example as documented (TorchRL's imports, the hub model id
replaced by ``DEFAULT_MODEL``; a marked preamble only where the document leaves names undefined). This test
applies the import rule — ``torchrl.<pkg>.llm[.<sub>]`` (and ``torchrl.<pkg>``) becomes ``llmrl_core.<pkg>[.<sub>]``
— as one search-and-replace, runs the file, and compares what it leaves behind with what TorchRL 0.14.1 left
(``tests/goldens/torchrl/<example>.json``, written by ``scripts/torchrl_goldens.py`` in a side venv): the same
keys, classes, shapes, dtypes and values (floats within tolerance) for every global both runs produced. Most of
these examples fail in TorchRL 0.14.1 itself (its error is in the golden); for those the document's text is
the spec, and each test below asserts what the text says.
"""

from __future__ import annotations

import builtins
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.torchrl_golden_format import summarize_globals

EXAMPLES = Path(__file__).parent / "torchrl_examples"
GOLDENS = Path(__file__).parent / "goldens" / "torchrl"
IMPORT_RULE = re.compile(r"\btorchrl\.(\w+)(?:\.llm\b)?")


def port(source: str) -> str:
    """TorchRL code -> llmrl code: the one search-and-replace a user makes."""
    return IMPORT_RULE.sub(lambda m: f"llmrl_core.{m.group(1)}", source)


def test_the_import_rule():
    assert port("from torchrl.modules.llm.policies import ChatHistory") == (
        "from llmrl_core.modules.policies import ChatHistory"
    )
    assert port("from torchrl.envs.llm.transforms.kl import RetrieveKL") == (
        "from llmrl_core.envs.transforms.kl import RetrieveKL"
    )
    assert port("from torchrl.data.llm import History") == "from llmrl_core.data import History"
    assert port("from torchrl.envs import LLMEnv") == "from llmrl_core.envs import LLMEnv"
    assert port("from torchrl.collectors.llm.weight_update import x") == (
        "from llmrl_core.collectors.weight_update import x"
    )


def test_the_seeds_user_facing_imports_resolve_after_the_rule():
    """Names a TorchRL user imports beside the examples (custom transforms, type hints) resolve after the rule to
    the classes of the same role."""
    from llmrl_core.envs.transforms.td_base import Compose as TensorDictCompose
    from llmrl_core.envs.transforms.td_base import Transform as TensorDictTransform
    from llmrl_core.modules.policies.llm_wrapper_base import LLMWrapperBase as WrapperBase

    namespace: dict[str, Any] = {}
    exec(
        port(
            "from torchrl.envs import Transform, Compose\n"
            "from torchrl.envs.llm.transforms import Transform as T2\n"
            "from torchrl.modules.llm.policies.common import LLMWrapperBase\n"
        ),
        namespace,
    )
    assert namespace["Transform"] is namespace["T2"] is TensorDictTransform
    assert namespace["Compose"] is TensorDictCompose and namespace["LLMWrapperBase"] is WrapperBase


class EnoughOutput(Exception):
    """Raised by the harness's print once an endless example (a bare ``for data in collector``) has shown enough."""


def run_example(name: str, model_path: str, max_prints: int | None = None) -> tuple[dict[str, Any], list[str]]:
    """Run one example with its imports ported; returns its globals and what it printed."""
    source = port((EXAMPLES / f"{name}.py").read_text())
    printed: list[str] = []

    def capture(*args: Any, **kwargs: Any) -> None:
        printed.append(" ".join(str(a) for a in args))
        if max_prints is not None and len(printed) >= max_prints:
            raise EnoughOutput

    namespace: dict[str, Any] = {"__name__": f"torchrl_example_{name}", "DEFAULT_MODEL": model_path}
    namespace["__builtins__"] = {**vars(builtins), "print": capture}
    torch.manual_seed(0)
    try:
        exec(compile(source, str(EXAMPLES / f"{name}.py"), "exec"), namespace)
    except EnoughOutput:
        pass
    return namespace, printed


def golden(name: str) -> dict[str, Any]:
    return json.loads((GOLDENS / f"{name}.json").read_text())


def _where(path: str) -> str:
    return path or "<value>"


def assert_same(ours: dict, theirs: dict, path: str = "", atol: float = 1e-4, skip: frozenset = frozenset()) -> None:
    """Structural and numeric equality of two summaries (see tests/torchrl_golden_format.py); leaves whose path
    is in ``skip`` are compared by the caller (where the documents' text, not TorchRL's run, is the spec)."""
    if path in skip:
        return
    assert ours.get("kind") == theirs.get("kind"), f"{_where(path)}: {ours.get('kind')} != {theirs.get('kind')}"
    kind = theirs["kind"]
    if kind == "tensor":
        assert ours["shape"] == theirs["shape"], f"{_where(path)}: shape {ours['shape']} != {theirs['shape']}"
        assert ours["dtype"] == theirs["dtype"], f"{_where(path)}: dtype {ours['dtype']} != {theirs['dtype']}"
        if "values" in theirs and "values" in ours:
            a, b = torch.tensor(_finite(ours["values"])), torch.tensor(_finite(theirs["values"]))
            if a.is_floating_point():
                torch.testing.assert_close(a, b, atol=atol, rtol=1e-4, msg=f"{_where(path)}: values differ")
            else:
                assert a.tolist() == b.tolist(), f"{_where(path)}: values differ"
    elif kind in ("tensordict", "tensorclass"):
        assert ours["class"] == theirs["class"], f"{_where(path)}: class {ours['class']} != {theirs['class']}"
        assert ours["batch_size"] == theirs["batch_size"], f"{_where(path)}: batch_size differs"
        assert ours["keys"] == theirs["keys"], f"{_where(path)}: keys {ours['keys']} != {theirs['keys']}"
        assert ours["classes"] == theirs["classes"], f"{_where(path)}: nested classes differ"
        for leaf, summary in theirs["leaves"].items():
            assert_same(ours["leaves"][leaf], summary, f"{path}/{leaf}", atol, skip)
    elif kind == "nested_tensor":
        for i, (a, b) in enumerate(zip(ours["components"], theirs["components"], strict=True)):
            assert_same(a, b, f"{path}[{i}]", atol, skip)
    else:
        assert ours.get("value") == theirs.get("value"), f"{_where(path)}: {ours.get('value')} != {theirs.get('value')}"


def _finite(values: Any) -> Any:
    if isinstance(values, list):
        return [_finite(v) for v in values]
    return {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}.get(values, values)


def assert_matches_golden(
    name: str, namespace: dict[str, Any], names: list[str] | None = None, skip: frozenset = frozenset()
) -> None:
    """Every global TorchRL's run left (or ``names`` of them) equals ours, but for the leaves in ``skip``."""
    recorded = golden(name)["globals"]
    ours, _ = summarize_globals(namespace, exclude={"DEFAULT_MODEL"})
    for var in names if names is not None else sorted(recorded):
        assert var in ours, f"{name}: the example left no {var!r} (TorchRL's run did)"
        assert_same(ours[var], recorded[var], var, skip=skip)


# --- the examples ------------------------------------------------------------------------------------------------
def test_003_chat_env(default_model_path):
    ns, printed = run_example("003_chat_env", default_model_path)
    # TorchRL 0.14.1 resets the same way and fails on the step (a bare History where it wants a ChatHistory)
    assert golden("003_chat_env")["error"]["line_text"] == "next_obs = env.step(response_data)"
    assert_matches_golden("003_chat_env", ns, ["obs", "reset_data"])
    assert list(ns["obs"]["history"].prompt[0].role) == ["system", "user"]
    # the text's promise: after the step, the history is the full conversation
    assert list(ns["next_obs"]["history"].prompt[0].role) == ["system", "user", "assistant"]
    assert "History(" in printed[0] and len(printed) == 2


def test_004_retrieve_log_prob(default_model_path):
    ns, printed = run_example("004_retrieve_log_prob", default_model_path)
    assert golden("004_retrieve_log_prob")["ok"]
    assert_matches_golden("004_retrieve_log_prob", ns)
    assert printed[0] == "Created history with shape: torch.Size([2, 3])"


def test_004_retrieve_kl(default_model_path):
    ns, printed = run_example("004_retrieve_kl", default_model_path)
    kl_leaves = frozenset({"data/next/kl_penalty", "result/next/kl_penalty", "next_td/kl_penalty"})
    assert_matches_golden("004_retrieve_kl", ns, ["history", "data", "next_td", "result"], skip=kl_leaves)
    # TorchRL leaves the KL as a nested tensor and fails to print its shape; the text promises a (2, T) tensor
    kl = ns["kl"]
    theirs = golden("004_retrieve_kl")["globals"]["kl"]["components"]
    assert kl.shape == (2, len(theirs[0]["values"])) and printed[-1] == f"KL shape: {kl.shape}"
    for row, component in zip(kl, theirs, strict=True):
        torch.testing.assert_close(row, torch.tensor(_finite(component["values"])), atol=1e-4, rtol=1e-4)


def test_004_kl_computation(default_model_path):
    ns, printed = run_example("004_kl_computation", default_model_path)
    # TorchRL 0.14.1 names the arguments gen_log_probs_full_key/coeff and rejects the documented ones
    assert golden("004_kl_computation")["error"]["type"] == "TypeError"
    assert_matches_golden("004_kl_computation", ns, ["gen_log_probs", "ref_log_probs"])
    kl = ns["kl"]
    assert printed == ["KL shape: torch.Size([2, 10])"]
    torch.testing.assert_close(kl, ns["gen_log_probs"] - ns["ref_log_probs"])


def test_004_kl_reward_examples(default_model_path):
    ns, _ = run_example("004_kl_reward_recommended", default_model_path)
    assert type(ns["transform"]).__name__ == "RetrieveKL"
    ns, _ = run_example("004_kl_reward_legacy", default_model_path)
    # TorchRL 0.14.1 takes the reference model only; the text shows (gen_model, ref_model)
    assert golden("004_kl_reward_legacy")["error"]["type"] == "TypeError"
    assert type(ns["transform"]).__name__ == "KLRewardTransform"


def test_000_policy_version(default_model_path):
    ns, printed = run_example("000_policy_version", default_model_path, max_prints=3)
    assert golden("000_policy_version")["error"]["type"] == "TypeError"  # TorchRL needs dialog_turns_per_batch
    assert printed[0] == "1"  # the version after one weight update
    # every dialog turn stamped with that version; a batch is (env slots, steps) = (1, 1), as TorchRL's collector's
    assert printed[1:] == ["tensor([[1]])", "tensor([[1]])"]


def test_000_python_interpreter(default_model_path):
    ns, printed = run_example("000_python_interpreter", default_model_path)
    # TorchRL 0.14.1 wants the prompt under "query"; the text passes it as "text"
    assert golden("000_python_interpreter")["error"]["type"] == "RuntimeError"
    rendered = ns["s_"]["history"].apply_chat_template(tokenizer=ns["tokenizer"])
    text = rendered[0]
    assert "testing the square function with input 2: 4" in text
    assert text.endswith("<|im_start|>assistant\n")


@pytest.fixture()
def mocking_classes():
    """The example of seed 002 imports TorchRL's test helper ``DummyStrDataLoader`` from TorchRL's test tree (not
    part of the library): provide one, as its name says (batches of random short strings)."""

    class DummyStrDataLoader:
        def __init__(self, batch_size: int = 0) -> None:
            self.batch_size = batch_size
            self.generator = torch.Generator().manual_seed(0)

        def __iter__(self):
            return self

        def __next__(self) -> list[str] | str:
            def word() -> str:
                n = int(torch.randint(5, 12, (), generator=self.generator))
                return "".join(chr(int(c)) for c in torch.randint(97, 123, (n,), generator=self.generator))

            return [word() for _ in range(self.batch_size)] if self.batch_size else word()

    module = types.ModuleType("pytorch.rl.test.mocking_classes")
    module.DummyStrDataLoader = DummyStrDataLoader
    names = ["pytorch", "pytorch.rl", "pytorch.rl.test", "pytorch.rl.test.mocking_classes"]
    for name in names[:-1]:
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules[names[-1]] = module
    yield
    for name in names:
        sys.modules.pop(name, None)


@pytest.fixture
def eager_vllm(monkeypatch):
    """``vllm.LLM(model)`` with vLLM's defaults compiles the model with torch.inductor on CPU (~100 s of this test's
    ~140 s here); the example's output does not depend on it, so the test's vLLM runs eagerly, as llmrl's engines do
    on CPU. The example's text is unchanged: the default is set where vLLM reads it, in ``LLM``'s keyword arguments."""
    import vllm

    class EagerLLM(vllm.LLM):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("enforce_eager", True)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(vllm, "LLM", EagerLLM)


@pytest.mark.slow
@pytest.mark.isolated  # the example starts its own vLLM engine: give it a process of its own
def test_002_llm_collector(default_model_path, mocking_classes, eager_vllm):
    """TorchRL 0.14.1 cannot run this example (its side venv has no vLLM, and its LLMEnv writes a "text" observation
    its history-mode vLLMWrapper does not read): the text is the spec. An LLMEnv over the endless string loader,
    the collector hands out one dialog turn per batch, three in all; the third is printed."""
    assert golden("002_llm_collector")["error"]["type"] == "ModuleNotFoundError"
    ns, printed = run_example("002_llm_collector", default_model_path)
    env, data = ns["env"], ns["data"]
    assert type(env).__name__ == "LLMEnv" and env.batch_size == (1,) and ns["i"] == 2
    assert len(printed) == 1 and "TensorDict" in printed[0]
    assert data.batch_size == (1, 1)  # (env slots, steps): one slot, one turn per batch, as TorchRL lays it out
    data = data[0, 0]
    history = data["history"]
    prompt, full = history.prompt.to_messages(), history.full.to_messages()
    word = prompt[0].text
    assert prompt[0].role == "user" and word.isalpha() and word.islower()  # one of the loader's random words
    # no EOS rule was given, so the episode goes on: the third turn continues the first two answers
    assert [m.role for m in prompt] == ["user", "assistant", "assistant"]
    assert full[: len(prompt)] == prompt and full[-1].role == "assistant" and full[-1].text.strip()
    tokens = data.get(("tokens", "response"), None)
    assert tokens is not None and len(tokens) > 0  # the engine's sampled ids travel with the turn
    assert torch.isfinite(data.get(("log_probs", "response"))).all()


@pytest.mark.engine
@pytest.mark.parametrize(
    "name",
    [
        "004_ray_kl_reward_direct",
        "004_ray_kl_reward_factory",
        "004_ray_retrieve_kl_direct",
        "004_ray_retrieve_kl_factory",
    ],
)
def test_004_ray_hosted_examples(name, default_model_path):
    """The Ray-hosted examples ask for a GPU (num_gpus=1 / device="cuda"); llmrl hosts them as Dask actors. On a
    machine without one, the request fails at once with a message that names it (TorchRL 0.14.1 fails these
    examples before reaching Ray: see the goldens); with a GPU, the hosted transform is built."""
    assert not golden(name)["ok"]
    if torch.cuda.is_available():
        ns, _ = run_example(name, default_model_path)
        assert type(ns["transform"]).__name__.startswith("Ray")
        ns["transform"].close()
        return
    with pytest.raises((ValueError, RuntimeError), match="(?i)gpu|cuda"):
        run_example(name, default_model_path)
