"""``MCAdvantage`` as TorchRL's replay-buffer write transform (``inv``: trajectories queue per group, over-sampled
candidate groups, dynamic sampling) and ``MCAdvantageSelector``, against TorchRL 0.14.1's outputs on the same inputs
(``scripts/torchrl_mc_advantage_goldens.py`` in the side venv -> ``tests/goldens/torchrl/mc_advantage.json``)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from llmrl_core.objectives import MCAdvantage, MCAdvantageSelector

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = json.loads((ROOT / "tests/goldens/torchrl/mc_advantage.json").read_text())
_spec = importlib.util.spec_from_file_location("mc_goldens", ROOT / "scripts/torchrl_mc_advantage_goldens.py")
SPEC = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(SPEC)  # the cases as data: the same inputs TorchRL was given


def _transform(kwargs: dict) -> MCAdvantage:
    kwargs = dict(kwargs)
    if "candidate_selector" in kwargs:
        kwargs["candidate_selector"] = MCAdvantageSelector(**kwargs["candidate_selector"])
    if "keep_return_bounds" in kwargs:
        kwargs["keep_return_bounds"] = tuple(kwargs["keep_return_bounds"])
    return MCAdvantage(**kwargs)


@pytest.mark.parametrize("name", sorted(SPEC.CASES))
def test_replay_buffer_writes_match_torchrl(name):
    case, golden = SPEC.CASES[name], GOLDEN["cases"][name]
    transform = _transform(case["kwargs"])
    counter = [0]
    outputs = [
        SPEC.record(transform.inv(SPEC.write_input(TensorDict, torch, kind, trajs, counter)))
        for kind, trajs in case["writes"]
    ]
    for got, want in zip(outputs, golden["outputs"], strict=True):
        if want is None:
            assert got is None
            continue
        assert (got["shape"], got["id"], got["group_id"]) == (want["shape"], want["id"], want["group_id"])
        assert got["advantage"] == pytest.approx(want["advantage"], abs=2e-6)
    stats = transform.get_stats()
    for key, value in golden["stats"].items():
        assert stats[key] == pytest.approx(value, abs=1e-5), key


@pytest.mark.parametrize("index", range(len(SPEC.SELECTIONS)))
def test_the_selector_picks_what_torchrl_picks(index):
    case = SPEC.SELECTIONS[index]
    selector = MCAdvantageSelector(case["strategy"], max_combinations=case.get("max_combinations", 100_000))
    candidates = TensorDict({"return": torch.tensor(case["values"])}, [len(case["values"])])
    bounds = tuple(case["bounds"]) if case["bounds"] else None
    assert (
        selector.select(candidates, group_size=case["group_size"], keep_return_bounds=bounds)
        == (GOLDEN["selections"][index])
    )


@pytest.mark.parametrize("name", sorted(SPEC.ERRORS))
def test_bad_settings_raise_torchrls_error_types(name):
    which, kwargs = SPEC.ERRORS[name]
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}
    kind, _ = GOLDEN["errors"][name]
    with pytest.raises(Exception) as err:  # noqa: PT011 - the type is checked against TorchRL's next
        (MCAdvantageSelector if which == "selector" else MCAdvantage)(**kwargs)
    assert type(err.value).__name__ == kind
    named = {k for k in kwargs if k not in ("grpo_size",)} or {"strategy"}
    assert any(k in str(err.value) for k in named), str(err.value)


def test_torchrls_docstring_example_and_the_written_advantage_keys():
    """TorchRL's own example (a group of two waits for its second trajectory), the advantage at a nested key and
    on a string group id, and the refusals: an unfinished trajectory, a group id of another type, no grpo_size."""
    from tensordict import NonTensorStack

    def traj(group, rewards):
        steps = len(rewards)
        return TensorDict(
            group_id=torch.full((steps,), group),
            next=TensorDict(reward=torch.tensor(rewards).reshape(steps, 1),
                            done=torch.tensor([False] * (steps - 1) + [True]).reshape(steps, 1), batch_size=[steps]),
            batch_size=[steps],
        )  # fmt: skip

    t = MCAdvantage(grpo_size=2, prompt_key="group_id", trajectory_return="sum")
    assert t.inv(traj(7, [0.0, 0.0, 0.0])) is None and t.queued_trajectories == 1
    out = t.inv(traj(7, [0.0, 0.0, 1.0]))
    torch.testing.assert_close(out["advantage"].squeeze(-1), torch.tensor([-0.7071] * 3 + [0.7071] * 3), atol=1e-4,
                               rtol=0)  # fmt: skip
    assert t.queued_groups == 0 and t.forward(out) is out
    nested = MCAdvantage(grpo_size=2, prompt_key="query", advantage_key=("adv", "value"))
    for rewards in ([1.0], [0.0]):
        td = traj(0, rewards)
        td.set("query", NonTensorStack(*["same prompt"] * len(rewards)))
        written = nested.inv(td)
    assert written.get(("adv", "value")).reshape(-1).tolist() == pytest.approx([0.7071068, -0.7071068])
    unfinished = traj(1, [0.0, 1.0])
    unfinished.set(("next", "done"), torch.zeros(2, 1, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="Expected the trajectory to be done"):
        t.inv(unfinished)
    bad = traj(1, [1.0])
    bad.set("group_id", torch.zeros(1, dtype=torch.bool))
    assert MCAdvantage(grpo_size=2, prompt_key="group_id").inv(bad) is None  # a tensor id is grouped by value
    with pytest.raises(ValueError, match="needs grpo_size"):
        MCAdvantage(prompt_key="group_id").inv(traj(1, [1.0]))


def test_a_batch_call_refuses_over_sampled_groups():
    """Over-sampled candidates are chosen as trajectories arrive (``inv``); a batch of rows cannot say which."""
    t = MCAdvantage(grpo_size=2, trajectory_return="sum", candidate_group_size=4)
    with pytest.raises(ValueError, match=r"candidate_group_size=4\) selects over-sampled candidates .* inv\(td\)"):
        t(torch.tensor([1.0, 0.0, 1.0, 0.0]), [0, 0, 0, 0])
