"""Typed pipeline configs (pure dataclasses) and their YAML / ``--set`` loading; the flows consume them."""
