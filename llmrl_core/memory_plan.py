"""A memory plan before any engine starts: what the trainer and the rollout engines will hold, from the model's
``config.json`` alone (decoder-only transformers of the Llama / Qwen2 / Mistral family).

Rules (each line of a plan names its own):

* parameters ``N``: embeddings ``V*H``; per layer the attention projections (``q``/``o``: ``H * heads * head_dim``,
  ``k``/``v``: ``H * kv_heads * head_dim``, plus biases where the config has them: Qwen2's ``q``/``k``/``v``,
  ``attention_bias``), the gated MLP ``3 * H * I`` (plus ``mlp_bias``) and two RMSNorms ``2 * H``; the final norm
  ``H``; the LM head ``V * H`` unless ``tie_word_embeddings``;
* trainer: fp32 weights ``4N``, fp32 gradients ``4N_t`` and AdamW's two fp32 moments ``8N_t`` (``N_t``: the trained
  parameters, ``N`` for full fine-tuning); activations of one micro-batch of ``train.token_budget`` tokens:
  ``T * L * H * 34`` bytes (bf16 activations of a layer without recomputation, Korthikanti et al. 2022's ``34 s b h``
  with the attention scores left to fused SDPA kernels; ``T * L * H * 2`` with gradient checkpointing, the layer
  inputs, plus one layer's ``34 T H``) and the logits ``T * V * 4 * 2`` (fp32 logits and their log-softmax);
* reference model (a KL to it): its weights in the engines' dtype;
* ``rollout.weight_sync=cuda_ipc``: the trainer shares an fp32 copy of its weights (``4N``) while the engines load
  it, which happens when the engines are awake (the sampling phase below);
* each engine: its weights in its dtype and its KV cache: on a GPU, vLLM reserves ``gpu_memory_utilization`` of
  the device for weights + KV cache up front (the KV cache is the rest); on a CPU, ``kv_cache_gb``
  (``VLLM_CPU_KVCACHE_SPACE``). At ``2 * L * kv_heads * head_dim * dtype_bytes`` bytes per token the cache must
  hold one sequence of ``rollout.max_model_len`` tokens (vLLM refuses to start otherwise). A Transformers engine
  (``rollout.backend: transformers``) reserves nothing up front: it holds the KV cache of one sampling batch
  (``B`` = 64 sequences of at most ``rollout.max_model_len`` tokens) and the batch's sampled scores
  (``B * rollout.max_new_tokens * V * 4`` bytes: fp32 next-token scores kept for the log-probs).
* phases: the trainer's activations and logits exist only while it trains. An engine that sleeps while the trainer
  trains (``rollout.sleep_level``, CUDA) holds its weights and KV cache only while it samples (at level 1 its
  weights wait in host memory meanwhile). A device's peak is what it always holds plus the larger of the two
  phases (without sleep mode: everything at once).

Estimates, not measurements: activations depend on kernels and sequence lengths; the plan is meant to catch the
configurations that cannot fit (the field's most reported failure) before minutes of start-up, with the setting
to change.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2}


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer, from its ``config.json``."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str = "config.json") -> ModelShape:
        """Read the shape; a missing size is a ``ValueError`` naming the key and ``where``."""
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
            if not isinstance(config.get(key), int) or config[key] < 1:
                raise ValueError(f"{where}: {key} must be a positive integer, got {config.get(key)!r}")
        heads = config["num_attention_heads"]
        attention_bias = bool(config.get("attention_bias", False))
        return cls(
            vocab=config["vocab_size"],
            hidden=config["hidden_size"],
            layers=config["num_hidden_layers"],
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
            intermediate=config["intermediate_size"],
            tied=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=attention_bias or config.get("model_type") == "qwen2",
            o_bias=attention_bias,
            mlp_bias=bool(config.get("mlp_bias", False)),
        )

    @classmethod
    def from_model_dir(cls, path: str | Path) -> ModelShape:
        """The shape of the model folder ``path`` (its ``config.json``)."""
        file = Path(path) / "config.json"
        try:
            config = json.loads(file.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"{file}: cannot read the model's config ({err})") from err
        return cls.from_config(config, str(file))

    def parameters(self) -> int:
        """The parameter count (see the module docstring for the rule)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h
        attention += (q + 2 * kv) * self.qkv_bias + h * self.o_bias
        mlp = 3 * h * self.intermediate + (2 * self.intermediate + h) * self.mlp_bias
        per_layer = attention + mlp + 2 * h
        embeddings = self.vocab * h * (1 if self.tied else 2)
        return embeddings + self.layers * per_layer + h

    def lora_parameters(self, r: int, modules: list[str]) -> int:
        """Parameters of rank-``r`` LoRA adapters on ``modules`` of every layer: ``r * (in + out)`` each."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        sizes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, i),
                 "up_proj": (h, i), "down_proj": (i, h)}  # fmt: skip
        return self.layers * sum(r * sum(sizes[m]) for m in modules if m in sizes)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes of one token: keys and values of every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


@dataclass(frozen=True)
class PlanLine:
    """One item of a plan: where it sits, what it is, its bytes and the rule that gave them."""

    device: str
    item: str
    bytes: int
    rule: str
    phase: str = ""  # "": held throughout; "train": only while the trainer trains; "rollout": only while sampling


@dataclass(frozen=True)
class PlanInputs:
    """What the plan depends on besides the model (the run's settings, resolved to devices)."""

    trainer_device: str = "cpu"
    engine_devices: tuple[str, ...] = ("cpu",)
    token_budget: int = 2048
    gradient_checkpointing: bool = False
    trainable_parameters: int | None = None  # None: full fine-tuning
    reference_model: bool = False
    engine_dtype_bytes: int = 2
    max_model_len: int = 2048
    gpu_memory_utilization: float = 0.4  # vLLM's reservation on a GPU engine (weights + KV cache)
    cpu_kv_cache_bytes: int = GIB  # a CPU engine's KV cache (VLLM_CPU_KVCACHE_SPACE)
    device_memory: Mapping[str, int] | None = None  # bytes per device (a GPU engine's reservation is a share of it)
    engine_backend: str = "vllm"  # rollout.backend: "transformers" engines reserve nothing, they hold one batch
    engine_batch: int = 64  # a Transformers engine's sequences per sampling batch (TransformersWorker.max_batch)
    max_new_tokens: int = 128
    engine_sleep_level: int = 0  # rollout.sleep_level: a CUDA engine sleeps while the trainer trains
    ipc_weights_copy: bool = False  # rollout.weight_sync=cuda_ipc: an fp32 copy of the weights while engines load it
    other_trainer_ranks: tuple[str, ...] = ()  # train.data_parallel > 1: the devices of trainer ranks 1..


def memory_plan(shape: ModelShape, inputs: PlanInputs) -> list[PlanLine]:
    """The plan's lines (see the module docstring)."""
    n = shape.parameters()
    trained = n if inputs.trainable_parameters is None else inputs.trainable_parameters
    where = inputs.trainer_device
    lines = _trainer_lines(shape, inputs, where, n, trained, "")
    for rank, device in enumerate(inputs.other_trainer_ranks, start=1):  # each rank a whole trainer, no reference
        lines += _trainer_lines(shape, inputs, device, n, trained, f"rank {rank} ")
    if inputs.reference_model:
        ref = n * inputs.engine_dtype_bytes
        lines.append(PlanLine(where, "reference model", ref, f"{inputs.engine_dtype_bytes} bytes x {n:,} parameters"))
    if inputs.ipc_weights_copy:
        rule = f"fp32: 4 x {n:,} parameters, shared with the engines while they load it"
        lines.append(PlanLine(where, "weights shared over CUDA IPC", 4 * n, rule, "rollout"))
    weights = n * inputs.engine_dtype_bytes
    for i, device in enumerate(inputs.engine_devices):
        sleeps = bool(inputs.engine_sleep_level) and device.startswith("cuda") and inputs.engine_backend == "vllm"
        phase = "rollout" if sleeps else ""
        rule = f"{inputs.engine_dtype_bytes} bytes x {n:,}" + (", asleep while training" if sleeps else "")
        lines.append(PlanLine(device, f"engine {i} weights", weights, rule, phase))
        if sleeps and inputs.engine_sleep_level == 1:
            lines.append(PlanLine("cpu", f"engine {i} weights asleep", weights, "rollout.sleep_level 1", "train"))
        total = (inputs.device_memory or {}).get(device)
        if inputs.engine_backend == "transformers":
            b, tokens = inputs.engine_batch, inputs.max_model_len
            kv = b * tokens * shape.kv_bytes_per_token(inputs.engine_dtype_bytes)
            rule = f"transformers engine: {b} sequences x rollout.max_model_len {tokens} x KV bytes per token"
            lines.append(PlanLine(device, f"engine {i} KV cache", kv, rule))
            scores = b * inputs.max_new_tokens * shape.vocab * 4
            rule = f"{b} sequences x rollout.max_new_tokens {inputs.max_new_tokens} x {shape.vocab} vocab x fp32"
            lines.append(PlanLine(device, f"engine {i} sampled scores", scores, rule))
            continue
        if device.startswith("cuda") and total:
            u = inputs.gpu_memory_utilization
            kv, rule = (
                int(u * total) - weights,
                f"rollout.gpu_memory_utilization {u:g} x {total / GIB:.1f} GiB - weights",
            )
        else:
            kv, rule = inputs.cpu_kv_cache_bytes, "rollout.kv_cache_gb (VLLM_CPU_KVCACHE_SPACE)"
        lines.append(PlanLine(device, f"engine {i} KV cache", max(kv, 0), rule, phase))
    return lines


def _trainer_lines(
    shape: ModelShape, inputs: PlanInputs, where: str, n: int, trained: int, prefix: str
) -> list[PlanLine]:
    """One trainer rank's lines: fp32 weights, gradients, AdamW state, and while training its activations at
    ``train.token_budget`` and the logits (items named with ``prefix``: "" for rank 0)."""
    t, h, layers = inputs.token_budget, shape.hidden, shape.layers
    lines = [
        PlanLine(where, f"{prefix}trainer weights", 4 * n, f"fp32: 4 x {n:,} parameters"),
        PlanLine(where, f"{prefix}gradients", 4 * trained, f"fp32: 4 x {trained:,} trained parameters"),
        PlanLine(where, f"{prefix}optimizer state", 8 * trained, "AdamW's two fp32 moments: 8 x trained parameters"),
    ]
    if inputs.gradient_checkpointing:
        activations = t * layers * h * 2 + 34 * t * h
        rule = f"gradient checkpointing: {t} tokens x {layers} layers x {h} x 2 bytes + one layer's 34 x {t} x {h}"
    else:
        activations = t * layers * h * 34
        rule = f"{t} tokens (train.token_budget) x {layers} layers x {h} hidden x 34 bytes"
    lines.append(PlanLine(where, f"{prefix}activations", activations, rule, "train"))
    logits = t * shape.vocab * 8
    lines.append(PlanLine(where, f"{prefix}logits", logits, f"{t} tokens x {shape.vocab} vocab x fp32 x 2", "train"))
    return lines


def kv_capacity_tokens(shape: ModelShape, lines: list[PlanLine], dtype_bytes: int) -> dict[str, int]:
    """Tokens each engine's KV cache holds (by its plan line)."""
    per_token = shape.kv_bytes_per_token(dtype_bytes)
    return {line.item: line.bytes // per_token for line in lines if line.item.endswith("KV cache")}


def totals(lines: list[PlanLine]) -> dict[str, int]:
    """Peak bytes per device: what it holds throughout plus the larger of its training and sampling phases."""
    held: dict[str, dict[str, int]] = {}
    for line in lines:
        phases = held.setdefault(line.device, {"": 0, "train": 0, "rollout": 0})
        phases[line.phase] += line.bytes
    return {device: p[""] + max(p["train"], p["rollout"]) for device, p in held.items()}


def over_budget(
    lines: list[PlanLine],
    capacity: Mapping[str, int],
    shape: ModelShape | None = None,
    inputs: PlanInputs | None = None,
) -> list[str]:
    """One message per device whose plan exceeds its ``capacity`` (bytes), and per engine whose KV cache cannot hold
    one ``max_model_len`` sequence (with ``shape``/``inputs``), naming the settings to change."""
    problems = []
    slept = inputs is not None and inputs.engine_sleep_level > 0
    sleep_hint = "" if slept else ", or let the engine sleep while the trainer trains (rollout.sleep_level=1)"
    if shape is not None and inputs is not None:
        for item, tokens in kv_capacity_tokens(shape, lines, inputs.engine_dtype_bytes).items():
            if tokens < inputs.max_model_len:
                problems.append(
                    f"{item} holds {tokens} tokens, less than one sequence of rollout.max_model_len="
                    f"{inputs.max_model_len}: raise rollout.gpu_memory_utilization (GPU) / rollout.kv_cache_gb "
                    "(CPU), or lower rollout.max_model_len"
                )
    for device, used in totals(lines).items():
        have = capacity.get(device)
        if have is None or used <= have:
            continue
        biggest = max((line for line in lines if line.device == device), key=lambda line: line.bytes)
        problems.append(
            f"{device}: the plan needs {used / GIB:.1f} GiB and the device has {have / GIB:.1f} GiB (largest: "
            f"{biggest.item}, {biggest.bytes / GIB:.1f} GiB); lower train.token_budget, set "
            "train.gradient_checkpointing=true or train.lora, lower rollout.gpu_memory_utilization or "
            "data.prompts_per_iteration x data.group_size, or place the engines on other devices"
            + (sleep_hint if shares_with_trainer(lines, device) and device.startswith("cuda") else "")
        )
    return problems


def shares_with_trainer(lines: list[PlanLine], device: str) -> bool:
    """Whether an engine and the trainer both hold memory on ``device``."""
    items = [line.item for line in lines if line.device == device]
    return "trainer weights" in items and any(item.startswith("engine ") for item in items)


def render(lines: list[PlanLine], capacity: Mapping[str, int] | None = None) -> str:
    """The plan as a text table with per-device totals."""
    rows = [f"{'device':<10} {'item':<36} {'GiB':>9}  rule"]
    when = {"train": " (while training)", "rollout": " (while sampling)", "": ""}
    for line in lines:
        rows.append(f"{line.device:<10} {line.item:<36} {line.bytes / GIB:>9.3f}  {line.rule}{when[line.phase]}")
    phased = {line.device for line in lines if line.phase == "rollout"}
    for device, used in totals(lines).items():
        have = (capacity or {}).get(device)
        suffix = f" of {have / GIB:.1f} GiB" if have else ""
        label = "peak (the larger phase)" if device in phased else "total"
        rows.append(f"{device:<10} {label:<36} {used / GIB:>9.3f}{suffix}")
    return "\n".join(rows)
