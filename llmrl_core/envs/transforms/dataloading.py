"""TorchRL's ``torchrl.envs.llm.transforms.dataloading`` under llmrl's name (the README's import rule);
the classes live in the modules imported here."""

from llmrl_core.envs.primer import DataLoadingPrimer
from llmrl_core.envs.primer_hosted import RayDataLoadingPrimer
from llmrl_core.envs.transforms.stacking import as_nested_tensor, as_padded_tensor

__all__ = ["DataLoadingPrimer", "RayDataLoadingPrimer", "as_nested_tensor", "as_padded_tensor"]
