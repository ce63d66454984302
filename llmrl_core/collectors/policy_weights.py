"""The policy version and weight updates of :class:`~llmrl_core.collectors.llm_collector.LLMCollector` (TorchRL's
collector methods ``increment_version``, ``get_policy_version``, ``set_weight_updater``, ``update_policy_weights_``),
as a base class: the collector stamps every sampled turn with :attr:`PolicyWeights.policy_version`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from llmrl_core.envs.chat_env import ChatEnv
from llmrl_core.envs.transforms.policy_version import PolicyVersion

Version = int | str | None


class PolicyWeights:
    """Version tracking and weight pushes of a collector; the collector sets ``envs``, ``version_tracker``,
    ``weight_updater`` and ``_updater_increments``."""

    envs: list[ChatEnv]
    version_tracker: PolicyVersion | None
    weight_updater: Any
    _updater_increments: bool

    def _resolve_version_tracker(
        self, policy_version: PolicyVersion | None, track: bool | PolicyVersion
    ) -> PolicyVersion | None:
        if isinstance(track, PolicyVersion):
            if policy_version is not None and policy_version is not track:
                raise ValueError("policy_version and track_policy_version name two different PolicyVersions")
            return track
        if policy_version is not None:  # a tracker given is a tracker used
            return policy_version
        if not track:  # an env that carries its own PolicyVersion still stamps it, as in TorchRL
            return self._find_version_tracker()
        return self._find_version_tracker() or PolicyVersion()

    def _find_version_tracker(self) -> PolicyVersion | None:
        for env in self.envs:
            for transform in getattr(env, "td_transforms", ()):
                if isinstance(transform, PolicyVersion):
                    return transform
        return None

    @property
    def policy_version_tracker(self) -> PolicyVersion | None:
        """TorchRL's name for :attr:`version_tracker` (None when versions are not tracked)."""
        return self.version_tracker

    @property
    def policy_version(self) -> Version:
        """The version stamped on turns sampled from now on (None when versions are not tracked)."""
        return self.version_tracker.version if self.version_tracker is not None else None

    def get_policy_version(self) -> Version:
        """The current policy version, as a method (TorchRL's, for remote calls where properties do not work)."""
        return self.policy_version

    def increment_version(self) -> Version:
        """Advance the policy version (call after the policy's weights changed); a no-op when not tracking."""
        if self.version_tracker is None:
            return None
        return self.version_tracker.increment_version()

    def set_weight_updater(self, weight_updater: Any) -> bool:
        """Use ``weight_updater`` for :meth:`update_policy_weights_`; it learns the version tracker if it can."""
        if not callable(getattr(weight_updater, "push_weights", None)) and not callable(weight_updater):
            raise TypeError(f"weight_updater needs push_weights(weights) or __call__, got {type(weight_updater)}")
        self.weight_updater = weight_updater
        self._updater_increments = False
        register = getattr(weight_updater, "register_version_tracker", None)
        if self.version_tracker is not None and callable(register):
            # A vLLMUpdater increments its registered trackers on every push; register ours once.
            if not any(t is self.version_tracker for t in getattr(weight_updater, "trackers", [])):
                register(self.version_tracker)
            self._updater_increments = True
        return True

    def update_policy_weights_(
        self,
        policy_or_weights: Mapping[str, torch.Tensor] | torch.nn.Module | None = None,
        *,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        worker_ids: Any = None,
        **kwargs: Any,
    ) -> Version:
        """Push new weights to the policy through the weight updater and advance the version; returns it.

        With a ``weight_updater``, ``policy_or_weights`` (a state dict or a module) goes to its
        ``push_weights`` (or its ``__call__``); the version advances once (by the updater when it holds the
        tracker, by the collector otherwise). Without one, the policy is taken to be updated in place: only
        the version advances, and passing weights is an error. ``state_dict=`` is TorchRL's keyword for the
        weights; ``worker_ids`` is accepted for TorchRL's signature (every engine of this collector is updated).
        """
        if state_dict is Ellipsis or policy_or_weights is Ellipsis:  # TorchRL's docs write `state_dict=...`
            state_dict = policy_or_weights = None
        if state_dict is not None:
            if policy_or_weights is not None:
                raise ValueError("update_policy_weights_: pass the weights once (positionally or as state_dict=)")
            policy_or_weights = state_dict
        if kwargs:
            raise TypeError(f"update_policy_weights_ got unexpected arguments {sorted(kwargs)}")
        if self.weight_updater is None:
            if policy_or_weights is not None:
                raise ValueError("update_policy_weights_(weights) needs a weight_updater (e.g. a vLLMUpdater)")
            return self.increment_version()
        if policy_or_weights is None and callable(getattr(self.weight_updater, "increment_version", None)):
            if self._updater_increments:  # nothing to send: the updater only advances the version it holds
                self.weight_updater.increment_version()
                return self.policy_version
            return self.increment_version()
        push = getattr(self.weight_updater, "push_weights", None)
        if callable(push):
            push(policy_or_weights)
        else:
            self.weight_updater(policy_or_weights)
        if not self._updater_increments:
            self.increment_version()
        return self.policy_version
