"""``GRPOConfig``: every setting of a GRPO run, grouped by stage (YAML sections of the same names)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from llmrl_core.pipeline.config_io import strict_config
from llmrl_core.pipeline.env_config import EnvConfig, validate_env_config
from llmrl_core.pipeline.init_config import InitConfig
from llmrl_core.pipeline.task_config import TaskConfig


def _check(ok: bool, setting: str, rule: str, value: Any) -> None:
    """Raise a ValueError naming ``setting`` when ``ok`` is false (config errors surface before any work)."""
    if not ok:
        raise ValueError(f"{setting} {rule}, got {value!r}")


@dataclass
class DataConfig:
    """Prompt source and batch shape: ``prompts_per_iteration`` prompts, each sampled ``group_size`` times."""

    source: str = "gsm8k:train"  # gsm8k:train | arithmetic:train[?ops=+&low=10&high=99] | a .jsonl/.parquet path
    prompts_per_iteration: int = 8  # prompts drawn per iteration (one policy version)
    group_size: int = 4  # responses sampled per prompt; GRPO compares the responses of a group
    shuffle: bool = True  # shuffle the source once, seeded by seed (false: file order)

    def __post_init__(self) -> None:
        if self.prompts_per_iteration < 1 or self.group_size < 1:
            raise ValueError("prompts_per_iteration and group_size must be >= 1")


ENGINE_DTYPES = ("auto", "bfloat16", "float16", "float32")


@dataclass
class RolloutConfig:
    """Rollout workers and sampling: one resident vLLM engine per worker.

    The engine records the log-probs of the distribution it sampled from (vLLM's ``processed_logprobs``:
    temperature and top-p applied) and every stored row says so (``sampling_params.logprobs_mode``); the trainer
    divides its logits by the same temperature, so the GRPO ratio compares one policy on both sides. With
    ``top_p < 1`` the engine's log-probs are renormalised over the nucleus while the trainer scores the full
    temperature-scaled distribution: keep ``top_p = 1`` for exact agreement (the agreement metrics show the gap).
    """

    workers: int = 1  # rollout workers, one resident engine each
    dtype: str = "auto"  # auto: bf16 on CUDA and on CPUs with AMX/AVX512-BF16, float32 elsewhere
    kv_cache_gb: float = 1.0  # each CPU engine's KV cache (GiB)
    max_new_tokens: int = 128  # longest response in tokens
    temperature: float = 0.7  # sampling temperature (the trainer scores at the same one)
    top_p: float = 1.0  # nucleus sampling (keep 1.0 for exact sampler/trainer agreement)
    max_model_len: int = 2048  # prompt + response tokens an engine accepts
    # processed: the log-probs of the distribution sampled from; raw: the model's at T = 1
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = "processed_logprobs"
    # 0: synchronous (sample with version v, train v -> v+1). k >= 1: asynchronous with bounded staleness: the
    # batch that trains v -> v+1 is sampled by version max(0, v - k), so the engines sample ahead while the
    # trainer trains; the GRPO ratio uses the stored sampler log-probs.
    max_staleness: int = 0
    # Placement and scale (runtime/cluster.py): each engine runs on tensor_parallel_size GPUs of its own (CUDA
    # only: CPU engines scale with rollout.workers); gpu_memory_utilization is vLLM's fraction of each GPU's
    # memory per engine (None: the engine default, 0.4; set it when engines share a GPU); threads are the CPU
    # threads (OMP_NUM_THREADS) of each CPU engine's worker (0: the available cores / rollout.workers).
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    threads: int = 0
    # How each published version reaches the engines: "checkpoint" (the engines load the version's checkpoint file
    # or object), "nccl" (one CUDA broadcast from the trainer to every engine; the checkpoint is still written, for
    # resume), "gloo" (the same broadcast between a CPU trainer and CPU engines), "cuda_ipc" (engines on the
    # trainer's GPU open its weights in place through CUDA IPC handles; opt-in, vLLM or transformers engines),
    # "auto" (nccl when the trainer and every vLLM engine run on CUDA on distinct GPUs, else checkpoint).
    weight_sync: Literal["auto", "checkpoint", "nccl", "gloo", "cuda_ipc"] = "auto"
    # env.agent (docs/agents.md): agent episodes run at once per engine, and the seconds one may take before it
    # fails (its own episode only)
    agent_concurrency: int = 8
    agent_timeout_s: float = 120.0
    # the share of a batch's agent episodes that may fail (crash, timeout, bad result) before the run stops with the
    # counts and an example; up to it, the failures are named in a warning and the rest trains (1: stop only when
    # every episode failed)
    max_failed_fraction: float = 0.5
    # The engine: "vllm" (the default and the fast path) or "transformers" (model.generate behind the same actor
    # interface, for machines where vLLM is not installed; weights reach it by checkpoint or CUDA IPC, no tensor
    # parallelism)
    backend: Literal["vllm", "transformers"] = "vllm"
    # One GPU for the engine and the trainer (CUDA vLLM engines, synchronous runs): the engine sleeps while the
    # trainer trains (vLLM's sleep mode) and wakes for the next version's weights, so the trainer's activations
    # get the engine's memory. 1: weights to host memory, KV cache dropped; 2: both dropped (the next version's
    # load refills them, the cheaper choice here: every version is loaded anyway); 0: off.
    sleep_level: int = 0
    # "module:Class": a subclass of TorchRL's vLLMWrapper (TransformersWrapper with backend transformers) that the
    # rollouts sample with, built as the engine's own policy is plus policy_kwargs (null: the wrapper itself)
    policy_class: str | None = None
    policy_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check(self.workers >= 1, "rollout.workers", "must be >= 1", self.workers)
        _check(
            self.sleep_level in (0, 1, 2),
            "rollout.sleep_level",
            "must be 0 (off), 1 or 2 (vLLM's sleep levels)",
            self.sleep_level,
        )
        if self.sleep_level:
            _check(
                self.backend == "vllm",
                "rollout.sleep_level",
                "needs rollout.backend=vllm (vLLM's sleep mode); set it to 0",
                self.sleep_level,
            )
            _check(
                self.max_staleness == 0,
                "rollout.sleep_level",
                f"needs a synchronous run (rollout.max_staleness=0, not {self.max_staleness}): with rollouts "
                "overlapping training the engine is never idle while the trainer trains",
                self.sleep_level,
            )
        _check(
            isinstance(self.agent_concurrency, int) and self.agent_concurrency >= 1,
            "rollout.agent_concurrency",
            "must be an integer >= 1 (agent episodes at once per engine)",
            self.agent_concurrency,
        )
        _check(
            isinstance(self.agent_timeout_s, int | float)
            and math.isfinite(self.agent_timeout_s)
            and self.agent_timeout_s > 0,
            "rollout.agent_timeout_s",
            "must be > 0 (seconds one agent episode may take)",
            self.agent_timeout_s,
        )
        _check(
            isinstance(self.max_failed_fraction, int | float) and 0 <= self.max_failed_fraction <= 1,
            "rollout.max_failed_fraction",
            "must be in [0, 1] (the share of a batch's agent episodes that may fail)",
            self.max_failed_fraction,
        )
        _check(
            self.tensor_parallel_size >= 1,
            "rollout.tensor_parallel_size",
            "must be >= 1 (GPUs per engine)",
            self.tensor_parallel_size,
        )
        if self.gpu_memory_utilization is not None:
            _check(
                isinstance(self.gpu_memory_utilization, int | float)
                and math.isfinite(self.gpu_memory_utilization)
                and 0 < self.gpu_memory_utilization <= 1,
                "rollout.gpu_memory_utilization",
                "must be in (0, 1] (vLLM's fraction of each GPU's memory per engine) or null (engine default)",
                self.gpu_memory_utilization,
            )
        _check(
            self.backend in ("vllm", "transformers"), "rollout.backend", "must be vllm or transformers", self.backend
        )
        if self.backend == "transformers":
            _check(
                self.weight_sync in ("auto", "checkpoint", "cuda_ipc"),
                "rollout.weight_sync",
                "must be auto, checkpoint or cuda_ipc with rollout.backend=transformers (it joins no broadcast "
                "group; NCCL and gloo need the vLLM engine)",
                self.weight_sync,
            )
            _check(
                self.tensor_parallel_size == 1,
                "rollout.tensor_parallel_size",
                "must be 1 with rollout.backend=transformers (one model per engine; tensor parallelism needs vllm)",
                self.tensor_parallel_size,
            )
        _check(self.threads >= 0, "rollout.threads", "must be >= 0 (0: the cores / rollout.workers)", self.threads)
        _check(self.max_staleness >= 0, "rollout.max_staleness", "must be >= 0 (0: synchronous)", self.max_staleness)
        _check(self.dtype in ENGINE_DTYPES, "rollout.dtype", f"must be one of {list(ENGINE_DTYPES)}", self.dtype)
        _check(self.kv_cache_gb > 0, "rollout.kv_cache_gb", "must be > 0", self.kv_cache_gb)
        _check(self.max_new_tokens >= 1, "rollout.max_new_tokens", "must be >= 1", self.max_new_tokens)
        _check(
            math.isfinite(self.temperature) and self.temperature > 0,
            "rollout.temperature",
            "must be > 0 (GRPO samples a group per prompt; the trainer divides its logits by it)",
            self.temperature,
        )
        _check(0 < self.top_p <= 1, "rollout.top_p", "must be in (0, 1]", self.top_p)
        _check(
            self.max_model_len > self.max_new_tokens,
            "rollout.max_model_len",
            f"must exceed rollout.max_new_tokens ({self.max_new_tokens})",
            self.max_model_len,
        )


@dataclass
class TISConfig:
    """Off-policy correction against the sampler's log-probs (truncated / masked importance sampling).

    With ``cap`` set, the PPO ratio is taken against the trainer's own behaviour log-probs and each token (or,
    at ``level: sequence``, each row) is weighted by ``min(pi_trainer / pi_sampler, cap)`` (``mode: truncate``,
    TIS) or dropped when that ratio exceeds ``cap`` (``mode: mask``, masked IS). ``cap: null`` turns it off.
    """

    cap: float | None = None  # importance-weight cap (null: off)
    mode: Literal["truncate", "mask"] = "truncate"  # truncate: weight min(ratio, cap); mask: drop above cap
    level: Literal["token", "sequence"] = "token"  # one ratio per token, or per row (sequence)

    def __post_init__(self) -> None:
        if self.cap is not None:
            _check(math.isfinite(self.cap) and self.cap > 0, "train.tis.cap", "must be > 0 (or null: off)", self.cap)


@dataclass
class LoraConfig:
    """LoRA adapters on the trainer (peft); published weights are the merged model."""

    enabled: bool = False  # train LoRA adapters instead of every weight
    r: int = 16  # adapter rank
    alpha: int = 32  # LoRA scaling numerator (scale = alpha / r)
    dropout: float = 0.0  # dropout on the adapters
    # the linear layers that get adapters
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )

    def __post_init__(self) -> None:
        _check(self.r >= 1, "train.lora.r", "must be >= 1", self.r)
        _check(self.alpha >= 1, "train.lora.alpha", "must be >= 1", self.alpha)
        _check(0 <= self.dropout < 1, "train.lora.dropout", "must be in [0, 1)", self.dropout)
        _check(bool(self.target_modules), "train.lora.target_modules", "must name at least one module", [])


@dataclass
class TrainConfig:
    """The trainer: GRPO loss options, advantages, KL, off-policy correction, optimizer, placement.

    Loss menu (``llmrl_core.objectives.grpo_loss``): ``objective`` ppo | cispo; ``clip_epsilon`` with an
    optional ``clip_epsilon_high`` (DAPO's clip-higher); ``aggregation`` token_mean | prompt_mean |
    sequence_sum (Dr.GRPO's constant normaliser, ``rollout.max_new_tokens``); ``importance_level`` token |
    sequence (GSPO); ``entropy_coeff``; ``tis`` (off-policy correction). ``advantage`` grpo | dr_grpo | rloo.
    KL to the reference model (``kl_coef > 0``): in the loss (``kl_in: loss``) or subtracted from the reward
    before advantages (``kl_in: reward``, TorchRL's ``KLRewardTransform``). ``agreement_warn``: the flow logs a
    warning when the mean |trainer - sampler| log-prob gap before the first step of an iteration exceeds it;
    with ``agreement_stop`` it stops the run there instead (the version just trained is not published).
    """

    lr: float = 5e-6  # AdamW learning rate
    # a resume whose optimizer/RNG state is missing is an error; true: resume from the weights with a fresh optimizer
    resume_without_state: bool = False
    steps_per_iteration: int = 1  # optimizer steps on each iteration's batch
    objective: Literal["ppo", "cispo"] = "ppo"
    clip_epsilon: float = 0.2
    clip_epsilon_high: float | None = None  # None: symmetric clip
    importance_level: Literal["token", "sequence"] = "token"
    advantage: Literal["grpo", "dr_grpo", "rloo"] = "grpo"
    kl_coef: float = 0.0  # weight of the KL to the reference model (0: no reference model)
    kl_in: Literal["loss", "reward"] = "loss"  # the KL as a loss term, or subtracted from the reward before advantages
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"  # Schulman's k1, k2 or k3 estimator of the KL
    aggregation: Literal["token_mean", "prompt_mean", "sequence_sum"] = "token_mean"
    entropy_coeff: float = 0.0
    tis: TISConfig = field(default_factory=TISConfig)
    max_grad_norm: float = 1.0  # gradient clipping norm
    # Train only on groups whose rewards differ: an all-equal group has zero advantage, so it adds no policy
    # gradient, only tokens to the token-mean (diluting the rest) and compute. With kl_coef > 0 those groups
    # would still pull towards the reference; they are dropped all the same. Rows stay in the store.
    skip_zero_signal_groups: bool = False
    # With skip_zero_signal_groups, true: skipping saves the left-out groups' compute and changes nothing else: the
    # update is the one training every row gives (TRL's): their tokens count in the loss's mean, and a version with
    # no signal still takes the optimizer's step on zero gradients (AdamW moves along its momentum). With kl_coef or
    # entropy_coeff > 0 those rows have a gradient: every row is then trained (no saving). False: the mean is over
    # the trained groups' tokens alone, and a version with no signal leaves the weights and the optimizer as they were.
    exact_skip: bool = False
    token_budget: int = 2048  # tokens per packed micro-batch: bounds the (tokens x vocab) logits memory
    mixed_precision: Literal["auto", "bf16", "no"] = "auto"  # auto: bf16 autocast where bf16 is native (as dtype)
    gradient_checkpointing: bool = False  # recompute activations in the backward pass (less memory, slower)
    lora: LoraConfig = field(default_factory=LoraConfig)
    agreement_warn: float = 0.1
    agreement_stop: bool = False  # true: a gap over agreement_warn stops the run (the trained version unpublished)
    threads: int = 0  # torch threads on the trainer worker (0: all cores)
    device: str = "auto"  # "auto" | "cpu" | "cuda"; a GPU trainer is placed on a worker with resource GPU=1
    # trainer ranks, one per Dask worker: each trains on its token-balanced shard of the batch and the gradients
    # are summed over a torch.distributed group (gloo on CPU, NCCL on GPU); rank 0 publishes the weights
    data_parallel: int = 1
    # "module:Class": a GRPOLoss subclass the trainer optimizes (built with this section's loss options plus
    # loss_kwargs); null: GRPOLoss
    loss_class: str | None = None
    loss_kwargs: dict[str, Any] = field(default_factory=dict)
    # "module:Class": an MCAdvantage subclass that gives the rows their advantages (built with method=advantage plus
    # advantage_kwargs, called on each batch's returns and group ids); null: MCAdvantage
    advantage_class: str | None = None
    advantage_kwargs: dict[str, Any] = field(default_factory=dict)
    # "module:Class": a RetrieveLogProb subclass the reference stage runs on the reference model (kl_coef > 0;
    # built with assistant_only=False, log_probs_full_key=("ref_log_probs", "full") plus kl_transform_kwargs);
    # null: RetrieveLogProb
    kl_transform_class: str | None = None
    kl_transform_kwargs: dict[str, Any] = field(default_factory=dict)
    # "module:Class": a KLComputation subclass that takes the KL out of the rewards (kl_in: reward; built with
    # coeff=kl_coef plus kl_reward_kwargs, run on each batch's response tokens); null: KLComputation
    kl_reward_class: str | None = None
    kl_reward_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check(math.isfinite(self.lr) and self.lr > 0, "train.lr", "must be > 0", self.lr)
        _check(self.data_parallel >= 1, "train.data_parallel", "must be >= 1", self.data_parallel)
        _check(self.steps_per_iteration >= 1, "train.steps_per_iteration", "must be >= 1", self.steps_per_iteration)
        _check(0 <= self.clip_epsilon < 1, "train.clip_epsilon", "must be in [0, 1)", self.clip_epsilon)
        if self.clip_epsilon_high is not None:
            _check(self.clip_epsilon_high >= 0, "train.clip_epsilon_high", "must be >= 0", self.clip_epsilon_high)
        _check(math.isfinite(self.kl_coef) and self.kl_coef >= 0, "train.kl_coef", "must be >= 0", self.kl_coef)
        _check(self.entropy_coeff >= 0, "train.entropy_coeff", "must be >= 0", self.entropy_coeff)
        _check(self.max_grad_norm > 0, "train.max_grad_norm", "must be > 0", self.max_grad_norm)
        _check(self.token_budget >= 16, "train.token_budget", "must be >= 16", self.token_budget)
        _check(self.agreement_warn > 0, "train.agreement_warn", "must be > 0", self.agreement_warn)
        _check(self.threads >= 0, "train.threads", "must be >= 0 (0: all cores)", self.threads)
        _check(self.device in ("auto", "cpu", "cuda"), "train.device", "must be 'auto', 'cpu' or 'cuda'", self.device)

    def loss_options(self, max_new_tokens: int) -> dict[str, Any]:
        """The :class:`~llmrl_core.objectives.GRPOLoss` keyword options this config selects."""
        clip: float | tuple[float, float] = self.clip_epsilon
        if self.clip_epsilon_high is not None:
            clip = (self.clip_epsilon, self.clip_epsilon_high)
        options: dict[str, Any] = dict(
            clip_epsilon=clip,
            objective=self.objective,
            aggregation=self.aggregation,
            entropy_coeff=self.entropy_coeff,
            kl_estimator=self.kl_estimator,
            importance_level=self.importance_level,
        )
        if self.aggregation == "sequence_sum":
            options["norm_constant"] = float(max_new_tokens)
        if self.kl_coef > 0 and self.kl_in == "loss":
            options["kl_to_ref_coeff"] = self.kl_coef
        if self.tis.cap is not None:
            options.update(tis_cap=self.tis.cap, tis_mode=self.tis.mode, tis_level=self.tis.level)
        return options


@dataclass
class FinalEvalConfig:
    """A held-out evaluation at the end of the run: the base model (version 0) against the last version, greedy,
    on the first ``questions`` problems of ``task.eval_source`` (0 turns it off). The result is printed as
    "held-out accuracy a -> b (± s.e.)" and written like ``llmrl run evaluate``'s report."""

    questions: int = 0
    samples: int = 0  # sampled answers per question at rollout.temperature (0: greedy only)

    def __post_init__(self) -> None:
        if self.questions < 0 or self.samples < 0:
            raise ValueError("final_eval.questions and final_eval.samples must be >= 0")


@dataclass
class DaskConfig:
    """Where the stages run: a LocalCluster (rollout workers + 1 trainer) or an existing scheduler, and the flows'
    healing: after a lost worker (dead, or silent past its limit) the run starts again on new workers (a fresh local
    cluster; on a joined cluster, the workers it has then, waiting up to ``join_wait_s`` for a replacement with the
    lost worker's resources) and resumes from its last committed version, at most ``restarts`` times (0: stop at the
    first lost worker)."""

    address: str | None = None  # e.g. tcp://127.0.0.1:8786; workers declare resources ROLLOUT / TRAINER or GPU
    local_directory: str | None = None  # the Dask workers' scratch folder (default: under the run folder)
    restarts: int = 2
    join_wait_s: float = 120.0  # with `address`: how long a run (or its restart) waits for the workers it needs

    def __post_init__(self) -> None:
        _check(
            isinstance(self.restarts, int) and self.restarts >= 0,
            "dask.restarts",
            "must be an integer >= 0 (new attempts after a lost worker)",
            self.restarts,
        )
        _check(
            self.join_wait_s >= 0,
            "dask.join_wait_s",
            "must be >= 0 (seconds to wait for the joined cluster's workers)",
            self.join_wait_s,
        )


@strict_config  # the run form's schema describes every setting; unknown keys are refused
@dataclass
class GRPOConfig:
    """A GRPO run: model, data, rollouts, training, iterations, storage and tracking."""

    run_id: str = "grpo-demo"  # the run: its folder, its MLflow run; the same run_id again resumes it
    model: str = "default"  # "default" (packaged SmolLM2-135M-Instruct), a folder or an `llmrl models` name
    iterations: int = 3  # policy versions to train (the run's last version number)
    seed: int = 0  # seeds the prompt order, the sampling and the trainer's RNG
    runs_dir: str | None = None  # default $LLMRL_HOME/runs
    tracking_uri: str | None = None  # default: one sqlite store per runs root (<runs_dir>/mlflow.db)
    keep_checkpoints: int = 3  # the newest N checkpoints are kept...
    keep_every: int | None = None  # ...plus every version divisible by this (e.g. 10, for evaluation curves)
    data: DataConfig = field(default_factory=DataConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    init: InitConfig = field(default_factory=InitConfig)  # a new run's start: the model, or RUN@V (a fork)
    dask: DaskConfig = field(default_factory=DaskConfig)
    final_eval: FinalEvalConfig = field(default_factory=FinalEvalConfig)
    progress: bool = True  # progress bars: iterations (flow), rollout prompts (vLLM), train micro-batches

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ValueError(
                f"iterations={self.iterations}: must be >= 1 (the run's last version; version 0 is the base model, "
                "which trains nothing): to sample or score the base model, use `llmrl run collect`"
            )
        from llmrl_core.objectives import GRPOLoss
        from llmrl_core.pipeline.components import check_components

        validate_env_config(self.env)  # names, import paths and options: before any engine starts
        check_components(self)  # the module:Class settings: importable, of the right base
        self._env_defaults()
        if self.rollout.backend == "transformers" and (self.env.agent or self.env.verifiers):
            route = "env.agent" if self.env.agent else "env.verifiers"
            raise ValueError(
                f"rollout.backend: transformers cannot serve {route}: agents talk to the engine's OpenAI-compatible "
                "endpoint, which the vLLM engine serves; use rollout.backend=vllm"
            )
        _check(
            self.keep_checkpoints > self.rollout.max_staleness,
            "keep_checkpoints",
            f"must exceed rollout.max_staleness ({self.rollout.max_staleness}): a resume re-samples the unpublished "
            "batches with the checkpoints that sampled them",
            self.keep_checkpoints,
        )

        try:  # the loss validates its own options: a bad combination fails here, before any engine starts
            GRPOLoss(None, **self.train.loss_options(self.rollout.max_new_tokens))
        except (TypeError, ValueError) as err:
            raise ValueError(f"train: {err}") from err

    def _env_defaults(self) -> None:
        """An env that brings its own prompts (``reasoning_gym``, ``countdown``, ``env.verifiers``) replaces the GSM8K
        defaults it would otherwise inherit: the prompt sources and the GSM8K prompt format. Settings the user gave
        are kept."""
        if self.env.verifiers:  # the verifiers env's own datasets (docs/verifiers.md)
            if self.data.source == DataConfig.source:
                self.data.source = "verifiers:train"
            if self.task.eval_source == TaskConfig.eval_source:
                self.task.eval_source = "verifiers:eval"
            return
        if self.env.factory is not None or self.env.name not in ("reasoning_gym", "countdown"):
            return
        from llmrl_core.envs.countdown import COUNTDOWN_SYSTEM_PROMPT
        from llmrl_core.envs.gsm8k import GSM8K_QUESTION_TEMPLATE, GSM8K_SYSTEM_PROMPT
        from llmrl_core.envs.reasoning_gym_env import REASONING_GYM_SYSTEM_PROMPT

        name = self.env.name
        if self.data.source == DataConfig.source:
            self.data.source = f"{name}:train"
        if self.task.eval_source == TaskConfig.eval_source:
            self.task.eval_source = f"{name}:test"
        if self.task.system_prompt == GSM8K_SYSTEM_PROMPT:
            own = {"reasoning_gym": REASONING_GYM_SYSTEM_PROMPT, "countdown": COUNTDOWN_SYSTEM_PROMPT}
            self.task.system_prompt = own[name]
        if self.task.question_template == GSM8K_QUESTION_TEMPLATE:
            self.task.question_template = None
