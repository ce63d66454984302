"""``llmrl trajectories ...``: look into the Parquet trajectory store (runs, versions, best samples)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import typer

trajectories_app = typer.Typer(
    help="Inspect stored trajectories (Parquet, by run and policy version).", no_args_is_help=True
)

_STORE_HELP = "Trajectory store path or URI (default: RUNS_DIR/trajectories)."
_RUNS_HELP = "Runs root (default: $LLMRL_RUNS_DIR or $LLMRL_HOME/runs)."


def _open_store(store: str | None, runs_dir: Path | None):
    from storage.layout import TRAJECTORIES_DIR, default_runs_root
    from storage.trajectories import TrajectoryStore

    return TrajectoryStore(store or str((runs_dir or default_runs_root()) / TRAJECTORIES_DIR))


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


def _last_assistant(messages: list[dict]) -> str:
    for message in reversed(messages or []):
        if message.get("role") == "assistant":
            return message.get("content") or ""
    return ""


@trajectories_app.command("list")
def list_runs(
    run: str = typer.Argument(None, help="A run id (default: every run in the store)."),
    store: str = typer.Option(None, "--store", help=_STORE_HELP),
    runs_dir: Path = typer.Option(None, "--runs-dir", help=_RUNS_HELP),
) -> None:
    """List runs, their policy versions and shard/row counts."""
    from storage.trajectories import TrajectoryStoreError

    trajectory_store = _open_store(store, runs_dir)
    try:
        runs = [run] if run else trajectory_store.runs()
        if not runs:
            _fail(f"no runs in {trajectory_store.uri}")
        for run_id in runs:
            versions = trajectory_store.versions(run_id)
            if not versions:
                _fail(f"no trajectories for run {run_id!r} in {trajectory_store.uri}")
            typer.echo(f"{run_id}")
            for version in versions:
                shards = trajectory_store.shards(run_id, version=version)
                rows = trajectory_store.scanner(run_id, version=version, columns=["reward"]).count_rows()
                typer.echo(f"  policy_version {version:>4}: {len(shards)} shard(s), {rows} rows")
    except TrajectoryStoreError as err:
        _fail(str(err))


@trajectories_app.command("show")
def show(
    run: str = typer.Argument(..., help="Run id."),
    version: int = typer.Option(None, "--version", "-v", help="Policy version (default: the latest)."),
    top: int = typer.Option(5, "--top", "-k", min=0, help="How many samples to show, best first."),
    by: str = typer.Option("reward", "--by", help="Rank by 'reward' or 'advantage'."),
    finish_reason: str = typer.Option(None, "--finish-reason", help="Only rows with this finish reason."),
    width: int = typer.Option(160, "--width", help="Characters of each response to show (0 = all)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary and rows as JSON."),
    store: str = typer.Option(None, "--store", help=_STORE_HELP),
    runs_dir: Path = typer.Option(None, "--runs-dir", help=_RUNS_HELP),
) -> None:
    """Summarise one policy version of a run and print its top samples."""
    from storage.trajectories import TrajectoryStoreError

    if by not in ("reward", "advantage"):
        _fail(f"--by must be 'reward' or 'advantage', got {by!r}")
    trajectory_store = _open_store(store, runs_dir)
    try:
        versions = trajectory_store.versions(run)
        if not versions:
            _fail(f"no trajectories for run {run!r} in {trajectory_store.uri} (runs: {trajectory_store.runs()})")
        if version is None:
            version = versions[-1]
        elif version not in versions:
            _fail(f"run {run!r} has no policy version {version} (versions: {versions})")
        table = trajectory_store.read_table(run, version=version, finish_reason=finish_reason)
    except TrajectoryStoreError as err:
        _fail(str(err))
    rows = table.to_pylist()
    rewards = [r["reward"] for r in rows]
    summary = {
        "run_id": run,
        "policy_version": version,
        "rows": len(rows),
        "shards": len(trajectory_store.shards(run, version=version)),
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "reward_min": min(rewards, default=None),
        "reward_max": max(rewards, default=None),
        "finish_reasons": dict(Counter(r["finish_reason"] for r in rows).most_common()),
        "response_tokens_mean": sum(len(r["response_tokens"]) for r in rows) / len(rows) if rows else None,
    }
    ranked = sorted(
        rows,
        key=lambda r: (-(r[by] if r[by] is not None else float("-inf")), r["prompt_id"], r["sample_index"]),
    )[:top]
    if as_json:
        keep = (
            "prompt_id",
            "group_id",
            "sample_index",
            "reward",
            "advantage",
            "finish_reason",
            "reward_components",
            "num_tool_calls",
            "tool_calls",
        )
        samples = [{**{k: r[k] for k in keep}, "response": _last_assistant(r["messages"])} for r in ranked]
        for sample in samples:
            sample["reward_components"] = dict(sample["reward_components"] or [])
        typer.echo(json.dumps({"summary": summary, "top": samples}, indent=2))
        return
    typer.echo(f"run {run}  policy_version {version}  ({summary['shards']} shard(s), {len(rows)} rows)")
    if not rows:
        return
    finishes = ", ".join(f"{k} {v}" for k, v in summary["finish_reasons"].items())
    typer.echo(
        f"  reward mean {summary['reward_mean']:.4f}  min {summary['reward_min']:.4f}  max {summary['reward_max']:.4f}"
        f"  | finish: {finishes}  | response tokens mean {summary['response_tokens_mean']:.1f}"
    )
    if top:
        typer.echo(f"top {len(ranked)} by {by}:")

    def clip(value: str) -> str:
        value = " ".join(value.split())
        return value if width == 0 or len(value) <= width else value[: width - 3] + "..."

    for rank, row in enumerate(ranked, 1):
        text = clip(_last_assistant(row["messages"]))
        advantage = "  n/a " if row["advantage"] is None else f"{row['advantage']:+.3f}"
        parts = ", ".join(f"{k}={v:g}" for k, v in (row["reward_components"] or []))
        typer.echo(
            f"  #{rank} reward {row['reward']:.3f} adv {advantage} {row['finish_reason']:<7} "
            f"prompt {row['prompt_id']} sample {row['sample_index']} tokens {len(row['response_tokens'])}"
            + (f" [{parts}]" if parts else "")
        )
        if row.get("num_tool_calls"):
            calls = row.get("tool_calls") or []
            errors = sum(1 for c in calls if c.get("error"))
            typer.echo(f"     {row['num_tool_calls']} tool call(s), {errors} failed; conversation after the prompt:")
            first = next((i for i, m in enumerate(row["messages"]) if m["role"] == "assistant"), len(row["messages"]))
            for message in row["messages"][first:]:
                typer.echo(f"     [{message['role']}] {clip(message['content'] or '')}")
        else:
            typer.echo(f"     {text}")
