"""Time to accuracy: llmrl's main job against ``trl.GRPOTrainer`` on the same task, held-out accuracy per minute.

Usage: ``.venv/bin/python bench/bench_time_to_accuracy.py [--steps 10] [--llmrl-steps 16] [--eval-questions 200]
[--out DIR] [--seed 0] [--keep]``

Both sides train the main job's task (two-digit addition, the packaged SmolLM2-135M-Instruct, 8 prompts x 8
samples, 32 new tokens, temperature 0.7, lr 1e-5, clip 0.2, no KL, bf16 autocast where the CPU has bf16, fp32 on
both sides where it has not) for ``--steps`` optimizer steps (llmrl goes on to ``--llmrl-steps``, so that its curve
covers TRL's wall-clock window and the time it needs to reach TRL's final accuracy is measured, not extrapolated),
one after the other on the same cores:

- llmrl: ``llmrl run grpo`` (the main job as a user runs it, no held-out evaluation at the end, every version's
  checkpoint kept). A version's time is when its commit marker was written, counted from the command's start.
- TRL: ``trl.GRPOTrainer`` (TRL 1.x in ``bench/.venv-trl``, created on first use), generating with
  transformers ``generate`` (see bench/README: TRL's vLLM colocate mode is not supported with the vLLM CPU
  build here), on the same prompts in the order llmrl served them, rewarded by llmrl's own parser (the TRL
  process asks this one), ``loss_type="dapo"`` (token mean), ``scale_rewards="group"``, ``beta=0``. A step's
  time is its end on the wall clock, counted from the process's start, less the time spent writing the
  weights for the evaluation.

Then every version of both sides (and the base model, at time 0) is scored by one evaluator: the same vLLM
engine, greedy, on the same first ``--eval-questions`` problems of the held-out split, with the task's prompt
format (the evaluate flow's ``evaluate_gsm8k``). The script prints the table (accuracy ± standard error per
step for both, their times), the time each side needs to reach TRL's final accuracy (and a few lower levels)
and the ratios, and writes the plot ``OUT/time_to_accuracy.png`` and the rows ``OUT/time_to_accuracy.json``.
The weights (~0.5 GB per version on each side) are deleted after scoring unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # the evaluation engine's per-load chatter
REPO = Path(__file__).resolve().parent.parent
for _path in (REPO, REPO / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from _machine import load_line, machine_line  # noqa: E402
from bench_train_vs_trl import ensure_trl_venv  # noqa: E402

TRL_SIDE = REPO / "bench" / "_trl_tta_side.py"
RUN_ID = "bench-time-to-accuracy"


def main_job() -> dict[str, Any]:
    """The main job's settings (``llmrl run grpo`` without ``--config``)."""
    import yaml

    from llmrl_cli.run import MAIN_JOB

    return yaml.safe_load(MAIN_JOB.read_text())


def run_llmrl(
    steps: int, runs_dir: Path, log: Path, seed: int, overrides: list[str] | None = None
) -> tuple[float, float]:
    """``llmrl run grpo`` for ``steps`` versions with ``seed`` (and ``--set`` ``overrides``); returns (start, end)
    on the wall clock."""
    if runs_dir.exists():
        shutil.rmtree(runs_dir)
    command = [
        str(REPO / ".venv" / "bin" / "llmrl"),
        "run",
        "grpo",
        "--set",
        f"run_id={RUN_ID}",
        "--set",
        f"runs_dir={runs_dir}",
        "--set",
        f"iterations={steps}",
        "--set",
        f"keep_checkpoints={steps + 1}",
        "--set",
        "final_eval.questions=0",
        "--set",
        f"seed={seed}",
    ]
    for override in overrides or []:
        command += ["--set", override]
    print("llmrl:", " ".join(command[1:]), flush=True)
    env = {**os.environ, "LLMRL_VERBOSE": "0"}
    start = time.time()
    with log.open("w") as out:
        proc = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    end = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"llmrl run grpo failed (exit {proc.returncode}); its output: {log}")
    return start, end


def llmrl_versions(runs_dir: Path, start: float, steps: int) -> list[dict[str, Any]]:
    """Per version 1..steps: its commit time (seconds from the start) and the reward of the rollout it trained on."""
    from storage.layout import RunLayout

    state = RunLayout.for_runs_dir(RUN_ID, str(runs_dir)).run_dir / "state"
    rows = []
    for version in range(1, steps + 1):
        marker = state / f"published-v{version}.json"
        metrics = json.loads(marker.read_text())["metrics"]
        reward = metrics["reward_mean"]
        rows.append({"version": version, "time_s": marker.stat().st_mtime - start, "train_reward": reward})
    return rows


def served_prompts(runs_dir: Path, steps: int, source: str, tokenizer: Any) -> dict[str, list[str]]:
    """The prompts llmrl trained on, in its order (one per group, versions 0..steps-1), as chat-templated text,
    with their answer fields; checks that the text tokenizes back to the very ids llmrl's engine was given."""
    from llmrl_core.builtin_data.sources import load_source_rows
    from storage.layout import RunLayout
    from storage.trajectories import TrajectoryStore

    layout = RunLayout.for_runs_dir(RUN_ID, str(runs_dir))
    table = TrajectoryStore(layout.trajectories_uri).read_table(RUN_ID)
    rows = load_source_rows(source)
    seen: dict[tuple[int, int], tuple[int, list[int]]] = {}
    for record in table.select(["policy_version", "group_id", "prompt_id", "prompt_tokens"]).to_pylist():
        key = (int(record["policy_version"]), int(record["group_id"]))
        seen.setdefault(key, (int(record["prompt_id"]), list(record["prompt_tokens"])))
    prompts, answers, same = [], [], 0
    for version, group in sorted(seen):
        if version >= steps:
            continue
        prompt_id, ids = seen[(version, group)]
        text = tokenizer.decode(ids, skip_special_tokens=False)
        same += tokenizer(text, add_special_tokens=False)["input_ids"] == ids
        question = rows[prompt_id]["question"]
        if question not in text:
            raise SystemExit(f"prompt {prompt_id} of {source}: {question!r} is not in the prompt llmrl served")
        prompts.append(text)
        answers.append(str(rows[prompt_id]["answer"]))
    print(f"prompts: {len(prompts)} served by llmrl; {same} of them tokenize back to the same ids for TRL")
    return {"prompts": prompts, "answers": answers}


def run_trl(
    python: Path, task: dict[str, Any], model_dir: str, out: Path, steps: int, scorer: Any, dtype: str, seed: int
) -> dict:
    """TRL's side (``_trl_tta_side.py``, training in ``dtype``: ``bf16`` autocast or ``fp32``); answers its reward
    requests with ``scorer``; returns its steps and logs."""
    out.mkdir(parents=True, exist_ok=True)
    data = out / "task.json"
    data.write_text(json.dumps(task))
    command = [str(python), str(TRL_SIDE), "--data", str(data), "--model", model_dir, "--out", str(out)]
    command += ["--steps", str(steps), "--dtype", dtype, "--seed", str(seed)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": ""}
    print("TRL:", " ".join(command[1:]), flush=True)
    start = time.time()
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=out)
    assert proc.stdin is not None and proc.stdout is not None
    steps_seen: list[dict] = []
    logs: list[dict] = []
    setup: dict = {}
    saved = 0.0
    for line in proc.stdout:
        if not line.startswith("@@"):
            continue
        message = json.loads(line[2:])
        event = message.pop("event")
        if event == "score":
            rewards = [scorer(c, a) for c, a in zip(message["completions"], message["answers"], strict=True)]
            proc.stdin.write(json.dumps(rewards) + "\n")
            proc.stdin.flush()
        elif event == "step":
            steps_seen.append({"version": message["step"], "time_s": message["time"] - start - saved})
            saved += message["save_s"]
            print(f"  TRL step {message['step']}: {steps_seen[-1]['time_s']:.0f} s", flush=True)
        elif event == "log":
            logs.append(message)
        elif event == "setup":
            setup = message
    proc.wait()
    if proc.returncode != 0 or len(steps_seen) != steps:
        raise SystemExit(f"TRL's side failed (exit {proc.returncode}, {len(steps_seen)} of {steps} steps)")
    rewards = {int(m["step"]): m["reward"] for m in logs if "reward" in m}
    for row in steps_seen:
        row["train_reward"] = rewards.get(row["version"], math.nan)
    return {"steps": steps_seen, "setup": setup, "end_s": time.time() - start, "weights": out}


def evaluate_all(model_dir: str, weights: dict[str, dict[int, Any]], job: dict, questions: int) -> dict:
    """Greedy held-out accuracy ± s.e. of every ``weights[side][version]`` (a state dict, a safetensors path, a
    function returning a state dict, or None: the base model), all on one engine."""
    from llmrl_core.builtin_data.sources import load_source_rows
    from llmrl_core.evaluation.gsm8k_eval import evaluate_gsm8k
    from llmrl_core.model_store import base_state_dict
    from llmrl_core.modules.backends.types import EngineConfig, SamplingConfig
    from llmrl_core.modules.backends.vllm.worker import start_engine

    task = job["task"]
    rows = load_source_rows(task["eval_source"], limit=questions)
    if len(rows) < questions:
        raise SystemExit(f"{task['eval_source']}: {len(rows)} problems, fewer than --eval-questions {questions}")
    worker = start_engine(EngineConfig(model=model_dir, dtype=job["rollout"].get("dtype", "auto"), seed=0))
    sampling = SamplingConfig(max_new_tokens=job["rollout"]["max_new_tokens"], temperature=0.7, seed=0)
    scores: dict[str, dict[int, tuple[float, float]]] = {}
    for side, versions in weights.items():
        scores[side] = {}
        for version, state in versions.items():
            if state is None:
                state = base_state_dict(model_dir)
            elif callable(state):
                state = state()
            worker.load_weights(state, f"{side}-{version}")
            result = evaluate_gsm8k(
                worker,
                rows,
                n_samples=0,
                sampling=sampling,
                greedy=True,
                system_prompt=task.get("system_prompt"),
                question_template=task.get("question_template"),
                few_shot=task.get("few_shot") or (),
                format_reward=task["format_reward"],
                correct_reward=task["correct_reward"],
                task=task["eval_source"],
            )
            summary = result.summary()
            scores[side][version] = (summary["greedy/accuracy"], summary["greedy/accuracy_se"])
            print(f"  {side} version {version}: accuracy {scores[side][version][0]:.3f}", flush=True)
    return scores


def first_reaching(rows: list[dict], target: float) -> dict | None:
    """The first trained version (by time) whose accuracy reaches ``target``."""
    trained = sorted((r for r in rows if r["version"] > 0), key=lambda r: r["time_s"])
    return next((r for r in trained if r["accuracy"] >= target - 1e-9), None)


def plot(curves: dict[str, list[dict]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for side, rows in curves.items():
        minutes = [r["time_s"] / 60 for r in rows]
        ax.errorbar(
            minutes,
            [r["accuracy"] for r in rows],
            yerr=[r["accuracy_se"] for r in rows],
            marker="o",
            capsize=3,
            label=side,
        )
    ax.set_xlabel("wall-clock minutes from the command's start (start-up included, evaluation not)")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="TRL's optimizer steps (policy versions)")
    parser.add_argument("--llmrl-steps", type=int, default=16, help="llmrl's versions (>= --steps)")
    parser.add_argument("--keep", action="store_true", help="keep both sides' weights and llmrl's run folder")
    parser.add_argument("--eval-questions", type=int, default=200, help="held-out problems scored per version")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "time_to_accuracy")
    parser.add_argument(
        "--seed", type=int, default=0, help="both sides' seed (llmrl's `seed`: prompts served and sampling; TRL's)"
    )
    parser.add_argument(
        "--llmrl-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra `--set` for llmrl's run (repeatable), e.g. rollout.backend=transformers (TRL's sampler)",
    )
    args = parser.parse_args()
    if args.steps < 1 or args.eval_questions < 1 or args.llmrl_steps < args.steps:
        raise SystemExit("--steps and --eval-questions must be >= 1, --llmrl-steps >= --steps")
    from transformers import AutoTokenizer

    from llmrl_core.envs.gsm8k_reward import GSM8KRewardParser
    from llmrl_core.hardware import mixed_precision_for
    from llmrl_core.model_store import resolve_model

    print(machine_line(), load_line(), sep="\n")
    job = main_job()
    model_dir = str(resolve_model(job["model"]))
    args.out.mkdir(parents=True, exist_ok=True)
    trl_python = ensure_trl_venv()

    print(f"== llmrl: the main job for {args.llmrl_steps} versions", flush=True)
    runs_dir = args.out / "llmrl-runs"
    start, end = run_llmrl(args.llmrl_steps, runs_dir, args.out / "llmrl.log", args.seed, args.llmrl_set)
    ours = llmrl_versions(runs_dir, start, args.llmrl_steps)
    print(f"  llmrl: {end - start:.0f} s in all; versions at " + ", ".join(f"{r['time_s']:.0f}" for r in ours))

    print(f"== TRL: GRPOTrainer for {args.steps} steps on the same prompts", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    task = served_prompts(runs_dir, args.steps, job["data"]["source"], tokenizer)
    task.update(
        group_size=job["data"]["group_size"],
        prompts_per_step=job["data"]["prompts_per_iteration"],
        max_completion_length=job["rollout"]["max_new_tokens"],
        temperature=job["rollout"]["temperature"],
        lr=job["train"]["lr"],
        max_grad_norm=1.0,
        clip_epsilon=job["train"]["clip_epsilon"],
    )
    reward = GSM8KRewardParser(
        tokenizer=tokenizer, format_reward=job["task"]["format_reward"], correct_reward=job["task"]["correct_reward"]
    )
    trl_out = args.out / "trl"
    shutil.rmtree(trl_out, ignore_errors=True)
    # TRL trains in the precision llmrl's trainer picks here (the main job's train.mixed_precision: auto): bf16
    # autocast only where this CPU has bf16, else fp32 on both sides (emulated bf16 ran TRL ~3x slower than fp32)
    precision, why = mixed_precision_for(job["train"].get("mixed_precision", "auto"), "cpu")
    trl_dtype = "bf16" if precision == "bf16" else "fp32"
    print(f"  both sides train in {trl_dtype} ({why})", flush=True)
    theirs = run_trl(
        trl_python,
        task,
        model_dir,
        trl_out,
        args.steps,
        lambda c, a: float(reward.score(c, a)["reward"]),
        trl_dtype,
        args.seed,
    )
    print(f"  TRL {theirs['setup'].get('trl')}: {theirs['end_s']:.0f} s in all", flush=True)

    print(f"== evaluation: every version, greedy, {args.eval_questions} held-out problems, one vLLM engine")
    from storage.checkpoints import CheckpointStore
    from storage.layout import RunLayout

    store = CheckpointStore(RunLayout.for_runs_dir(RUN_ID, str(runs_dir)).checkpoints_uri)
    weights = {
        "llmrl": {0: None, **{r["version"]: lambda v=r["version"]: store.load(v).state_dict for r in ours}},
        "TRL": {0: None, **{r["version"]: str(trl_out / f"step-{r['version']}.safetensors") for r in theirs["steps"]}},
    }
    scores = evaluate_all(model_dir, weights, job, args.eval_questions)
    curves: dict[str, list[dict]] = {}
    for side, rows in (("llmrl", ours), ("TRL", theirs["steps"])):
        base = {"version": 0, "time_s": 0.0, "train_reward": math.nan}
        curves[side] = [
            {**r, "accuracy": scores[side][r["version"]][0], "accuracy_se": scores[side][r["version"]][1]}
            for r in [base, *rows]
        ]
    report(curves, args, theirs["setup"])
    if not args.keep:
        shutil.rmtree(runs_dir, ignore_errors=True)
        shutil.rmtree(trl_out, ignore_errors=True)


def report(curves: dict[str, list[dict]], args: argparse.Namespace, setup: dict) -> None:
    """Print the table and the time-to-accuracy ratios; write the rows and the plot."""
    ours, theirs = curves["llmrl"], curves["TRL"]
    print("\n| version | llmrl time | llmrl accuracy | TRL time | TRL accuracy | llmrl - TRL | reward llmrl / TRL |")
    print("|---|---|---|---|---|---|---|")
    paired = []
    for index, a in enumerate(ours):
        b = theirs[index] if index < len(theirs) else None
        row = f"| {a['version']} | {a['time_s']:.0f} s | {a['accuracy']:.3f} ± {a['accuracy_se']:.3f} | "
        if b is None:
            print(row + f"| | | {a['train_reward']:.2f} / |")
            continue
        diff, se = a["accuracy"] - b["accuracy"], math.hypot(a["accuracy_se"], b["accuracy_se"])
        if a["version"] > 0:
            paired.append(diff / se)
        print(
            row + f"{b['time_s']:.0f} s | {b['accuracy']:.3f} ± {b['accuracy_se']:.3f} | {diff:+.3f} ± {se:.3f} | "
            f"{a['train_reward']:.2f} / {b['train_reward']:.2f} |"
        )
    if paired:
        print(
            f"\nper-step learning, versions 1-{len(paired)}: llmrl - TRL within {max(abs(z) for z in paired):.1f} "
            f"standard errors at every step (mean z {sum(paired) / len(paired):+.2f})"
        )
    for side, rows in (("llmrl", ours), ("TRL", theirs)):
        gaps = [b["time_s"] - a["time_s"] for a, b in zip(rows[1:], rows[2:], strict=False)]
        per_step = f"{statistics.median(gaps):.1f} s per version after it (median)" if gaps else ""
        print(f"{side}: version 1 at {rows[1]['time_s']:.0f} s (start-up included), {per_step}")
    final = theirs[-1]["accuracy"]
    levels = sorted({round(x, 3) for x in (0.4, 0.5, 0.6, final) if x > theirs[0]["accuracy"]})
    print("\n| accuracy reached | llmrl | TRL | TRL time / llmrl time |")
    print("|---|---|---|---|")
    for level in levels:
        mine, trls = first_reaching(ours, level), first_reaching(theirs, level)
        cells = [f"v{r['version']}, {r['time_s']:.0f} s" if r else "not reached" for r in (mine, trls)]
        ratio = f"{trls['time_s'] / mine['time_s']:.2f}" if mine and trls else "-"
        label = f"{level:.3f}" + (" (TRL's final)" if level == round(final, 3) else "")
        print(f"| {label} | {cells[0]} | {cells[1]} | {ratio} |")
    title = (
        f"two-digit addition, SmolLM2-135M-Instruct, 8 prompts x 8 samples per step\n{machine_line()}\n"
        f"{args.eval_questions} held-out problems; TRL {setup.get('trl', '?')} "
        f"({setup.get('generation', '?')} generation)"
    )
    png = args.out / "time_to_accuracy.png"
    plot(curves, png, title)
    (args.out / "time_to_accuracy.json").write_text(json.dumps({"curves": curves, "trl_setup": setup}, indent=1))
    print(f"plot: {png}\nrows: {args.out / 'time_to_accuracy.json'}")


if __name__ == "__main__":
    main()
