"""The transform chain of :class:`~llmrl_core.envs.chat_env.ChatEnv` (:class:`TransformChain`, one of its base
classes): TorchRL's TensorDict transforms in order, as a TorchRL ``TransformedEnv`` holds them (``append_transform``,
``insert_transform``; the hooks of llmrl's former per-conversation transforms are refused), and ``close``, which
releases what they hold."""

from __future__ import annotations

from typing import Any, Self

_SLOT_HOOKS = ("on_reset", "reset_slot", "on_step", "step_slot", "on_output")


def _refuse_slot_hooks(transform: Any) -> None:
    """A transform written against llmrl's former per-conversation base (``SlotTransform``: ``step_slot(slot)``,
    ``on_step(slots)``, ...) would have its hooks never run. Say so, with the fix, instead of ignoring them."""
    defined = [hook for hook in _SLOT_HOOKS if any(hook in vars(cls) for cls in type(transform).__mro__)]
    if defined:
        raise TypeError(
            f"{type(transform).__name__} defines {', '.join(defined)}: the hooks of llmrl's former per-conversation "
            "transforms, which no env calls any more. Write it as TorchRL's Transform: _step(tensordict, "
            "next_tensordict) reading the answer and writing 'reward' / 'done' under next, _reset(tensordict, "
            "tensordict_reset) on ('history', 'prompt') (README, 'Migrating')."
        )


class TransformChain:
    """The env's TensorDict transforms (``td_transforms``, which the env sets), added, checked and closed."""

    td_transforms: list[Any]

    def append_transform(self, transform: Any) -> Self:
        """Add a TorchRL TensorDict transform (:class:`~llmrl_core.envs.transforms.td_base.Transform`: tools, reward
        parsers, the primer, ``RetrieveKL``, ...) at the end of the chain; returns the env (chainable).

        As in a TorchRL ``TransformedEnv``: ``_reset`` runs on every reset, ``_inv_call`` on the action and
        ``_step`` on the ``"next"`` data of every step, in the order appended; on the list calls (``reset(prompts)``,
        ``step(answers)``: the collector's and the flows') they see the slots in TorchRL's layout and what they write
        becomes the slots' (:mod:`llmrl_core.envs.td_list_calls`).
        """
        self._check_transform(transform, "append_transform")
        transform.set_container(self)
        self.td_transforms.append(transform)
        return self

    def insert_transform(self, index: int, transform: Any) -> Self:
        """Insert a TensorDict transform at ``index`` in the chain (TorchRL's ``insert_transform``)."""
        self._check_transform(transform, "insert_transform")
        transform.set_container(self)
        self.td_transforms.insert(index, transform)
        return self

    @staticmethod
    def _check_transform(transform: Any, caller: str) -> None:
        from llmrl_core.envs.transforms import td_base

        _refuse_slot_hooks(transform)
        if not isinstance(transform, td_base.Transform):
            raise TypeError(
                f"{caller} expects a Transform (TorchRL's TensorDict transform), got {type(transform).__name__}"
            )

    def close(self) -> None:
        """Release what the transforms hold (sandboxed interpreters, MCP servers, browsers)."""
        for transform in self.td_transforms:
            close = getattr(transform, "close", None)
            if callable(close):
                close()
