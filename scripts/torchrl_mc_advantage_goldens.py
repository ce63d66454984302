"""Golden outputs of TorchRL 0.14.1's ``MCAdvantage`` used as a replay-buffer transform (``inv``: trajectories queue
per group until the group is complete) and of its ``MCAdvantageSelector``, for side-by-side checks.

Runs in the side virtual environment that has ``torchrl`` (never in llmrl's own one)::

    /work/sidevenv/torchrl/bin/python scripts/torchrl_mc_advantage_goldens.py \\
        --out tests/goldens/torchrl/mc_advantage.json

The cases are data (``CASES``, ``SELECTIONS``, ``ERRORS``), so ``tests/test_mc_advantage_queue.py`` builds the same
inputs and calls llmrl's classes. Each case is a constructor call and a sequence of writes; a write is one
trajectory (``"one"``), several trajectories of one length stacked ``(B, T)`` (``"batch"``), or several
trajectories concatenated on one time axis (``"cat"``, split at their done flags). Each trajectory carries its
group id, its per-step rewards and an ``id`` per step, so the record shows which trajectories a write returned,
in which order, with which advantages; the transform's counters are recorded after the last write.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CASES = {
    "docstring_sum": {
        "kwargs": {"grpo_size": 2, "prompt_key": "group_id", "trajectory_return": "sum"},
        "writes": [["one", [[7, [0.0, 0.0, 0.0]]]], ["one", [[7, [0.0, 0.0, 1.0]]]]],
    },
    "dynamic_sampling_drop": {
        "kwargs": {"grpo_size": 2, "prompt_key": "group_id", "trajectory_return": "sum",
                   "keep_return_bounds": [0.1, 0.9]},
        "writes": [["one", [[0, [0.0, 0.0]]]], ["one", [[0, [0.0, 0.0]]]], ["one", [[1, [1.0]]]],
                   ["one", [[1, [0.0]]]]],
    },
    "per_step_two_groups_interleaved": {
        "kwargs": {"grpo_size": 2, "prompt_key": "group_id"},
        "writes": [["one", [[3, [1.0, 2.0]]]], ["one", [[4, [0.5]]]], ["one", [[3, [3.0]]]],
                   ["one", [[4, [0.25, 0.0, 1.0]]]]],
    },
    "per_step_batch_of_four": {
        "kwargs": {"grpo_size": 2, "prompt_key": "group_id"},
        "writes": [["batch", [[1, [1.0, 0.0]], [2, [0.0, 0.0]], [1, [0.0, 1.0]], [2, [2.0, 1.0]]]]],
    },
    "mean_return_cat_split": {
        "kwargs": {"grpo_size": 3, "prompt_key": "group_id", "trajectory_return": "mean"},
        "writes": [["cat", [[5, [1.0, 0.0]], [5, [0.0]], [5, [1.0, 1.0, 1.0]]]]],
    },
    "max_return": {
        "kwargs": {"grpo_size": 2, "prompt_key": "group_id", "trajectory_return": "max"},
        "writes": [["batch", [[9, [0.2, 0.7]], [9, [0.1, 0.3]]]]],
    },
    "oversampling_rescue": {
        "kwargs": {"grpo_size": 2, "prompt_key": "group_id", "trajectory_return": "sum",
                   "keep_return_bounds": [0.1, 0.9], "candidate_group_size": 4},
        "writes": [["one", [[0, [0.0]]]], ["one", [[0, [0.0]]]], ["one", [[0, [0.0]]]], ["one", [[0, [1.0]]]]],
    },
    "oversampling_exhausted": {
        "kwargs": {"grpo_size": 2, "prompt_key": "group_id", "trajectory_return": "sum",
                   "keep_return_bounds": [0.1, 0.9], "candidate_group_size": 3},
        "writes": [["one", [[0, [1.0]]]], ["one", [[0, [1.0]]]], ["one", [[0, [1.0]]]], ["one", [[0, [0.0]]]]],
    },
    "oversampling_waits_for_min_size": {
        "kwargs": {"grpo_size": 2, "prompt_key": "group_id", "trajectory_return": "sum",
                   "keep_return_bounds": [0.1, 0.9], "candidate_group_size": 4, "candidate_selection_min_size": 3},
        "writes": [["one", [[2, [0.0]]]], ["one", [[2, [1.0]]]], ["one", [[2, [1.0]]]]],
    },
    "oversampling_uniform_without_bounds": {
        "kwargs": {"grpo_size": 3, "prompt_key": "group_id", "trajectory_return": "sum", "candidate_group_size": 5,
                   "candidate_selection_min_size": 5, "candidate_selector": {"strategy": "uniform"}},
        "writes": [["batch", [[8, [0.3]], [8, [0.9]], [8, [0.1]], [8, [0.5]], [8, [0.7]]]]],
    },
    "oversampling_first": {
        "kwargs": {"grpo_size": 2, "prompt_key": "group_id", "trajectory_return": "sum",
                   "keep_return_bounds": [0.1, 0.9], "candidate_group_size": 3,
                   "candidate_selector": {"strategy": "first"}},
        "writes": [["one", [[4, [1.0]]]], ["one", [[4, [1.0]]]], ["one", [[4, [0.0]]]]],
    },
}  # fmt: skip

SELECTIONS = [
    {"strategy": "balanced", "values": [0.0, 0.0, 0.0, 1.0], "group_size": 2, "bounds": [0.1, 0.9]},
    {"strategy": "balanced", "values": [1.0, 0.0, 1.0, 0.0, 1.0, 1.0], "group_size": 4, "bounds": [0.1, 0.9]},
    {"strategy": "balanced", "values": [0.2, 0.9, 0.4, 0.6, 0.1], "group_size": 2, "bounds": [0.45, 0.55]},
    {"strategy": "balanced", "values": [1.0, 1.0, 1.0], "group_size": 2, "bounds": [0.1, 0.9]},
    {"strategy": "balanced", "values": [0.3, 0.1, 0.2], "group_size": 3, "bounds": None},
    {"strategy": "balanced", "values": [0.3, 0.1, 0.2, 0.8], "group_size": 2, "bounds": None},
    {"strategy": "uniform", "values": [0.5, 0.1, 0.9, 0.3, 0.7, 0.2], "group_size": 3, "bounds": None},
    {"strategy": "uniform", "values": [0.5, 0.1, 0.9, 0.3], "group_size": 1, "bounds": None},
    {"strategy": "uniform", "values": [0.0, 0.0, 1.0, 0.0], "group_size": 2, "bounds": [0.6, 0.9]},
    {"strategy": "first", "values": [0.0, 1.0, 1.0], "group_size": 2, "bounds": [0.1, 0.9]},
    {"strategy": "first", "values": [0.0, 1.0, 1.0], "group_size": 2, "bounds": [0.6, 0.9]},
    {"strategy": "balanced", "values": [0.0, 0.0, 0.0, 0.0, 1.0, 1.0], "group_size": 3, "bounds": [0.1, 0.9],
     "max_combinations": 1},
    {"strategy": "balanced", "values": [1.0, 1.0, 1.0, 1.0, 0.0, 1.0], "group_size": 3, "bounds": [0.1, 0.5],
     "max_combinations": 1},
    {"strategy": "balanced", "values": [1.0, 1.0, 1.0, 1.0], "group_size": 2, "bounds": [0.1, 0.9],
     "max_combinations": 1},
]  # fmt: skip

ERRORS = {
    "selector_strategy": ("selector", {"strategy": "best"}),
    "selector_max_combinations": ("selector", {"max_combinations": 0}),
    "selector_in_keys_empty": ("selector", {"in_keys": []}),
    "trajectory_return_name": ("transform", {"grpo_size": 2, "trajectory_return": "median"}),
    "trajectory_return_one": ("transform", {"grpo_size": 1, "trajectory_return": "sum"}),
    "candidates_below_grpo": ("transform", {"grpo_size": 3, "candidate_group_size": 2}),
    "candidates_without_return": ("transform", {"grpo_size": 2, "candidate_group_size": 3}),
    "min_size_below_grpo": ("transform", {"grpo_size": 3, "trajectory_return": "sum", "candidate_group_size": 4,
                                          "candidate_selection_min_size": 2}),
    "min_size_above_candidates": ("transform", {"grpo_size": 2, "trajectory_return": "sum",
                                                "candidate_group_size": 3, "candidate_selection_min_size": 4}),
    "bounds_without_return": ("transform", {"grpo_size": 2, "keep_return_bounds": [0.1, 0.9]}),
    "bounds_decreasing": ("transform", {"grpo_size": 2, "trajectory_return": "sum", "keep_return_bounds": [0.9, 0.1]}),
}  # fmt: skip

STATS = (
    "completed_trajectories", "completed_decisions", "trajectory_return_sum", "successful_trajectories",
    "completed_groups", "written_groups", "dropped_groups", "rescued_groups", "selected_trajectories",
    "unselected_trajectories", "queued_groups", "queued_trajectories",
)  # fmt: skip


def trajectory(td_cls, torch, group: int, rewards: list[float], first_id: int):
    """One finished trajectory: ``group_id`` per step, ``("next", "reward")`` and ``("next", "done")`` ``(T, 1)``."""
    steps = len(rewards)
    return td_cls(
        group_id=torch.full((steps,), group),
        id=torch.arange(first_id, first_id + steps),
        next=td_cls(
            reward=torch.tensor(rewards).reshape(steps, 1),
            done=torch.tensor([False] * (steps - 1) + [True]).reshape(steps, 1),
            batch_size=[steps],
        ),
        batch_size=[steps],
    )


def write_input(td_cls, torch, kind: str, trajectories: list, counter: list[int]):
    """The TensorDict of one write (see the module docstring); ``counter`` numbers the steps across writes."""
    tds = []
    for group, rewards in trajectories:
        tds.append(trajectory(td_cls, torch, group, rewards, counter[0]))
        counter[0] += len(rewards)
    if kind == "one":
        return tds[0]
    if kind == "batch":
        return torch.stack(tds)
    return torch.cat(tds)


def record(out) -> dict | None:
    """What one write returned: None, or its step ids, group ids and advantages, flattened in order."""
    if out is None:
        return None
    return {
        "shape": list(out.shape),
        "id": out.get("id").reshape(-1).tolist(),
        "group_id": out.get("group_id").reshape(-1).tolist(),
        "advantage": [round(float(a), 6) for a in out.get("advantage").reshape(-1)],
    }


def main() -> None:
    import torch
    import torchrl
    from tensordict import TensorDict
    from torchrl.objectives.llm import MCAdvantage, MCAdvantageSelector

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cases = {}
    for name, case in CASES.items():
        kwargs = dict(case["kwargs"])
        if "candidate_selector" in kwargs:
            kwargs["candidate_selector"] = MCAdvantageSelector(**kwargs["candidate_selector"])
        if "keep_return_bounds" in kwargs:
            kwargs["keep_return_bounds"] = tuple(kwargs["keep_return_bounds"])
        transform = MCAdvantage(**kwargs)
        counter = [0]
        outputs = [record(transform.inv(write_input(TensorDict, torch, kind, trajs, counter)))
                   for kind, trajs in case["writes"]]  # fmt: skip
        stats = transform.get_stats()
        cases[name] = {"outputs": outputs, "stats": {k: stats[k] for k in STATS}}
    selections = []
    for case in SELECTIONS:
        selector = MCAdvantageSelector(case["strategy"], max_combinations=case.get("max_combinations", 100_000))
        candidates = TensorDict({"return": torch.tensor(case["values"])}, [len(case["values"])])
        bounds = tuple(case["bounds"]) if case["bounds"] else None
        selections.append(selector.select(candidates, group_size=case["group_size"], keep_return_bounds=bounds))
    errors = {}
    for name, (which, kwargs) in ERRORS.items():
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}
        try:
            (MCAdvantageSelector if which == "selector" else MCAdvantage)(**kwargs)
            errors[name] = None
        except Exception as err:  # noqa: BLE001 - the record is the error's type and text
            errors[name] = [type(err).__name__, str(err)]
    golden = {"torchrl": torchrl.__version__, "cases": cases, "selections": selections, "errors": errors}
    Path(args.out).write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {args.out}: {len(cases)} cases, {len(selections)} selections, {len(errors)} errors")


if __name__ == "__main__":
    main()
