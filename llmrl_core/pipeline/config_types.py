"""Setting types with their ranges, for the config dataclasses: pydantic enforces them when a config is loaded (the
message names the setting: :func:`llmrl_core.pipeline.config_io.build`) and every JSON schema of a config carries
them (``llmrl config schema``, the Prefect run form, the docs' configuration reference)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

AtLeast1 = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
# a share, 0 and 1 included
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
# in (0, 1]: a nucleus, a fraction of a GPU's memory
Probability = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
