"""Every TorchRL LLM-API name llmrl has takes TorchRL's arguments: names, kinds, defaults, as recorded from
TorchRL 0.14.1 itself (tests/goldens/torchrl/api_probes.json), imported by the one porting rule
``torchrl.<pkg>.llm[.<sub>]`` -> ``llmrl_core.<pkg>[.<sub>]``. llmrl may add keyword arguments after TorchRL's, and
may accept more than TorchRL (an argument TorchRL requires may have a default here, a keyword-only one may be
positional): every TorchRL call still works unchanged."""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import pytest

PROBES = json.loads((Path(__file__).parent / "goldens" / "torchrl" / "api_probes.json").read_text())["signatures"]

# Names whose TorchRL form needs TorchRL itself (none left: ``default_spec`` builds llmrl's own ``Composite``).
NOT_PORTED: set[str] = set()


def ported(import_line: str) -> str:
    """``from torchrl.envs.llm import X`` -> ``llmrl_core.envs`` (the README's porting rule)."""
    module = import_line.split()[1]
    parts = [p for p in module.split(".")[1:] if p != "llm"]
    return ".".join(["llmrl_core", *parts])


def ours(name: str, import_line: str):
    owner, _, member = name.partition(".")
    obj = getattr(importlib.import_module(ported(import_line)), owner)
    return getattr(obj, member) if member else obj


def signature_problems(name: str) -> list[str]:
    """How llmrl's ``name`` fails to take TorchRL's arguments (empty: it takes them)."""
    probe = PROBES[name]
    params = inspect.signature(ours(name, probe["import"])).parameters
    has_var_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    problems = []
    for theirs in probe["parameters"]:
        if theirs["kind"] in ("VAR_KEYWORD", "VAR_POSITIONAL"):
            continue
        mine = params.get(theirs["name"])
        if mine is None:
            problems.append(f"no {theirs['name']}" + (" (only **kwargs)" if has_var_keyword else ""))
        elif theirs["has_default"] and mine.default is inspect.Parameter.empty:
            problems.append(f"{theirs['name']}: optional in TorchRL, required here")
        elif theirs["has_default"] and repr(mine.default) != theirs["default"]:
            problems.append(f"{theirs['name']} defaults to {mine.default!r}, TorchRL's to {theirs['default']}")
        elif theirs["kind"] == "POSITIONAL_OR_KEYWORD" and mine.kind is inspect.Parameter.KEYWORD_ONLY:
            problems.append(f"{theirs['name']} is keyword-only here, positional in TorchRL")
    positional = [p["name"] for p in probe["parameters"] if p["kind"] == "POSITIONAL_OR_KEYWORD"]
    mine_positional = [n for n, p in params.items() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    if mine_positional[: len(positional)] != positional:
        problems.append(f"positional order {mine_positional} != TorchRL's {positional}")
    return problems


@pytest.mark.parametrize("name", sorted(set(PROBES) - NOT_PORTED))
def test_torchrl_arguments_are_accepted_with_torchrls_defaults(name):
    problems = signature_problems(name)
    assert not problems, f"{name}: " + "; ".join(problems)


def test_the_names_not_ported_need_torchrl_itself():
    assert NOT_PORTED <= set(PROBES)
    for name in NOT_PORTED:
        owner, _, member = name.partition(".")
        assert not hasattr(ours(owner, PROBES[name]["import"]), member)


def test_default_specs_are_torchrls():
    """``History.default_spec`` and ``ChatHistory.default_spec`` equal TorchRL 0.14.1's (``api_probes.json``
    ``history``, recorded by ``scripts/torchrl_goldens.py``): class, the composite's shape, the leaf keys."""
    import json
    from pathlib import Path

    from llmrl_core.data import History
    from llmrl_core.modules.policies import ChatHistory

    golden = json.loads((Path(__file__).parent / "goldens" / "torchrl" / "api_probes.json").read_text())["history"]
    for label, spec in (
        ("History.default_spec", History.default_spec(shape=(1,))),
        ("ChatHistory.default_spec(prompt)", ChatHistory.default_spec(shape=(1,), keys=["prompt"])),
        ("ChatHistory.default_spec(full)", ChatHistory.default_spec(shape=(1,), keys=["full"])),
    ):
        keys = sorted("/".join((k,) if isinstance(k, str) else k) for k in spec.keys(True, True))
        ours = {"class": type(spec).__name__, "shape": list(spec.shape), "keys": keys}
        assert ours == {k: golden[label][k] for k in ours}, label


def test_the_tokenizer_transform_gives_torchrls_ids_masks_and_text():
    """TorchRL 0.14.1's ``Tokenizer`` on the same inputs (``api_probes.json`` ``tokenizer``): padded ids and
    attention mask for a batch, 1-D for one string, no mask when not asked, ``max_length`` padding, the inverse."""
    import json
    from pathlib import Path

    import torch
    from tensordict import NonTensorData, NonTensorStack, TensorDict
    from transformers import AutoTokenizer

    from llmrl_core.envs.transforms import Tokenizer
    from llmrl_core.model_store import ensure_default_model

    golden = json.loads((Path(__file__).parent / "goldens/torchrl/api_probes.json").read_text())["tokenizer"]
    tokenizer = AutoTokenizer.from_pretrained(str(ensure_default_model()))
    batch = TensorDict(text=NonTensorStack("Hello there", "Hi"), batch_size=(2,))
    done = Tokenizer(in_keys=["text"], out_keys=["tokens"], tokenizer=tokenizer)(batch.clone())
    assert {"tokens": done["tokens"].tolist(), "attention_mask": done["attention_mask"].tolist()} == golden["batch"]
    single = TensorDict(text=NonTensorData("Hello there"), batch_size=())
    done = Tokenizer(in_keys=["text"], out_keys=[("tokens", "ids")], tokenizer=tokenizer)(single)
    got = {"ids": done["tokens", "ids"].tolist(), "attention_mask": done["tokens", "attention_mask"].tolist()}
    assert got == golden["single"]
    done = Tokenizer(in_keys=["text"], out_keys=["ids"], tokenizer=tokenizer, return_attention_mask=False)(
        batch.clone()
    )
    assert {"ids": done["ids"].tolist(), "keys": sorted(done.keys())} == golden["no_mask"]
    capped = Tokenizer(in_keys=["text"], out_keys=["ids"], tokenizer=tokenizer, max_length=6)(batch.clone())
    assert {"ids": capped["ids"].tolist(), "attention_mask": capped["attention_mask"].tolist()} == golden["max_length"]
    inverse = Tokenizer(in_keys_inv=["text"], out_keys_inv=["ids"], tokenizer=tokenizer)
    ids = TensorDict(ids=torch.tensor(tokenizer(["Hello there", "Hi you"])["input_ids"]), batch_size=(2,))
    assert {"text": list(inverse.inv(ids)["text"])} == golden["inverse"]
    with pytest.raises(TypeError, match="tokenizer=..."):
        Tokenizer(tokenizer)  # llmrl's earlier positional call
