"""Golden outputs of TorchRL 0.14.1's own LLM documentation examples, for side-by-side checks of llmrl.

Runs in the side virtual environment that has ``torchrl`` (never in llmrl's own one; ``langdetect``, ``nltk`` and
``immutabledict`` there too, for TorchRL's ``IfEvalScorer``)::

    /work/sidevenv/torchrl/bin/python scripts/torchrl_goldens.py \\
        --model ~/.cache/llmrl/models/SmolLM2-135M-Instruct --out tests/goldens/torchrl

Each ``tests/torchrl_examples/<name>.py`` runs in its own child process: ``torch.manual_seed(0)``, then the file is
executed with the global ``DEFAULT_MODEL`` (the model folder, standing in for every hub model id) and its stdout
captured. ``<out>/<name>.json`` records whether it ran, the error (type, message, the example's line that raised,
the innermost frame) and a summary of the globals it created (see ``tests/torchrl_golden_format.py``).
``<out>/api_probes.json`` records the signatures of the LLM API names, where they import from, the errors TorchRL
raises for the misuses its sources document, how ``History.apply_chat_template`` renders and masks chats
with the packaged tokenizer, and the shapes of the collector's dialog-turn batches.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
from torchrl_golden_format import dumps, summarize, summarize_globals, to_jsonable  # noqa: E402
from torchrl_layout_probes import (  # noqa: E402
    collector_rows_layout,
    env_specs,
    ifeval_scorer_layout,
    library,
    reset_layout,
    reward_parser_done,
    reward_parser_layout,
    step_layout,
    template_choice,
    tool_framework,
    tool_transform_turns,
)

EXAMPLES = ROOT / "tests" / "torchrl_examples"
MODEL_PLACEHOLDER = "<DEFAULT_MODEL>"


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for name in ("torchrl", "tensordict", "torch", "transformers"):
        try:
            out[name] = importlib.import_module(name).__version__
        except Exception as err:  # an absent package is part of the record
            out[name] = f"unavailable ({type(err).__name__})"
    return out


def _scrub(text: str, model: str | None = None) -> str:
    """Machine-independent text: the model folder, the repository and site-packages become placeholders."""
    if not text:
        return text
    if model:
        text = text.replace(model, MODEL_PLACEHOLDER)
    text = text.replace(str(ROOT), "<repo>")
    return re.sub(r"[^\s\"']*/site-packages/", "<site-packages>/", text)


class _Timeout(BaseException):
    """Raised inside the example by SIGALRM (a BaseException, so example code cannot swallow it)."""


def _on_alarm(signum, frame):
    raise _Timeout("the example ran past the harness time limit")


def _error_record(err: BaseException, filename: str, source_lines: list[str], model: str) -> dict[str, Any]:
    frames = traceback.extract_tb(err.__traceback__)
    example_frames = [f for f in frames if f.filename == filename]
    record: dict[str, Any] = {
        "type": "TimeoutError" if isinstance(err, _Timeout) else type(err).__name__,
        "module": type(err).__module__,
        "message": _scrub(str(err), model),
    }
    if example_frames:
        lineno = example_frames[-1].lineno
        record["line"] = lineno
        record["line_text"] = source_lines[lineno - 1].strip() if 0 < lineno <= len(source_lines) else None
    if frames:
        inner = frames[-1]
        record["origin"] = {"file": _scrub(inner.filename, model), "function": inner.name, "line": inner.lineno}
    tb = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    record["traceback_tail"] = _scrub(tb, model)[-4000:]
    return record


def run_one(path: Path, model: str, result_path: Path, timeout: int) -> None:
    """Child-process body: run one example and write its golden JSON."""
    source = path.read_text()
    lines = source.splitlines()
    filename = str(path)
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": filename, "DEFAULT_MODEL": model}
    injected = set(namespace) | {"__builtins__"}
    stdout = io.StringIO()
    caught: list[warnings.WarningMessage] = []
    error: BaseException | None = None
    torch.manual_seed(0)
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(timeout)
    start = time.perf_counter()
    try:
        code = compile(source, filename, "exec")
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(stdout):
            warnings.simplefilter("default")
            exec(code, namespace)
    except (Exception, SystemExit, _Timeout) as err:
        error = err
    finally:
        signal.alarm(0)
    elapsed = time.perf_counter() - start
    recorded, others = summarize_globals(namespace, exclude=injected)
    seen: set[tuple[str, str]] = set()
    warning_records = []
    for w in caught:
        key = (w.category.__name__, _scrub(str(w.message), model))
        if key not in seen and len(seen) < 50:
            seen.add(key)
            warning_records.append({"category": key[0], "message": key[1]})
    record = {
        "example": path.name,
        "ok": error is None,
        "error": None if error is None else _error_record(error, filename, lines, model),
        "stdout": _scrub(stdout.getvalue(), model),
        "globals": recorded,
        "other_globals": others,
        "warnings": warning_records,
        "seconds": round(elapsed, 2),
        "versions": _versions(),
        "model": Path(model).name,
        "seed": 0,
    }
    result_path.write_text(dumps(record))


# --------------------------------------------------------------------------------------------- API probes

PUBLIC_MODULES = [
    "torchrl.envs",
    "torchrl.envs.llm",
    "torchrl.envs.llm.transforms",
    "torchrl.envs.llm.transforms.kl",
    "torchrl.envs.transforms",
    "torchrl.collectors",
    "torchrl.collectors.llm",
    "torchrl.modules",
    "torchrl.modules.llm",
    "torchrl.modules.llm.policies",
    "torchrl.data",
    "torchrl.data.llm",
    "torchrl.objectives",
    "torchrl.objectives.llm",
]

# name -> (import path used, attribute chain for methods)
SIGNATURE_TARGETS = [
    ("ChatEnv", "torchrl.envs.llm", None),
    ("DatasetChatEnv", "torchrl.envs.llm", None),
    ("DatasetChatEnv.from_dataloader", "torchrl.envs.llm", "from_dataloader"),
    ("ChatEnv.from_dataloader", "torchrl.envs.llm", "from_dataloader"),
    ("LLMEnv.from_dataloader", "torchrl.envs.llm", "from_dataloader"),
    ("LLMCollector", "torchrl.collectors.llm", None),
    ("TransformersWrapper", "torchrl.modules.llm", None),
    ("vLLMWrapper", "torchrl.modules.llm", None),
    ("KLRewardTransform", "torchrl.envs.llm.transforms", None),
    ("RetrieveLogProb", "torchrl.envs.llm.transforms", None),
    ("RetrieveKL", "torchrl.envs.llm.transforms", None),
    ("KLComputation", "torchrl.envs.llm.transforms", None),
    ("History", "torchrl.data.llm", None),
    ("History.from_chats", "torchrl.data.llm", "from_chats"),
    ("History.apply_chat_template", "torchrl.data.llm", "apply_chat_template"),
    ("History.append", "torchrl.data.llm", "append"),
    ("History.extend", "torchrl.data.llm", "extend"),
    ("History.default_spec", "torchrl.data.llm", "default_spec"),
    ("ChatHistory", "torchrl.modules.llm.policies", None),
    ("ChatHistory.default_spec", "torchrl.modules.llm.policies", "default_spec"),
    ("Text", "torchrl.modules.llm.policies", None),
    ("Tokens", "torchrl.modules.llm.policies", None),
    ("LogProbs", "torchrl.modules.llm.policies", None),
    ("Masks", "torchrl.modules.llm.policies", None),
    ("PolicyVersion", "torchrl.envs.llm.transforms", None),
    ("DataLoadingPrimer", "torchrl.envs.llm.transforms", None),
    ("RayDataLoadingPrimer", "torchrl.envs.llm.transforms", None),
    ("PythonInterpreter", "torchrl.envs.llm.transforms", None),
    ("GRPOLoss", "torchrl.objectives.llm", None),
    ("MCAdvantage", "torchrl.objectives.llm", None),
    ("MCAdvantageSelector", "torchrl.objectives.llm", None),
    ("MCAdvantageSelector.select", "torchrl.objectives.llm", "select"),
    ("RayMCAdvantage", "torchrl.objectives.llm", None),
    ("SFTLoss", "torchrl.objectives.llm", None),
    ("RayKLRewardTransform", "torchrl.envs.llm.transforms.kl", None),
    ("RayRetrieveKL", "torchrl.envs.llm.transforms.kl", None),
    ("vLLMUpdater", "torchrl.collectors.llm", None),
    # the other names of TorchRL's reference page (seed 000) that TorchRL 0.14.1 has
    ("ContentBase", "torchrl.data.llm", None),
    ("TopKRewardSelector", "torchrl.data.llm", None),
    ("GSM8KEnv", "torchrl.envs.llm", None),
    ("make_gsm8k_env", "torchrl.envs.llm", None),
    ("GSM8KPrepareQuestion", "torchrl.envs.llm", None),
    ("GSM8KRewardParser", "torchrl.envs.llm", None),
    ("IFEvalEnv", "torchrl.envs.llm", None),
    ("IfEvalScorer", "torchrl.envs.llm", None),
    ("IFEvalScoreData", "torchrl.envs.llm", None),
    ("LLMEnv", "torchrl.envs.llm", None),
    ("LLMHashingEnv", "torchrl.envs.llm", None),
    ("make_mlgym", "torchrl.envs.llm", None),
    ("MLGymWrapper", "torchrl.envs.llm", None),
    ("MCPToolTransform", "torchrl.envs.llm.transforms", None),
    ("BrowserTransform", "torchrl.envs.llm.transforms", None),
    ("TemplateTransform", "torchrl.envs.llm.transforms", None),
    ("Tokenizer", "torchrl.envs.llm.transforms", None),
    ("as_nested_tensor", "torchrl.envs.llm.transforms", None),
    ("as_padded_tensor", "torchrl.envs.llm.transforms", None),
    ("make_vllm_worker", "torchrl.modules.llm", None),
    ("stateless_init_process_group", "torchrl.modules.llm", None),
    ("GRPOLossOutput", "torchrl.objectives.llm", None),
    ("SFTLossOutput", "torchrl.objectives.llm", None),
    # the GRPO family and distillation of TorchRL 0.14.1's objectives
    ("LLMLossOutput", "torchrl.objectives.llm", None),
    ("DAPO", "torchrl.objectives.llm", None),
    ("DAPOLossOutput", "torchrl.objectives.llm", None),
    ("CISPOLoss", "torchrl.objectives.llm", None),
    ("CISPOLossOutput", "torchrl.objectives.llm", None),
    ("DistillationLoss", "torchrl.objectives.llm", None),
    ("DistillationLossOutput", "torchrl.objectives.llm", None),
    ("CountdownEnv", "torchrl.envs.llm", None),
    ("CountdownRewardParser", "torchrl.envs.llm", None),
    ("MATHEnv", "torchrl.envs.llm", None),
    ("MATHRewardParser", "torchrl.envs.llm", None),
]


def _param_records(sig: inspect.Signature) -> list[dict[str, Any]]:
    out = []
    for p in sig.parameters.values():
        out.append(
            {
                "name": p.name,
                "kind": p.kind.name,
                "default": None if p.default is inspect.Parameter.empty else repr(p.default),
                "has_default": p.default is not inspect.Parameter.empty,
                "annotation": None if p.annotation is inspect.Parameter.empty else str(p.annotation),
            }
        )
    return out


def _signature_record(label: str, module_name: str, attr: str | None) -> dict[str, Any]:
    cls_name = label.split(".")[0]
    record: dict[str, Any] = {"import": f"from {module_name} import {cls_name}"}
    try:
        obj = getattr(importlib.import_module(module_name), cls_name)
    except Exception as err:
        record["error"] = f"{type(err).__name__}: {err}"
        return record
    record["defined_in"] = f"{obj.__module__}.{obj.__qualname__}"
    record["public_paths"] = []
    for mod_name in PUBLIC_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except Exception:
            continue
        if getattr(mod, cls_name, None) is obj:
            record["public_paths"].append(f"{mod_name}.{cls_name}")
    target = obj if attr is None else getattr(obj, attr)
    if attr is not None:
        raw = inspect.getattr_static(obj, attr)
        record["method_kind"] = type(raw).__name__  # classmethod / staticmethod / function
    try:
        if attr is None and inspect.isclass(obj):
            # What a caller sees (a metaclass __call__ may hide __init__), and __init__ itself without self.
            init_sig = inspect.signature(obj.__init__)
            params = list(init_sig.parameters.values())[1:]
            sig = init_sig.replace(parameters=params)
            try:
                call_sig = inspect.signature(obj)
                if str(call_sig) != str(sig):
                    record["call_signature"] = str(call_sig)
            except (TypeError, ValueError):
                pass
        else:
            sig = inspect.signature(target)
    except (TypeError, ValueError) as err:
        record["error"] = f"{type(err).__name__}: {err}"
        return record
    record["signature"] = str(sig)
    record["parameters"] = _param_records(sig)
    return record


def _probe(name: str, seed: str | None, call: str, fn) -> dict[str, Any]:
    record: dict[str, Any] = {"name": name, "seed": seed, "call": call}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = fn()
        except Exception as err:
            record["raised"] = True
            record["type"] = type(err).__name__
            record["message"] = str(err)
            frames = traceback.extract_tb(err.__traceback__)
            if frames:
                record["origin"] = {
                    "file": _scrub(frames[-1].filename),
                    "function": frames[-1].name,
                    "line": frames[-1].lineno,
                }
        else:
            record["raised"] = False
            record["result_type"] = type(result).__name__ if result is not None else None
            if type(result).__name__ == "TensorDict":  # data results (KLComputation) are kept whole
                record["result"] = summarize(result)
    record["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught][:5]
    return record


def _error_probes(model_path: str) -> list[dict[str, Any]]:
    from torchrl.collectors.llm import LLMCollector
    from torchrl.data.llm import History
    from torchrl.envs.llm import ChatEnv, DatasetChatEnv
    from torchrl.envs.llm.transforms import (
        DataLoadingPrimer,
        KLComputation,
        KLRewardTransform,
        RetrieveKL,
        RetrieveLogProb,
    )
    from torchrl.envs.llm.transforms.kl import RayKLRewardTransform, RayRetrieveKL
    from torchrl.modules.llm import TransformersWrapper
    from torchrl_error_probes import error_probes

    api = {
        "LLMCollector": LLMCollector, "History": History, "ChatEnv": ChatEnv, "DatasetChatEnv": DatasetChatEnv,
        "DataLoadingPrimer": DataLoadingPrimer, "KLComputation": KLComputation,
        "KLRewardTransform": KLRewardTransform, "RetrieveKL": RetrieveKL, "RetrieveLogProb": RetrieveLogProb,
        "RayKLRewardTransform": RayKLRewardTransform, "RayRetrieveKL": RayRetrieveKL,
        "TransformersWrapper": TransformersWrapper,
    }  # fmt: skip
    return [_probe(name, seed, call, fn) for name, seed, call, fn in error_probes(api, model_path)]


CHATS = [
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello, how are you?"},
        {"role": "assistant", "content": "I'm doing well, thank you!"},
    ],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What's the weather like?"},
        {"role": "assistant", "content": "I can't check the weather for you."},
    ],
]


def _history_probes(model_path: str) -> dict[str, Any]:
    """How History renders and masks the seeds' two chats with the packaged tokenizer."""
    from tensordict import set_list_to_stack
    from torchrl.data.llm import History
    from torchrl.data.llm import history as history_module
    from torchrl.modules.llm.policies import ChatHistory
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    templates = getattr(history_module, "_CHAT_TEMPLATES", {})
    out: dict[str, Any] = {
        "tokenizer_template_has_generation_tag": "{% generation %}" in (tokenizer.chat_template or ""),
        "builtin_template_names": sorted(templates),
        "custom_model_family_keywords": to_jsonable(getattr(history_module, "_CUSTOM_MODEL_FAMILY_KEYWORDS", None)),
    }
    with set_list_to_stack(True):
        history = History.from_chats(CHATS)
        out["from_chats"] = summarize(history)
        text = history.apply_chat_template(tokenizer=tokenizer, add_generation_prompt=False)
        out["text"] = text
        out["text_with_generation_prompt"] = history.apply_chat_template(tokenizer=tokenizer)
        out["tokenizer_own_template_text"] = [
            tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False) for chat in CHATS
        ]
        masked = history.apply_chat_template(
            tokenizer=tokenizer, add_generation_prompt=False, return_assistant_tokens_mask=True
        )
        out["tokenized_with_assistant_mask"] = summarize(masked)
        picked = None
        for name, template in templates.items():
            try:
                candidate = history.apply_chat_template(
                    tokenizer=tokenizer, add_generation_prompt=False, chat_template=template
                )
            except Exception:
                continue
            if candidate == text:
                picked = name
                break
        out["template_picked"] = picked
        if picked is not None:
            out["template_picked_source"] = templates[picked]
        rows = []
        for i in range(len(CHATS)):
            ids = masked[i]["input_ids"].tolist()
            mask = masked[i]["assistant_masks"].tolist()
            rows.append(
                {
                    "n_tokens": len(ids),
                    "n_assistant_tokens": int(sum(mask)),
                    "assistant_text": tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m]),
                }
            )
        out["assistant_mask_rows"] = rows
        # Append / extend on a single conversation (History.append and History.extend)
        one = History.from_chats([CHATS[0][:2]])
        reply = History(role="assistant", content="Fine.", batch_size=())
        try:
            appended = one[0].append(reply)
            out["append"] = summarize(appended)
        except Exception as err:
            out["append"] = {"error": f"{type(err).__name__}: {err}"}
        try:
            extended = one[0].extend(History.from_chats([[{"role": "assistant", "content": "Fine."}]])[0])
            out["extend"] = summarize(extended)
        except Exception as err:
            out["extend"] = {"error": f"{type(err).__name__}: {err}"}
        for label, fn in (
            ("History.default_spec", lambda: History.default_spec(shape=(1,))),
            ("ChatHistory.default_spec(prompt)", lambda: ChatHistory.default_spec(shape=(1,), keys=["prompt"])),
            ("ChatHistory.default_spec(full)", lambda: ChatHistory.default_spec(shape=(1,), keys=["full"])),
        ):
            try:
                spec = fn()
                out[label] = {
                    "class": type(spec).__name__,
                    "shape": list(spec.shape),
                    "keys": sorted(
                        "/".join((k,) if isinstance(k, str) else k)
                        for k in spec.keys(include_nested=True, leaves_only=True)
                    ),
                    "repr": str(spec)[:3000],
                }
            except Exception as err:
                out[label] = {"error": f"{type(err).__name__}: {err}"}
    return out


def _collector_layout_probes(model_path: str) -> dict[str, Any]:
    """The shapes of TorchRL's dialog-turn batches: a ``ChatEnv`` of batch size 2 fed by a DataLoader, a history-
    mode ``TransformersWrapper``, ``dialog_turns_per_batch=4``; by default and with ``flatten_data=True``."""
    from torch.utils.data import DataLoader
    from torchrl.collectors.llm import LLMCollector
    from torchrl.envs.llm import ChatEnv
    from torchrl.modules.llm import TransformersWrapper
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    policy = TransformersWrapper(
        model, tokenizer=tokenizer, input_mode="history", generate=True, generate_kwargs={"max_new_tokens": 4}
    )
    out: dict[str, Any] = {}
    for label, kwargs in (("default", {}), ("flatten_data", {"flatten_data": True})):
        prompts = DataLoader([{"query": f"Say {i}."} for i in range(8)], batch_size=2)
        env = ChatEnv.from_dataloader(prompts, tokenizer=tokenizer, batch_size=(2,))
        collector = LLMCollector(env, policy=policy, dialog_turns_per_batch=4, total_dialog_turns=8, **kwargs)
        batch = next(iter(collector))
        out[label] = {
            "batch_size": list(batch.batch_size),
            "done": list(batch["done"].shape),
            "next_done": list(batch["next", "done"].shape),
            "flatten_data": collector.flatten_data,
        }
    return out


def _reset_layout_probes(model_path: str) -> dict[str, Any]:
    """What TorchRL's ``env.reset()`` answers on a primed ``ChatEnv`` (``tests/torchrl_layout_probes.py``)."""
    from transformers import AutoTokenizer

    return reset_layout(_torchrl_library(), AutoTokenizer.from_pretrained(model_path))


def _torchrl_library() -> Any:
    from torchrl.collectors.llm import LLMCollector
    from torchrl.data.llm import History
    from torchrl.envs import Transform
    from torchrl.envs.llm import ChatEnv
    from torchrl.envs.llm.reward import GSM8KRewardParser, IfEvalScorer
    from torchrl.envs.llm.transforms import tools
    from torchrl.modules.llm import TransformersWrapper
    from torchrl.modules.llm.policies import ChatHistory, Text

    return library(
        ChatEnv,
        History,
        ChatHistory,
        Text,
        GSM8KRewardParser,
        IfEvalScorer,
        LLMCollector,
        TransformersWrapper,
        Transform=Transform,
        tools=tools,
        limit_turns=_step_counter,
    )


def _step_counter(env: Any, max_steps: int) -> Any:
    """TorchRL's turn limit: a ``StepCounter`` appended to the env."""
    from torchrl.envs import StepCounter

    return env.append_transform(StepCounter(max_steps=max_steps))


def _collector_rows_layout_probes(model_path: str) -> dict[str, Any]:
    """TorchRL's dialog-turn batches with a reward parser and a TransformersWrapper (``collector_rows_layout``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    return collector_rows_layout(_torchrl_library(), model, AutoTokenizer.from_pretrained(model_path))


def _step_layout_probes(model_path: str) -> dict[str, Any]:
    """TorchRL's bare ``ChatEnv`` stepped once (``tests/torchrl_layout_probes.py`` ``step_layout``)."""
    from transformers import AutoTokenizer

    return step_layout(_torchrl_library(), AutoTokenizer.from_pretrained(model_path))


def _env_specs_probes(model_path: str) -> dict[str, Any]:
    """TorchRL's ``ChatEnv`` specs per input mode (``tests/torchrl_layout_probes.py`` ``env_specs``)."""
    from transformers import AutoTokenizer

    return env_specs(_torchrl_library(), AutoTokenizer.from_pretrained(model_path))


def _ifeval_scorer_layout_probes(model_path: str) -> dict[str, Any]:
    """TorchRL's ``IfEvalScorer`` on a primed ``ChatEnv``, stepped once (``tests/torchrl_layout_probes.py``)."""
    from transformers import AutoTokenizer

    return ifeval_scorer_layout(_torchrl_library(), AutoTokenizer.from_pretrained(model_path))


def _template_choice_probes(model_path: str) -> dict[str, Any]:
    """The prompts TorchRL's ``ChatEnv`` renders per template choice (``tests/torchrl_layout_probes.py``)."""
    from transformers import AutoTokenizer

    return template_choice(_torchrl_library(), AutoTokenizer.from_pretrained(model_path))


def _tool_transform_turns_probes(model_path: str) -> dict[str, Any]:
    """A user's TorchRL-style tool transform on a history-mode ``ChatEnv``, two turns (``tool_transform_turns``)."""
    from transformers import AutoTokenizer

    return tool_transform_turns(_torchrl_library(), AutoTokenizer.from_pretrained(model_path))


def _tool_framework_probes(model_path: str) -> dict[str, Any]:
    """TorchRL's tool framework: parsers, ``SimpleToolTransform``, ``ExecuteToolsInOrder`` (``tool_framework``)."""
    from transformers import AutoTokenizer

    return tool_framework(_torchrl_library(), AutoTokenizer.from_pretrained(model_path))


def _reward_parser_layout_probes(model_path: str) -> dict[str, Any]:
    """TorchRL's ``ChatEnv`` with its ``GSM8KRewardParser``, stepped once (``reward_parser_layout`` there)."""
    from transformers import AutoTokenizer

    return reward_parser_layout(_torchrl_library(), AutoTokenizer.from_pretrained(model_path))[0]


def _reward_parser_done_probes(model_path: str) -> dict[str, Any]:
    """TorchRL's ``GSM8KRewardParser``'s done flags for answers with and without a valid tag (``reward_parser_done``
    there), without and with a turn limit."""
    from transformers import AutoTokenizer

    return reward_parser_done(_torchrl_library(), AutoTokenizer.from_pretrained(model_path))


def _module_names_probes(model_path: str) -> dict[str, Any]:
    """Every public module of TorchRL's LLM packages (``torchrl.<pkg>.llm...``) and the names it offers: its
    ``__all__``, else the classes and functions defined in it (what a user imports from that path). A module that does
    not import here (a missing optional dependency) records the error."""
    import importlib
    import pkgutil

    out: dict[str, Any] = {}

    def walk(name: str) -> None:
        try:
            module = importlib.import_module(name)
        except Exception as err:  # an optional dependency TorchRL's module needs
            out[name] = {"error": f"{type(err).__name__}: {err}"}
            return
        names = getattr(module, "__all__", None)
        if names is None:
            names = [
                key
                for key, value in vars(module).items()
                if callable(value) and getattr(value, "__module__", None) == name
            ]
        out[name] = sorted(key for key in names if not key.startswith("_"))
        for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
            if not info.name.startswith("_"):
                walk(f"{name}.{info.name}")

    for package in ("envs", "modules", "data", "collectors", "objectives"):
        walk(f"torchrl.{package}.llm")
    return out


def _tokenizer_probes(model_path: str) -> dict[str, Any]:
    """TorchRL's ``Tokenizer`` transform called on a TensorDict: a batch of strings (padded ids and attention mask),
    one string, ``return_attention_mask=False``, ``max_length``, and the inverse (ids back to text)."""
    from tensordict import NonTensorData, NonTensorStack, TensorDict
    from torchrl.envs.llm.transforms import Tokenizer
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    out: dict[str, Any] = {}
    batch = TensorDict(text=NonTensorStack("Hello there", "Hi"), batch_size=(2,))
    done = Tokenizer(in_keys=["text"], out_keys=["tokens"], tokenizer=tokenizer)(batch.clone())
    out["batch"] = {"tokens": done["tokens"].tolist(), "attention_mask": done["attention_mask"].tolist()}
    single = TensorDict(text=NonTensorData("Hello there"), batch_size=())
    done = Tokenizer(in_keys=["text"], out_keys=[("tokens", "ids")], tokenizer=tokenizer)(single)
    out["single"] = {"ids": done["tokens", "ids"].tolist(), "attention_mask": done["tokens", "attention_mask"].tolist()}
    no_mask = Tokenizer(in_keys=["text"], out_keys=["ids"], tokenizer=tokenizer, return_attention_mask=False)
    done = no_mask(batch.clone())
    out["no_mask"] = {"ids": done["ids"].tolist(), "keys": sorted(done.keys())}
    capped = Tokenizer(in_keys=["text"], out_keys=["ids"], tokenizer=tokenizer, max_length=6)(batch.clone())
    out["max_length"] = {"ids": capped["ids"].tolist(), "attention_mask": capped["attention_mask"].tolist()}
    inverse = Tokenizer(in_keys_inv=["text"], out_keys_inv=["ids"], tokenizer=tokenizer)
    ids = TensorDict(ids=torch.tensor(tokenizer(["Hello there", "Hi you"])["input_ids"]), batch_size=(2,))
    out["inverse"] = {"text": list(inverse.inv(ids)["text"])}
    return out


def position_weighted_sum(x: torch.Tensor) -> torch.Tensor:
    """A deterministic stand-in hashing module for ``LLMHashingEnv`` probes (TorchRL's default, ``SipHash``, depends
    on ``PYTHONHASHSEED``): each row's entries weighted by their 1-based position, summed."""
    return (x.long() * torch.arange(1, x.shape[-1] + 1)).sum(-1)


def _hashing_env_probes(model_path: str) -> dict[str, Any]:
    """TorchRL's ``LLMHashingEnv``: a reset from token ids and one step, with a deterministic hashing module (the
    values) and with the default one (the layout only)."""
    from tensordict import TensorDict
    from torchrl.envs.llm import LLMHashingEnv
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    ids = torch.tensor(tokenizer(["Check out TorchRL!", "Well, hello there you!"])["input_ids"])

    def layout(td: TensorDict) -> dict[str, Any]:
        return {str(k): [list(td[k].shape), str(td[k].dtype)] for k in sorted(td.keys(True, True), key=str)}

    out: dict[str, Any] = {"prompt": ids.tolist()}
    for label, kwargs in (("weighted", {"hashing_module": position_weighted_sum}), ("default", {})):
        env = LLMHashingEnv(tokenizer=tokenizer, **kwargs)
        reset = env.reset(TensorDict(observation=ids, batch_size=[2]))
        stepped = env.step(reset.clone().set("action", torch.tensor([[28], [29]])))
        record = {
            "reset_keys": sorted(reset.keys()),
            "reset_layout": layout(reset),
            "reset_text": list(reset["text"]),
            "step_next_keys": sorted(stepped["next"].keys()),
            "step_layout": layout(stepped["next"]),
            "step_text": list(stepped["next", "text"]),
            "step_observation": stepped["next", "observation"].tolist(),
        }
        if label == "weighted":
            record["reset_hashing"] = reset["hashing"].tolist()
            record["step_hashing"] = stepped["next", "hashing"].tolist()
        out[label] = record
    return out


def run_probes(model: str, result_path: Path) -> None:
    torch.manual_seed(0)
    record: dict[str, Any] = {"versions": _versions(), "model": Path(model).name}
    record["signatures"] = {label: _signature_record(label, mod, attr) for label, mod, attr in SIGNATURE_TARGETS}
    record["error_probes"] = _error_probes(model)
    probe_sets = (
        ("history", _history_probes),
        ("collector_layout", _collector_layout_probes),
        ("reset_layout", _reset_layout_probes),
        ("step_layout", _step_layout_probes),
        ("module_names", _module_names_probes),
        ("reward_parser_layout", _reward_parser_layout_probes),
        ("reward_parser_done", _reward_parser_done_probes),
        ("template_choice", _template_choice_probes),
        ("ifeval_scorer_layout", _ifeval_scorer_layout_probes),
        ("collector_rows_layout", _collector_rows_layout_probes),
        ("tokenizer", _tokenizer_probes),
        ("hashing_env", _hashing_env_probes),
        ("tool_transform_turns", _tool_transform_turns_probes),
        ("tool_framework", _tool_framework_probes),
        ("env_specs", _env_specs_probes),
    )
    for key, probes in probe_sets:
        try:
            record[key] = probes(model)
        except Exception as err:
            record[key] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-3000:]}
    result_path.write_text(_scrub(dumps(to_jsonable(record)), model))


# --------------------------------------------------------------------------------------------- driver


def _run_child(args: list[str], timeout: int) -> tuple[int | None, str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        return None, (err.stderr or b"").decode() if isinstance(err.stderr, bytes) else (err.stderr or "")
    return proc.returncode, proc.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model folder used for every hub model id")
    parser.add_argument("--out", default=str(ROOT / "tests" / "goldens" / "torchrl"))
    parser.add_argument("--examples", default=str(EXAMPLES))
    parser.add_argument("--only", nargs="*", help="example names (file stems) to run; default: all")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per example")
    parser.add_argument("--no-probes", action="store_true")
    parser.add_argument("--probes-only", action="store_true")
    parser.add_argument("--run-one", help=argparse.SUPPRESS)
    parser.add_argument("--probes", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    model = str(Path(os.path.expanduser(args.model)).resolve())

    if args.run_one:
        run_one(Path(args.run_one).resolve(), model, Path(args.result), args.timeout)
        return 0
    if args.probes:
        run_probes(model, Path(args.result))
        return 0

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    examples = sorted(Path(args.examples).glob("*.py"))
    if args.only:
        examples = [p for p in examples if p.stem in set(args.only)]
    if args.probes_only:
        examples = []
    for path in examples:
        result = out / f"{path.stem}.json"
        result.unlink(missing_ok=True)
        start = time.perf_counter()
        rc, stderr = _run_child(
            ["--run-one", str(path), "--model", model, "--result", str(result), "--timeout", str(args.timeout)],
            args.timeout + 120,
        )
        if not result.exists():  # the child died (crash, hard timeout): still leave a golden behind
            result.write_text(
                dumps(
                    {
                        "example": path.name,
                        "ok": False,
                        "error": {
                            "type": "ChildProcessError" if rc is not None else "TimeoutError",
                            "message": f"the example process ended without a result (exit status {rc})",
                            "traceback_tail": _scrub(stderr, model)[-4000:],
                        },
                        "stdout": "",
                        "globals": {},
                        "other_globals": {},
                        "warnings": [],
                        "versions": _versions(),
                        "model": Path(model).name,
                        "seed": 0,
                    }
                )
            )
        data = json.loads(result.read_text())
        status = "ok" if data["ok"] else f"{data['error']['type']}: {data['error']['message'][:150]}"
        print(f"{path.stem:34s} {time.perf_counter() - start:6.1f}s  {status}", flush=True)
    if not args.no_probes:
        result = out / "api_probes.json"
        rc, stderr = _run_child(["--probes", "--model", model, "--result", str(result)], args.timeout + 120)
        print(f"{'api_probes':34s} exit {rc}" + ("" if rc == 0 else f"\n{stderr[-3000:]}"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
