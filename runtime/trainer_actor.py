"""The flows' trainer actor, resident on its Dask worker across iterations.

``TrainerWorker`` holds the policy model, its optimizer (and a frozen reference model when the KL coefficient is
above 0) and the run's checkpoint store. It exchanges only paths, versions and small summaries with the flow:
trajectories come from the Parquet store, weights leave through the checkpoint store (or shared memory, or a
broadcast to the engines). The rollout engines are :mod:`runtime.rollout_actor`'s.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from llmrl_core.hardware import cuda_peak_gib, mixed_precision_for, where_am_i
from llmrl_core.pipeline.grpo_config import GRPOConfig
from runtime.records import read_shards, record_to_sample
from runtime.trainer_state import TrainerStateFiles
from runtime.trainer_weight_sync import TrainerWeightSync
from storage.checkpoints import CheckpointManifest, CheckpointStore, WrittenWeights
from storage.handoff import SharedWeights
from storage.layout import RunLayout
from storage.trajectories import TrajectoryStore

AGREEMENT_KEYS = ("sampler_abs_diff_mean", "sampler_abs_diff_max", "kl_to_sampler", "sampler_ess")


def signal_rows(records: list[Any]) -> list[Any]:
    """The rows of groups whose rewards are not all equal (the only ones with a nonzero GRPO advantage)."""
    rewards: dict[str, set[float]] = {}
    for record in records:
        rewards.setdefault(record.group_id, set()).add(record.reward)
    return [r for r in records if len(rewards[r.group_id]) > 1]


def skips_groups(train: Any) -> bool:
    """Whether a step leaves out the groups without signal: ``train.skip_zero_signal_groups``, except with
    ``train.exact_skip`` where those rows have a gradient (a KL or entropy term): exact then means training them."""
    if not train.skip_zero_signal_groups:
        return False
    return not (train.exact_skip and (train.kl_coef > 0 or train.entropy_coeff > 0))


def one_micro_batch(samples: list[Any], train: Any) -> list[Any]:
    """The first ``samples`` that fit one packed micro-batch of ``train.token_budget`` tokens (at least one):
    what the agreement check scores when no group has signal. Agreement is a property of the weights the engine
    and the trainer hold, not of the rows, so one micro-batch's rows say it as well as the whole batch does (a
    forward pass over all 64 rows of the main job took ~20 s of a 2-core iteration)."""
    taken, tokens = [], 0
    for sample in samples:
        if taken and tokens + sample.length > train.token_budget:
            break
        taken.append(sample)
        tokens += sample.length
    return taken


class TrainerWorker(TrainerStateFiles, TrainerWeightSync):
    """The resident policy model, its optimizer and the checkpoint store of the run."""

    # what stage() wrote, for seal(): the store's file (a local store), its manifest (a remote store), or None
    # (the weights went through shared memory: seal() writes the checkpoint)
    _staged: tuple[int, WrittenWeights | CheckpointManifest | None] | None = None
    _shared: SharedWeights | None = None  # set by share_weights()
    _shared_fell_back = False  # the last stage() found no room in shared memory

    def __init__(self, cfg: Any, model: str | None = None, layout: RunLayout | None = None) -> None:
        """``cfg``: the run's config (a :class:`GRPOConfig`; the epoch trainer passes its
        :class:`~runtime.sft_actor.TrainerSetup`, with the same ``run_id``, ``model``, ``seed``, ``keep_checkpoints``,
        ``keep_every``, ``progress`` and ``train`` section); ``model``: a model reference (default ``cfg.model``),
        resolved on this worker (see :class:`RolloutWorker`); ``layout``: where the run's checkpoints and trainer
        states live (default ``RunLayout.for_runs_dir(cfg.run_id, cfg.runs_dir)``, resolved on this worker): local
        folders, or URIs of a store every node reaches (``runs_dir: s3://...``). The objective and whether a frozen
        reference is kept come from :meth:`_objective` and :meth:`_keeps_reference` (a subclass's choice); the rest
        of the ``train`` section (threads, device, precision, LoRA, gradient checkpointing, optimizer) applies to
        every trainer alike."""
        from transformers import AutoModelForCausalLM

        from llmrl_core.model_store import resolve_model
        from llmrl_core.trainer import Trainer, TrainerConfig
        from llmrl_core.trainer.lora import LoraOptions

        t = cfg.train
        torch.set_num_threads(t.threads or os.cpu_count() or 1)
        device = "cuda" if t.device == "cuda" or (t.device == "auto" and torch.cuda.is_available()) else "cpu"
        self.mixed_precision, self.precision_reason = mixed_precision_for(t.mixed_precision, device)
        self.cfg = cfg
        self.layout = layout or RunLayout.for_runs_dir(cfg.run_id, cfg.runs_dir)
        model_path = resolve_model(cfg.model if model is None else model)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device)
        self.ref = copy.deepcopy(self.model).eval().requires_grad_(False) if self._keeps_reference() else None
        lora = t.lora
        lora_options = (
            LoraOptions(lora.r, lora.alpha, lora.dropout, tuple(lora.target_modules)) if lora.enabled else None
        )
        self.trainer = Trainer(
            self._objective(self.model),
            TrainerConfig(
                lr=t.lr,
                max_grad_norm=t.max_grad_norm,
                token_budget=t.token_budget,
                mixed_precision=self.mixed_precision,
                gradient_checkpointing=t.gradient_checkpointing,
                lora=lora_options,
                seed=cfg.seed,
                progress=cfg.progress,
            ),
        )
        self.checkpoints = CheckpointStore(
            self.layout.checkpoints_uri, keep_last=cfg.keep_checkpoints, keep_every=cfg.keep_every
        )

    def _objective(self, model: torch.nn.Module) -> Any:
        """The loss the trainer optimizes: GRPO with the run's ``train`` options (``train.loss_class``, a
        ``GRPOLoss`` subclass, built the same way plus ``train.loss_kwargs``)."""
        from llmrl_core.objectives import GRPOLoss
        from llmrl_core.pipeline.components import component_class

        t = self.cfg.train
        loss = component_class(t.loss_class, GRPOLoss, "train.loss_class") if t.loss_class else GRPOLoss
        options = {**t.loss_options(self.cfg.rollout.max_new_tokens), **t.loss_kwargs}
        return loss(model, entropy_bonus=t.entropy_coeff > 0, **options)

    def _keeps_reference(self) -> bool:
        """Whether a frozen copy of the starting weights is kept (the KL to the reference)."""
        return self.cfg.train.kl_coef > 0

    def describe(self) -> dict[str, str]:
        """The trainer's device and compute precision, and why (for the run's log and lineage)."""
        device = self.trainer.device
        return {
            "trainer_device": str(device),
            "trainer_precision": self.mixed_precision,
            "trainer_precision_reason": self.precision_reason,
            **where_am_i(str(device), [device.index or 0] if device.type == "cuda" else None),
        }

    # --- publishing --------------------------------------------------------------------------------
    def publish(self, version: int, config: dict[str, Any]) -> dict[str, Any]:
        """Checkpoint the weights as ``version`` and save optimizer + RNG state beside it (atomically):
        :meth:`stage` then :meth:`seal` in one call."""
        self.stage(version, config)
        return self.seal(version, config)

    def share_weights(self, dtype: str) -> bool:
        """Hand new versions to the engines through shared memory from now on, in their ``dtype`` (``"bfloat16"``,
        ``"float32"``, ...): the flow calls it when every engine runs on this worker's host and loads checkpoint
        files (:class:`storage.handoff.SharedWeights`). Returns whether it is on (not for a dtype torch lacks)."""
        torch_dtype = getattr(torch, dtype, None)
        self._shared = SharedWeights(torch_dtype) if isinstance(torch_dtype, torch.dtype) else None
        return self._shared is not None

    def stage(self, version: int, config: dict[str, Any]) -> dict[str, Any]:
        """Write the weights of ``version`` where the engines load them from; returns ``{"version", "checkpoint",
        "seconds"}``.

        After :meth:`share_weights` that is the shared-memory file (when ``/dev/shm`` has room): the engines' dtype,
        rewritten in place, and the checkpoint is written by :meth:`seal`. Otherwise it is the checkpoint: on a
        local store the file is complete at its final path but not yet a version (no fsync, hash or manifest:
        :meth:`seal` adds them once the engines loaded it); on a remote store the version is committed here,
        manifest included, as engines on other nodes check the bytes they read against it.
        """
        start = time.perf_counter()
        state = self.trainer.state_dict_for_inference(copy=False)  # only written out, before the next step
        shared = self._shared.write(state) if self._shared is not None else None
        note = self._shared_memory_note(shared is not None)
        if shared is not None:
            self._staged = (version, None)
            return {"version": version, "checkpoint": str(shared), "seconds": time.perf_counter() - start, **note}
        written = self.checkpoints.write_weights(state, version)
        del state
        self._staged = (version, written if self.checkpoints.local else self._commit(written, config))
        return {
            "version": version,
            "checkpoint": str(self.checkpoints.weights_path(version)),
            "seconds": time.perf_counter() - start,
            **note,
        }

    def _shared_memory_note(self, written: bool) -> dict[str, str]:
        """``{"note": ...}`` when the shared-memory handoff stops (no room in /dev/shm: versions go through
        checkpoint files) or starts again; ``{}`` otherwise (the flow logs the note, once per change)."""
        if self._shared is None or written != self._shared_fell_back:
            return {}
        self._shared_fell_back = not written
        if written:
            return {"note": "shared memory has room again: new versions reach the engines through it"}
        return {
            "note": f"shared memory ({self._shared.shared_root}) lacks room for twice the weights: new versions "
            "reach the engines through checkpoint files until it has (slower; free some of it or give the container "
            "more)"
        }

    def weights_fingerprint(self, dtype: str) -> str:
        """The fingerprint of the weights this trainer publishes, in an engine's ``dtype``
        (:mod:`llmrl_core.weight_sync.fingerprint`)."""
        from llmrl_core.weight_sync.fingerprint import weights_fingerprint

        tied = bool(getattr(getattr(self.trainer.model, "config", None), "tie_word_embeddings", False))
        return weights_fingerprint(self.trainer.state_dict_for_inference(copy=False), dtype, tied=tied)

    def seal(self, version: int, config: dict[str, Any], fingerprint_dtypes: Sequence[str] = ()) -> dict[str, Any]:
        """Commit the checkpoint of ``version`` (the one :meth:`stage` wrote, or the trainer's weights now when
        they went through shared memory: nothing changes them between the two calls) with fsync, sha256, manifest
        and retention, and save the optimizer and RNG state reached at ``version``; returns ``{"version",
        "checkpoint", "sha256", "fingerprints", "seconds"}`` (``fingerprints``: dtype -> the weights' fingerprint in
        each of ``fingerprint_dtypes``, the engines' dtypes)."""
        start = time.perf_counter()
        staged = self._staged
        if staged is None or staged[0] != version:
            raise RuntimeError(f"seal({version}) without stage({version}) first (staged: {staged and staged[0]})")
        manifest = staged[1]
        if manifest is None:
            manifest = self.checkpoints.write_weights(self.trainer.state_dict_for_inference(copy=False), version)
        if not isinstance(manifest, CheckpointManifest):
            manifest = self._commit(manifest, config)
        self.save_state(version)
        self._staged = None
        return {
            "version": version,
            "checkpoint": str(self.checkpoints.weights_path(version)),  # a path, or a URI for a remote store
            "sha256": manifest.sha256,
            # in each engine dtype: what the engines must hold (the flow compares before it trains on their rows)
            "fingerprints": {dtype: self.weights_fingerprint(dtype) for dtype in fingerprint_dtypes},
            "seconds": time.perf_counter() - start,
        }

    def _commit(self, written: WrittenWeights, config: dict[str, Any]) -> CheckpointManifest:
        """Seal ``written`` in the checkpoint store (hash, manifest, retention)."""
        version = written.policy_version
        return self.checkpoints.seal(
            written,
            parent_version=version - 1 if version > 0 else None,
            config=config,
            model_id=self.cfg.model,
            protect=self._resume_needs(version),
        )

    def _resume_needs(self, version: int) -> range:
        """The checkpoints a resume may need while ``version`` is sealed but not committed: the last committed
        version (``version - 1`` at the latest: the flow commits a version before it publishes the next) and the
        ``rollout.max_staleness`` versions before it, whose checkpoints re-sample its unpublished batches.
        Retention keeps them even when ``keep_checkpoints`` alone would not."""
        staleness = self.cfg.rollout.max_staleness if isinstance(self.cfg, GRPOConfig) else 0
        return range(max(0, version - 1 - staleness), version)

    # --- data-parallel ranks (train.data_parallel > 1) ------------------------------------------------
    _data_parallel: Any = None  # a DataParallelTrainer once join_data_parallel() ran

    def join_data_parallel(self, init_method: str, rank: int, world_size: int) -> dict[str, Any]:
        """Join the run's trainer ranks (``tcp://host:port`` of rank 0, blocking until all joined): from now on
        :meth:`train` computes each step over this rank's token-balanced shard of the batch and sums the gradients
        over the group (gloo on CPU, NCCL on CUDA), so every rank holds the same weights after it. Rank 0's
        trainable weights are broadcast first (the replicas start identical). Returns ``{"rank", "backend"}``."""
        from llmrl_core.trainer.data_parallel import DataParallelTrainer, init_process_group

        backend = "nccl" if self.trainer.device.type == "cuda" else "gloo"
        init_process_group(rank, world_size, backend, init_method=init_method)
        self._data_parallel = DataParallelTrainer(self.trainer)
        if rank > 0:
            self.ref = None  # reference scoring runs on rank 0 (the rows carry its log-probs to every rank)
        return {"rank": rank, "backend": backend}

    def _check_same_batch(self, samples: list[Any]) -> None:
        """Data-parallel ranks shard one global batch: refuse a step where they read different rows (or orders)."""
        import hashlib

        import torch.distributed as dist

        digest = hashlib.sha256("\n".join(s.sample_id or "" for s in samples).encode()).hexdigest()
        seen: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(seen, digest)
        if len(set(seen)) > 1:
            raise RuntimeError(f"the trainer ranks read different batches ({len(samples)} rows here): {seen}")

    # --- stages ----------------------------------------------------------------------------------
    def reference_log_prob(self, temperature: float) -> Any:
        """TorchRL's ``RetrieveLogProb`` on the frozen reference model: a ``TransformersWrapper`` that scores
        ``("tokens", "full")`` packed under ``train.token_budget`` at the rows' sampling ``temperature``, writing
        ``("ref_log_probs", "full")`` (``train.kl_transform_class`` / ``kl_transform_kwargs``: a subclass of it,
        built the same way). One per temperature, kept with the actor."""
        from llmrl_core.envs.transforms import RetrieveLogProb
        from llmrl_core.modules.policies import TransformersWrapper
        from llmrl_core.pipeline.components import component_class

        cache = self.__dict__.setdefault("_reference_transforms", {})
        if temperature not in cache:
            t = self.cfg.train
            cls = RetrieveLogProb
            if t.kl_transform_class:
                cls = component_class(t.kl_transform_class, RetrieveLogProb, "train.kl_transform_class")
            scorer = TransformersWrapper(
                self.ref,
                input_mode="tokens",
                generate=False,
                return_log_probs=True,
                pad_model_input=False,
                score_token_budget=t.token_budget,
                score_temperature=temperature,
            )
            kwargs = {"assistant_only": False, "log_probs_full_key": ("ref_log_probs", "full")}
            cache[temperature] = cls(scorer, **{**kwargs, **t.kl_transform_kwargs})
        return cache[temperature]

    @torch.no_grad()
    def score_reference(self, staging_uri: str, version: int) -> dict[str, Any]:
        """Fill ``ref_logprobs`` of every staged row with the frozen reference model (rewrites each shard), through
        TorchRL's ``RetrieveLogProb`` (:meth:`reference_log_prob`) on a TensorDict of the rows' tokens.

        Rows are scored in packed micro-batches under ``train.token_budget`` (one forward pass per micro-batch,
        as the train step), at each row's sampling temperature (the same distribution as the sampler's and the
        trainer's log-probs).
        """
        from tensordict import TensorDict, lazy_stack

        if self.ref is None:
            raise RuntimeError("no reference model: train.kl_coef is 0")
        start = time.perf_counter()
        store = TrajectoryStore(staging_uri)
        rows = 0
        tokens = 0
        for shard, records in read_shards(store, self.cfg.run_id, version):
            samples = [record_to_sample(dataclasses.replace(record, advantage=0.0)) for record in records]
            by_temperature: dict[float, list[int]] = {}
            for i, sample in enumerate(samples):
                by_temperature.setdefault(float(sample.temperature), []).append(i)
            for temperature, indices in by_temperature.items():
                full = [torch.tensor([*samples[i].prompt_ids, *samples[i].response_ids]) for i in indices]
                batch = lazy_stack([TensorDict({("tokens", "full"): ids}) for ids in full])
                with self.trainer.autocast():
                    scored = self.reference_log_prob(temperature)(batch)
                for i, log_probs in zip(indices, scored.get(("ref_log_probs", "full"), as_list=True), strict=True):
                    prompt = len(samples[i].prompt_ids)
                    records[i].ref_logprobs = log_probs[prompt:].float().cpu().tolist()
                tokens += sum(len(ids) for ids in full)
            store.write_shard(self.cfg.run_id, version, shard, records)
            rows += len(records)
        seconds = time.perf_counter() - start
        return {"rows": rows, "ref_seconds": seconds, "ref_tokens_per_s": tokens / seconds if seconds > 0 else 0.0}

    def train(
        self, store_uri: str, version: int, shard_prefix: str | None = None, trains: int | None = None
    ) -> dict[str, float]:
        """``steps_per_iteration`` optimizer steps on the published partition of ``version`` (only its shards
        named ``shard_prefix*`` when given), taking the trainer from version ``trains`` (default ``version``)
        to ``trains + 1``.

        A synchronous run trains on rows its current weights sampled: the first step's forward pass then gives
        the iteration's agreement metrics (``agreement_*``: mean and max |trainer - sampler| log-prob, k3 KL to
        the sampler, ESS of the ratio). When no group has signal (nothing to train), they are measured with a
        forward pass alone, over the rows of one micro-batch (:func:`one_micro_batch`); with ``train.exact_skip``
        the optimizer still takes its step on zero gradients (:meth:`Trainer.zero_gradient_step`, AdamW's
        momentum), as it would have after training those rows, and on a version with signal the left-out rows count
        in the loss's mean (``zero_gradient_rows``). ``agreement_off`` is 1
        when the mean gap exceeds ``train.agreement_warn`` (e.g. engines holding other weights than the
        trainer). Rows sampled by an older version (asynchronous runs,
        ``rollout.max_staleness``) are refused when older than ``max_staleness`` versions; for them the same
        numbers measure how far off-policy the batch is (``offpolicy_*``) and no agreement warning applies. The
        GRPO ratio is taken against the stored sampler log-probs either way.
        """
        trains = version if trains is None else trains
        records = TrajectoryStore(store_uri).read_records(self.cfg.run_id, version=version, shard_prefix=shard_prefix)
        staleness = [trains - r.policy_version for r in records]
        bound = self.cfg.rollout.max_staleness
        if any(s < 0 or s > bound for s in staleness):
            raise RuntimeError(
                f"batch for version {trains} -> {trains + 1} has rows sampled by versions "
                f"{sorted({r.policy_version for r in records})}: rollout.max_staleness={bound} allows "
                f"versions {max(0, trains - bound)}..{trains}"
            )
        trained = signal_rows(records) if skips_groups(self.cfg.train) else records
        if not records:
            return {"train_samples": 0.0}
        exact = self.cfg.train.exact_skip and len(trained) < len(records)
        metrics: dict[str, float] = {}
        first: dict[str, float] | None = None
        if trained:
            samples = [record_to_sample(r) for r in trained]
            kept = {id(r) for r in trained}
            # exact_skip: the left-out rows (no advantage, so no gradient) count in the loss's mean as if trained
            left_out = [record_to_sample(r) for r in records if id(r) not in kept] if exact else []
            step = self.trainer.train_step
            if self._data_parallel is not None and self._data_parallel.distributed:
                self._check_same_batch(samples)
                step = self._data_parallel.train_step  # this rank's shard, gradients summed over the ranks
            for _ in range(self.cfg.train.steps_per_iteration):
                metrics = step(samples, zero_gradient_rows=left_out)
                first = first or metrics
        else:
            first = self.trainer.evaluate(one_micro_batch([record_to_sample(r) for r in records], self.cfg.train))
            if exact:
                # no row has an advantage: the step training them would take (zero gradients, AdamW's momentum),
                # on every rank alike (no collective: the gradients are zero everywhere)
                for _ in range(self.cfg.train.steps_per_iteration):
                    metrics = self.trainer.zero_gradient_step()
        stale = max(staleness) > 0
        label = "offpolicy" if stale else "agreement"
        agreement = {f"{label}_{k.removeprefix('sampler_')}": first[k] for k in AGREEMENT_KEYS if k in first}
        if "agreement_abs_diff_mean" in agreement:
            agreement["agreement_off"] = float(agreement["agreement_abs_diff_mean"] > self.cfg.train.agreement_warn)
        histogram = {f"staleness_{s}_rows": float(staleness.count(s)) for s in sorted(set(staleness))}
        return {
            **metrics,
            **agreement,
            **histogram,
            "staleness_mean": float(np.mean(staleness)),
            "train_samples": float(len(trained)),
            **cuda_peak_gib("train"),
        }
