"""New weights into a running vLLM engine on CPU, re-packed with vLLM's own loaders and kernels, without its
layer-wise reload machinery.

On CPU vLLM packs every linear layer's weight for its GEMM kernel (a oneDNN handle, or the small-GEMM kernel's
packed copy) and leaves a zero-size parameter behind; ``model_runner.reload_weights`` therefore rebuilds each layer
on the meta device, buffers the weights, materializes, loads, re-packs and copies the results back into the
original tensors (what keeps CUDA graphs valid on GPU). On CPU that bookkeeping is most of a reload: 0.21-0.24 s of
its ~0.23 s for the packaged SmolLM2-135M in bf16 on 2 AMD EPYC cores, against ~0.10 s for the packing itself.

:func:`reload_weights` does the same work in place instead: each linear layer gets a full-size weight parameter
again (with the layer's own ``weight_loader``), ``model.load_weights`` (vLLM's name mapping, q/k/v and gate/up
stacking, dtype conversion) fills them and the embeddings and norms, and each layer's quantization method's
``process_weights_after_loading`` (vLLM's ``dispatch_cpu_unquantized_gemm``) packs them again, the tied output head
included. The engine then computes exactly what it computes after vLLM's reload (bit-identical log-probs, tested).

Only on a CPU engine whose every weight-holding layer is an unquantized linear or embedding layer, without LoRA.
The choice is made once per engine, at its first reload, and kept: the two paths are not mixed on one engine (a
reload of this kind after vLLM's own left the engine computing something else in a probe; each path alone matches
the other on a fresh engine). Elsewhere (GPU, quantized models) it is vLLM's ``reload_weights``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

_CHOICE = "_llmrl_packs_in_place"
# in vLLM's namespace: the line sits beside the engine's own (a rollout worker's log file), under vLLM's settings
_LOG = logging.getLogger("vllm.llmrl.cpu_reload")


def reload_weights(runner: Any, weights: list[tuple[str, Any]]) -> None:
    """Load ``weights`` (checkpoint names) into ``runner``'s model: in place on an eligible CPU engine (module
    docstring), else through vLLM's ``reload_weights``."""
    model = runner.get_model()
    in_place = getattr(runner, _CHOICE, None)
    if in_place is None:
        in_place = _packs_in_place(runner, model)
        setattr(runner, _CHOICE, in_place)
    if in_place:
        start = time.perf_counter()
        repacked = _reload_in_place(runner, model, weights)
        _LOG.info(
            "Reloading weights in place took %.2f seconds (%d layers re-packed; llmrl_core.weight_sync.cpu_reload)",
            time.perf_counter() - start,
            repacked,
        )
    else:
        runner.reload_weights(weights_iterator=weights)


def _packs_in_place(runner: Any, model: torch.nn.Module) -> bool:
    """Whether :func:`_reload_in_place` covers this engine's model (see the module docstring)."""
    try:
        from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            UnquantizedEmbeddingMethod,
            VocabParallelEmbedding,
        )
        from vllm.platforms import current_platform
    except ImportError:  # another vLLM layout: its own reload
        return False
    if not current_platform.is_cpu() or getattr(runner, "lora_config", None) is not None:
        return False
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(module, LinearBase):
            if type(method) is not UnquantizedLinearMethod or not _has_loader_shape(module):
                return False
        elif isinstance(module, VocabParallelEmbedding):
            if type(method) is not UnquantizedEmbeddingMethod:
                return False
        elif method is not None or _holds_weights_outside_the_loader(module):
            return False
    return True


def _has_loader_shape(layer: Any) -> bool:
    return all(hasattr(layer, name) for name in ("output_partition_sizes", "input_size_per_partition", "weight_loader"))


def _holds_weights_outside_the_loader(module: torch.nn.Module) -> bool:
    """A layer kind this path does not know that keeps a packed copy of its weights (a name ending in ``weight``
    on a module with a CPU kernel hook)."""
    return hasattr(module, "cpu_linear") and any(name.endswith("weight") for name, _ in module.named_parameters(False))


def _reload_in_place(runner: Any, model: torch.nn.Module, weights: list[tuple[str, Any]]) -> int:
    """Load and re-pack (module docstring); returns how many layers were re-packed."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
    from vllm.model_executor.utils import set_weight_attrs

    dtype = runner.model_config.dtype
    linears = [(name, module) for name, module in model.named_modules() if isinstance(module, LinearBase)]
    kept = {}
    for name, layer in linears:
        kept[name] = (layer.weight, getattr(layer, "cpu_linear", None))
        weight = torch.nn.Parameter(
            torch.empty(sum(layer.output_partition_sizes), layer.input_size_per_partition, dtype=dtype),
            requires_grad=False,
        )
        layer.weight = weight
        set_weight_attrs(weight, {"weight_loader": layer.weight_loader, "input_dim": 1, "output_dim": 0})
    loaded = set(model.load_weights(weights) or ())
    repacked = 0
    for name, layer in linears:
        if f"{name}.weight" not in loaded:  # not in this update: the layer keeps what it had
            layer.weight, packed = kept[name]
            if packed is not None:
                layer.cpu_linear = packed
            continue
        layer.quant_method.process_weights_after_loading(layer)
        repacked += 1
    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding):  # the embeddings and the (tied) output head
            module.quant_method.process_weights_after_loading(module)
            repacked += 1
    return repacked
