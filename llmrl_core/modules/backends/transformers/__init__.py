"""A transformers causal LM as a resident rollout engine (``rollout.backend: transformers``): :mod:`.worker` and its
parts in :mod:`.scoring`."""
