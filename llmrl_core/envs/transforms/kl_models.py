"""The two scoring models of :class:`~llmrl_core.envs.transforms.kl.RetrieveKL`: the checks on a given pair
(:func:`check_kl_models`, TorchRL's errors) and the generating model built from the collector's policy when
``gen_model="from_collector"`` (:func:`gen_model_from_collector`)."""

from __future__ import annotations

from typing import Any

from tensordict.utils import NestedKey


def check_kl_models(gen_model: Any, ref_model: Any) -> None:
    """Raise TorchRL's ``ValueError`` unless ``gen_model`` and ``ref_model`` are two scoring wrappers
    (``generate=False``, ``return_log_probs=True``) with the same ``pad_output`` and different ``log_probs_key``."""
    if hasattr(gen_model, "pad_output") and hasattr(ref_model, "pad_output"):
        if gen_model.pad_output != ref_model.pad_output:
            raise ValueError(
                f"pad_output mismatch: gen_model.pad_output={gen_model.pad_output}, "
                f"ref_model.pad_output={ref_model.pad_output}. "
                "Both models must use the same padding strategy for KL computation."
            )
    if not getattr(gen_model, "return_log_probs", True):
        raise ValueError("The generation model must have `return_log_probs=True` to use the `RetrieveKL` transform.")
    if getattr(gen_model, "generate", False):
        raise ValueError("The generation model must have `generate=False` to use the `RetrieveKL` transform.")
    if not getattr(ref_model, "return_log_probs", True):
        raise ValueError("The reference model must have `return_log_probs=True` to use the `RetrieveKL` transform.")
    if getattr(ref_model, "generate", False):
        raise ValueError("The reference model must have `generate=False` to use the `RetrieveKL` transform.")
    if getattr(gen_model, "log_probs_key", "gen_log_probs") == getattr(ref_model, "log_probs_key", "log_probs"):
        raise ValueError(
            "The generation and reference models must have different `log_prob_key` values to use the "
            "`RetrieveKL` transform."
        )
    if gen_model is None:
        raise ValueError("gen_model cannot be None when not using 'from_collector'")
    if ref_model is None:
        raise ValueError("ref_model cannot be None")


def gen_model_from_collector(collector: Any, ref_model: Any, gen_key: NestedKey) -> Any:
    """The scoring copy of the collector's policy (``get_new_version(generate=False, ...)``) that writes its
    log-probs under ``gen_key`` (a ``(..., "full")`` key), reading what ``ref_model`` reads and padded as it is."""
    return collector.policy.get_new_version(
        generate=False,
        return_log_probs=True,
        log_probs_key=gen_key[:-1] if len(gen_key) > 2 else gen_key[0],
        input_mode=ref_model.input_mode,
        input_key=(ref_model.input_mode, "full"),
        pad_output=getattr(ref_model, "pad_output", False),
    )
