"""Objectives (TorchRL's LLM objective names and semantics): GRPO (and its DAPO / CISPO variants), Monte-Carlo
advantages, SFT, distillation, top-k selection."""

from llmrl_core.data.topk import TopKRewardSelector, select_top_k
from llmrl_core.objectives.advantage import ADVANTAGE_METHODS, AdvantageResult, MCAdvantage, mc_advantage
from llmrl_core.objectives.advantage_hosted import RayMCAdvantage
from llmrl_core.objectives.advantage_selector import MCAdvantageSelector
from llmrl_core.objectives.distillation import DistillationLoss, DistillationLossOutput, k3_kl_token_estimate
from llmrl_core.objectives.grpo import (
    DAPO,
    IMPORTANCE_LEVELS,
    TIS_LEVELS,
    CISPOLoss,
    CISPOLossOutput,
    DAPOLossOutput,
    GRPOLoss,
    GRPOLossOutput,
    LLMLossOutput,
    grpo_loss,
)
from llmrl_core.objectives.sft import SFTLoss, SFTLossOutput, minor_sft_loss, sft_loss

__all__ = [
    "ADVANTAGE_METHODS",
    "IMPORTANCE_LEVELS",
    "TIS_LEVELS",
    "AdvantageResult",
    "CISPOLoss",
    "CISPOLossOutput",
    "DAPO",
    "DAPOLossOutput",
    "DistillationLoss",
    "DistillationLossOutput",
    "GRPOLoss",
    "GRPOLossOutput",
    "LLMLossOutput",
    "MCAdvantage",
    "MCAdvantageSelector",
    "RayMCAdvantage",
    "SFTLoss",
    "SFTLossOutput",
    "TopKRewardSelector",
    "grpo_loss",
    "k3_kl_token_estimate",
    "mc_advantage",
    "minor_sft_loss",
    "select_top_k",
    "sft_loss",
]
