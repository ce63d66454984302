"""The GRPO train step vs TRL's GRPOTrainer (target P2): tokens/s of ours ÷ TRL's, same batch, model and dtype.

Usage: ``.venv/bin/python bench/bench_train_vs_trl.py [--prompts 6] [--group-size 4] [--max-new-tokens 32]
[--dtype bf16|fp32] [--repeats 3]``

The batch is the flows' own: the main job's task (two-digit addition, ``llmrl_cli/main_job.yaml``) rolled out by
the rollout actor with the packaged SmolLM2-135M-Instruct (in a child process, so that no vLLM state lingers in
the process that times the steps), group advantages by the ``advantages`` stage. Both sides then train on these
exact token ids, advantages and sampling temperature; no generation is timed.

- Ours: the trainer of the flows (``runtime.trainer_actor.TrainerWorker``, built from the same config: GRPO loss,
  token-mean, clip 0.2, no KL, no entropy term, AdamW, grad-norm clip 1.0, packed micro-batches under
  ``train.token_budget``), one ``Trainer.train_step`` on all rows.
- TRL: ``trl.GRPOTrainer`` (transformers backend, TRL 1.x) in its own venv (``bench/.venv-trl``, created here
  on first use with ``python -m venv`` + ``pip install trl``, pinned to this venv's torch / transformers /
  accelerate versions), driven by ``bench/_trl_side.py``: TRL's real training loop, with
  ``_generate_and_score_completions`` returning the stored batch. Settings: ``loss_type="dapo"`` (token mean
  over the batch's completion tokens, which is ours ``token_mean`` for one micro-batch), ``epsilon=0.2``,
  ``beta=0``, the whole batch in one micro-batch, no gradient checkpointing (TRL's default is on), dropout off,
  the same temperature, learning rate and grad-norm clip, TRL's default optimizer (fused AdamW).
- dtype: ``bf16`` is bf16 autocast over fp32 weights on both sides (ours ``train.mixed_precision=bf16``, TRL
  ``bf16=True``); ``fp32`` is no autocast on either side.

Tokens/s counts the real tokens of the batch (prompt + response, no padding) on both sides. Rounds alternate
(ours, TRL, ours with zero-signal groups skipped) after one untimed warm-up of each; TRL's process waits idle
while ours runs. Reported separately: ours with ``train.skip_zero_signal_groups`` (the main job's setting: the
rows of all-equal-reward groups are not trained; tokens/s counted over the whole batch), and the padding that
TRL's layout adds (ours packs samples into one padding-free row per micro-batch).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for _path in (REPO, REPO / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from _machine import load_line, machine_line  # noqa: E402

TRL_VENV = REPO / "bench" / ".venv-trl"
TRL_SIDE = REPO / "bench" / "_trl_side.py"
# The packages that decide the numbers are pinned to this venv's; datasets is not (TRL only reads its rows with
# it, and TRL 1.x needs a newer one than this venv may hold).
PINNED = ("torch", "transformers", "accelerate", "tokenizers", "safetensors", "huggingface-hub", "numpy")


def config(args: argparse.Namespace, run_id: str = "bench-train-vs-trl"):
    from llmrl_cli.run import MAIN_JOB
    from llmrl_core.pipeline.config_io import load_config
    from llmrl_core.pipeline.grpo_config import GRPOConfig

    return load_config(
        GRPOConfig,
        MAIN_JOB,
        [
            f"run_id={run_id}",
            f"data.prompts_per_iteration={args.prompts}",
            f"data.group_size={args.group_size}",
            f"rollout.max_new_tokens={args.max_new_tokens}",
            f"train.mixed_precision={'bf16' if args.dtype == 'bf16' else 'no'}",
            "progress=false",
            *([f"train.token_budget={args.token_budget}"] if args.token_budget else []),
        ],
    )


def generate(args: argparse.Namespace, out: Path) -> None:
    """Child-process mode: one rollout stage + the advantages stage, written to ``out`` as JSON rows."""
    from llmrl_core.model_store import resolve_model
    from llmrl_core.modules.backends.vllm.engine import shutdown_llm
    from runtime.records import logprob_temperature
    from runtime.rollout_actor import RolloutWorker
    from storage.trajectories import TrajectoryStore
    from tasks.grpo_stages import assign_advantages, load_prompts

    cfg = config(args)
    worker = RolloutWorker(cfg, resolve_model(cfg.model))
    staging = tempfile.mkdtemp(prefix="bench-train-vs-trl-")
    rows, _ = load_prompts.fn(cfg, None)
    worker.rollout(rows, 0, staging, 0)
    records = TrajectoryStore(staging).read_records(cfg.run_id, version=0)
    assign_advantages(cfg, records)
    shutdown_llm(worker.worker.llm)
    shutil.rmtree(staging, ignore_errors=True)
    rows_out = [
        {
            "prompt_tokens": r.prompt_tokens,
            "response_tokens": r.response_tokens,
            "response_mask": r.response_mask,
            "sampler_logprobs": r.sampler_logprobs,
            "advantage": r.advantage,
            "reward": r.reward,
            "group_id": r.group_id,
            "sample_index": r.sample_index,
            "temperature": logprob_temperature(r),
        }
        for r in records
    ]
    out.write_text(json.dumps(rows_out))


def ensure_trl_venv() -> Path:
    """``bench/.venv-trl/bin/python`` with TRL installed, pinned to this venv's torch/transformers versions."""
    python = TRL_VENV / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import trl"], capture_output=True).returncode == 0:
        return python
    print(f"creating {TRL_VENV} (python -m venv + pip install trl, pinned to this venv's torch/transformers)")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(TRL_VENV)], check=True)
    freeze = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    pins = [line for line in freeze if "==" in line and line.split("==")[0].lower().replace("_", "-") in PINNED]
    constraints = TRL_VENV / "constraints.txt"
    constraints.write_text("\n".join(pins) + "\n")
    pip = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "-c", str(constraints), "trl>=1,<2"],
        capture_output=True,
        text=True,
    )
    if pip.returncode != 0:
        print(pip.stdout[-3000:], pip.stderr[-3000:], sep="\n")
        raise SystemExit(f"pip install trl into {TRL_VENV} failed (exit {pip.returncode})")
    return python


class TRLSide:
    """The TRL subprocess, paced one step at a time (see ``bench/_trl_side.py``)."""

    def __init__(self, python: Path, data: Path, model: str, steps: int, dtype: str, log: Path) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": ""}
        self.log = log
        self.proc = subprocess.Popen(
            [
                str(python),
                str(TRL_SIDE),
                "--data",
                str(data),
                "--model",
                model,
                "--steps",
                str(steps),
                "--dtype",
                dtype,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log.open("w"),
            text=True,
            env=env,
        )
        self.logs: list[dict] = []
        self.setup = self.wait("setup")
        self.wait("ready")

    def wait(self, event: str) -> dict:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.startswith("@@"):
                continue
            message = json.loads(line[2:])
            if message["event"] == "log":
                self.logs.append(message)
            if message["event"] == event:
                return message
        raise RuntimeError(f"TRL side exited (rc {self.proc.wait()}) before {event!r}; see {self.log}")

    def step(self, last: bool) -> float:
        """One timed TRL optimizer step; returns its seconds once the side is idle again."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        seconds = self.wait("step")["seconds"]
        self.wait("done" if last else "ready")
        return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--token-budget", type=int, default=0, help="ours: train.token_budget (0: the main job's)")
    parser.add_argument("--keep", action="store_true", help="keep the batch and the TRL side's log (path printed)")
    parser.add_argument("--generate-only", type=Path, help=argparse.SUPPRESS)  # child-process mode
    args = parser.parse_args()
    if args.generate_only is not None:
        generate(args, args.generate_only)
        return

    print(machine_line())
    print(load_line())
    python = ensure_trl_venv()
    work = Path(tempfile.mkdtemp(prefix="bench-train-vs-trl-"))
    t0 = time.perf_counter()
    rows_path = work / "rows.json"
    child = [sys.executable, __file__, "--generate-only", str(rows_path)]
    child += ["--prompts", str(args.prompts), "--group-size", str(args.group_size)]
    child += ["--max-new-tokens", str(args.max_new_tokens), "--dtype", args.dtype]
    child += ["--token-budget", str(args.token_budget)]
    subprocess.run(child, check=True, stdout=subprocess.DEVNULL, stderr=(work / "generate.log").open("w"))
    rows = json.loads(rows_path.read_text())
    seconds = time.perf_counter() - t0
    print(f"batch: {len(rows)} rollouts of the main job's task generated by the rollout actor ({seconds:.0f} s)")
    if not all(all(r["response_mask"]) for r in rows):
        raise SystemExit("the batch has non-trained response tokens (tool turns): TRL's layout would differ")

    import torch

    from llmrl_core.model_store import resolve_model
    from llmrl_core.trainer.batch import TrainSample
    from runtime.trainer_actor import TrainerWorker
    from storage.layout import RunLayout

    cfg = config(args)
    model_path = resolve_model(cfg.model)
    samples = [
        TrainSample(
            r["prompt_tokens"],
            r["response_tokens"],
            response_mask=r["response_mask"],
            sampler_logprobs=r["sampler_logprobs"],
            advantage=r["advantage"],
            temperature=r["temperature"],
            sample_id=f"{r['group_id']}#{r['sample_index']}",
        )
        for r in rows
    ]
    rewards: dict[str, set[float]] = {}
    for r in rows:
        rewards.setdefault(r["group_id"], set()).add(r["reward"])
    signal = [s for s, r in zip(samples, rows, strict=True) if len(rewards[r["group_id"]]) > 1]
    tokens = sum(s.length for s in samples)
    response_tokens = sum(len(s.response_ids) for s in samples)
    temperatures = {s.temperature for s in samples}
    if len(temperatures) != 1:
        raise SystemExit(f"rows with several temperatures {temperatures}")
    t = cfg.train
    data = {
        "prompts": [r["prompt_tokens"] for r in rows],
        "completions": [r["response_tokens"] for r in rows],
        "advantages": [r["advantage"] for r in rows],
        "group_size": cfg.data.group_size,
        "max_completion_length": cfg.rollout.max_new_tokens,
        "temperature": temperatures.pop(),
        "lr": t.lr,
        "max_grad_norm": t.max_grad_norm,
        "clip_epsilon": t.clip_epsilon,
    }
    batch_path = work / "batch.json"
    batch_path.write_text(json.dumps(data))
    padded = len(rows) * (max(len(r["prompt_tokens"]) for r in rows) + max(len(r["response_tokens"]) for r in rows))
    print(
        f"{len(rows)} sequences ({args.prompts} prompts x {args.group_size}), {tokens} tokens "
        f"({response_tokens} response tokens, {tokens / len(rows):.0f} per sequence); TRL's padded layout "
        f"{padded} positions (+{100 * (padded / tokens - 1):.0f}% padding); {len(signal)} rows in groups with "
        f"signal; dtype {args.dtype} ({'bf16 autocast, fp32 weights' if args.dtype == 'bf16' else 'float32'})"
    )

    steps = 1 + args.repeats
    trl_side = TRLSide(python, batch_path, model_path, steps, args.dtype, work / "trl.log")
    s = trl_side.setup
    print(
        f"TRL {s['trl']} (torch {s['torch']}, transformers {s['transformers']}, {s['threads']} threads, {s['optim']}); "
        f"ours: torch {torch.__version__}, token_budget {t.token_budget}"
    )
    ours = TrainerWorker(cfg, model_path, RunLayout(cfg.run_id, work / "runs")).trainer
    print(f"ours: {torch.get_num_threads()} threads, mixed_precision={ours.config.mixed_precision}")

    times: dict[str, list[float]] = {"ours": [], "trl": [], "ours-skip": []}
    first: dict[str, dict] = {}

    def run_ours(batch: list) -> tuple[float, dict]:
        start = time.perf_counter()
        metrics = ours.train_step(batch)
        return time.perf_counter() - start, metrics

    _, first["ours"] = run_ours(samples)  # warm-ups (not timed)
    trl_side.step(last=False)
    if signal:
        run_ours(signal)
    for rep in range(args.repeats):
        times["ours"].append(run_ours(samples)[0])
        times["trl"].append(trl_side.step(last=rep == args.repeats - 1))
        if signal:
            times["ours-skip"].append(run_ours(signal)[0])
    trl_side.proc.wait(timeout=120)
    trl_first = next((m for m in trl_side.logs if "grad_norm" in m), {})
    print(
        f"first step (same weights, same batch): grad norm ours {first['ours']['grad_norm']:.3f} vs TRL "
        f"{trl_first.get('grad_norm', float('nan')):.3f}; loss ours {first['ours']['loss']:.4f} vs TRL "
        f"{trl_first.get('loss', float('nan')):.4f} (ours: ratio to the sampler's log-probs; TRL: to its own)"
    )
    print(f"{'side':10} {'min s':>8} {'median s':>9} {'tokens/s (med)':>15} {'tokens/s (best)':>16}")
    rate = {}
    for side, label in (("ours", "ours"), ("trl", "TRL"), ("ours-skip", "ours-skip")):
        if not times[side]:
            continue
        med, best = statistics.median(times[side]), min(times[side])
        rate[side] = (tokens / med, tokens / best)
        print(f"{label:10} {best:8.2f} {med:9.2f} {rate[side][0]:15.1f} {rate[side][1]:16.1f}")
    print(
        f"P2 train-step tokens/s ratio ours/TRL ({args.dtype}, like for like: all {len(rows)} rows): "
        f"median {rate['ours'][0] / rate['trl'][0]:.2f}, best {rate['ours'][1] / rate['trl'][1]:.2f} (target >= 1.3)"
    )
    if "ours-skip" in rate:
        print(
            f"with zero-signal groups skipped ({len(signal)}/{len(rows)} rows trained, batch tokens/s): ours/TRL "
            f"median {rate['ours-skip'][0] / rate['trl'][0]:.2f}, best {rate['ours-skip'][1] / rate['trl'][1]:.2f}; "
            f"skip gain over ours {rate['ours-skip'][0] / rate['ours'][0]:.2f}x"
        )
    from _roofline import share_of_peak

    dtype = "bfloat16" if args.dtype == "bf16" else "float32"
    for side, label in (("ours", "ours"), ("trl", "TRL")):
        line = share_of_peak(model_path, rate[side][1], dtype, training=True)
        print(f"of the machine ({label}, best step, all {tokens} tokens): {line}")
    print(load_line())
    if args.keep:
        print(f"kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
