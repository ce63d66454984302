"""Request settings the agent endpoint accepts but does not honour, named so a run can say so.

The endpoint samples what the trainer will score: the run's temperature and top-p, nothing that reshapes the
distribution per request. So these OpenAI settings are accepted (an agent written for OpenAI keeps working) and
have no effect:

* ``response_format`` other than ``text`` (and the Responses API's ``text.format``): JSON mode and JSON schemas
  need constrained decoding, which masks tokens the trainer's log-probs do not mask;
* ``tool_choice`` ``"required"`` or a named function: served as ``"auto"`` (the model decides whether it calls a
  tool; forcing one would also be constrained decoding);
* ``presence_penalty``, ``frequency_penalty`` and ``logit_bias``: they change the sampled distribution;
* ``top_logprobs``: each token's ``top_logprobs`` list comes back empty.

``temperature`` and ``top_p`` are documented apart (the run imposes its own; docs/agents.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

WHY = {
    "response_format": "no constrained decoding (JSON mode, schemas): the trainer scores the unconstrained model",
    "tool_choice": "'required' and named functions are served as 'auto'",
    "presence_penalty": "penalties would change the distribution the trainer scores",
    "frequency_penalty": "penalties would change the distribution the trainer scores",
    "logit_bias": "a bias would change the distribution the trainer scores",
    "top_logprobs": "top_logprobs lists come back empty",
}


def ignored_settings(body: Mapping[str, Any]) -> list[str]:
    """The settings of a chat-completions or completions request ``body`` that the endpoint accepts and does not
    honour."""
    found = []
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping) and response_format.get("type", "text") != "text":
        found.append("response_format")
    choice = body.get("tool_choice")
    if body.get("tools") and (choice == "required" or isinstance(choice, Mapping)):
        found.append("tool_choice")
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key):
            found.append(key)
    if body.get("logit_bias"):
        found.append("logit_bias")
    if body.get("logprobs") and body.get("top_logprobs"):
        found.append("top_logprobs")
    return found
