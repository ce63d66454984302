"""MCAdvantage / mc_advantage and TopKRewardSelector against TorchRL 0.14.1 and hand computations."""

from __future__ import annotations

import statistics

import pyarrow as pa
import pytest
import torch

from llmrl_core.objectives import (
    ADVANTAGE_METHODS,
    MCAdvantage,
    TopKRewardSelector,
    mc_advantage,
    select_top_k,
)

EPISODES = [[0.0, 1.0, 0.5], [0.2, 0.2], [1.0], [0.0, 0.0, 0.3, 0.1]]


def episode_rows():
    rewards, episodes = [], []
    for e, rs in enumerate(EPISODES):
        rewards += rs
        episodes += [e] * len(rs)
    return rewards, episodes


# expected values from TorchRL 0.14.1 (torchrl.objectives.llm.MCAdvantage fed one trajectory at a time).
TORCHRL_SINGLE_STEP = [1.3220428228378296, -0.9771621227264404, 0.17244035005569458, -0.5173211693763733]
TORCHRL_EPISODES = {
    None: [-0.8549107313156128, 1.7357280254364014, 0.4404086172580719, -0.3367829918861389, -0.3367829918861389,
           1.7357280254364014, -0.8549107313156128, -0.8549107313156128, -0.07771908491849899, -0.5958468914031982],
    "sum": [1.2699730396270752] * 3 + [-0.7996127605438232] * 2 + [0.3292522132396698] + [-0.7996127605438232] * 4,
    "mean": [0.12371787428855896] * 3 + [-0.6185895800590515] * 2 + [1.3608969449996948]
    + [-0.8660255074501038] * 4,
    "max": [0.8622018694877625] * 3 + [-0.9771621227264404] * 2 + [0.8622018694877625] + [-0.7472416162490845] * 4,
}  # fmt: skip
TORCHRL_BOUNDS_GROUP_2 = [1.154700517654419, -0.5773503184318542, -0.5773503184318542]


def test_single_step_group_normalisation_matches_torchrl_and_hand():
    rewards = [1.0, 0.0, 0.5, 0.2]
    out = mc_advantage(rewards, [0, 0, 0, 0])
    torch.testing.assert_close(out.advantages, torch.tensor(TORCHRL_SINGLE_STEP), atol=1e-6, rtol=0)
    mean, std = statistics.mean(rewards), statistics.stdev(rewards)  # stdev: unbiased (n - 1)
    torch.testing.assert_close(out.advantages, torch.tensor([(r - mean) / std for r in rewards]), atol=1e-6, rtol=0)
    assert out.keep.all()


@pytest.mark.parametrize("mode", [None, "sum", "mean", "max"])
def test_trajectory_return_modes_match_torchrl(mode):
    rewards, episodes = episode_rows()
    out = mc_advantage(rewards, [3] * len(rewards), episode_ids=episodes, trajectory_return=mode)
    torch.testing.assert_close(out.advantages, torch.tensor(TORCHRL_EPISODES[mode]), atol=1e-6, rtol=0)
    if mode is not None:
        reduce = {"sum": sum, "mean": statistics.mean, "max": max}[mode]
        returns = [reduce(rs) for rs in EPISODES]
        m, s = statistics.mean(returns), statistics.stdev(returns)
        expected = [(returns[e] - m) / s for e in episodes]
        torch.testing.assert_close(out.advantages, torch.tensor(expected), atol=1e-6, rtol=0)


def test_groups_are_independent_and_rows_can_interleave():
    rewards = [1.0, 5.0, 0.0, 6.0, 0.5, 9.0]
    groups = ["a", "b", "a", "b", "a", "b"]
    out = mc_advantage(rewards, groups)
    a = mc_advantage([1.0, 0.0, 0.5], ["a"] * 3).advantages
    b = mc_advantage([5.0, 6.0, 9.0], ["b"] * 3).advantages
    torch.testing.assert_close(out.advantages[[0, 2, 4]], a)
    torch.testing.assert_close(out.advantages[[1, 3, 5]], b)


def test_all_equal_rewards_give_exactly_zero_advantage():
    out = mc_advantage([0.1, 0.1, 0.1, 0.7, 0.3], ["g", "g", "g", "h", "h"])
    assert out.advantages[:3].tolist() == [0.0, 0.0, 0.0]
    assert out.stats["zero_signal_groups"] == 1
    single = mc_advantage([0.4], ["only"])
    assert single.advantages.tolist() == [0.0]


def test_keep_return_bounds_drops_groups_without_signal():
    rewards = [0, 0, 0, 1, 1, 1, 1, 0, 0]
    groups = [0, 0, 0, 1, 1, 1, 2, 2, 2]
    out = mc_advantage(rewards, groups, trajectory_return="sum", keep_return_bounds=(0.1, 0.9))
    assert out.keep.tolist() == [False] * 6 + [True] * 3
    torch.testing.assert_close(out.advantages[6:], torch.tensor(TORCHRL_BOUNDS_GROUP_2), atol=1e-6, rtol=0)
    assert out.advantages[:6].tolist() == [0.0] * 6
    assert out.stats == {"groups": 3, "dropped_groups": 2, "zero_signal_groups": 0, "kept_rows": 3}


def test_eps_bounds_the_divisor():
    out = mc_advantage([0.0, 1e-9], ["g", "g"], eps=1e-3)
    std = statistics.stdev([0.0, 1e-9])
    assert std < 1e-3
    torch.testing.assert_close(out.advantages, torch.tensor([-0.5e-9 / 1e-3, 0.5e-9 / 1e-3]), atol=1e-12, rtol=0)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="rows \\[1\\]"):
        mc_advantage([0.0, float("nan")], [0, 0])
    with pytest.raises(ValueError, match="group_ids has 1 entries"):
        mc_advantage([0.0, 1.0], [0])
    with pytest.raises(ValueError, match="group 'b' has 1 rows, expected group_size=2"):
        mc_advantage([0.0, 1.0, 1.0], ["a", "a", "b"], group_size=2)
    with pytest.raises(ValueError, match="set trajectory_return"):
        mc_advantage([0.0, 1.0], [0, 0], keep_return_bounds=(0.1, 0.9))
    with pytest.raises(ValueError, match="increasing"):
        mc_advantage([0.0, 1.0], [0, 0], trajectory_return="sum", keep_return_bounds=(0.9, 0.1))


def test_mc_advantage_transform_table():
    table = pa.table(
        {
            "group_id": ["p0"] * 3 + ["p1"] * 3,
            "reward": [1.0, 0.0, 0.0, 1.0, 1.0, 1.0],
            "advantage": [None] * 6,
            "text": list("abcdef"),
        }
    )
    t = MCAdvantage(grpo_size=3, trajectory_return="sum", keep_return_bounds=(0.1, 0.9))
    out = t.transform_table(table)
    assert out.column("text").to_pylist() == ["a", "b", "c"]
    torch.testing.assert_close(torch.tensor(out.column("advantage").to_pylist()), torch.tensor(TORCHRL_BOUNDS_GROUP_2))
    assert t.last_stats["dropped_groups"] == 1
    with pytest.raises(ValueError, match="no column 'reward'"):
        t.transform_table(table.drop_columns(["reward"]))


# ---------------------------------------------------------------------------------------------------------------
# Advantage methods: grpo / dr_grpo / rloo, expected values worked out by hand
# ---------------------------------------------------------------------------------------------------------------

# Group "a" = [1, 0, 0, 1]: mean 1/2, centred [+1/2, -1/2, -1/2, +1/2], unbiased std sqrt((4 * 1/4) / 3) = 1/sqrt(3).
# Group "b" = [0, 0, 1]: mean 1/3, centred [-1/3, -1/3, +2/3], unbiased std sqrt((1/9 + 1/9 + 4/9) / 2) = 1/sqrt(3).
# Group "c" = [0.7]: a group of one; group "d" = [0.4, 0.4]: all equal. Both exactly 0 for every method.
# rloo: a -> r_i - mean of the other three: 1 - 1/3 = 2/3, 0 - 2/3 = -2/3;  b -> 0 - 1/2 = -1/2, 1 - 0 = 1.
METHOD_REWARDS = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.7, 0.4, 0.4]
METHOD_GROUPS = ["a", "a", "a", "a", "b", "b", "b", "c", "d", "d"]
SQRT3 = 3.0**0.5
METHOD_EXPECTED = {
    "grpo": [SQRT3 / 2, -SQRT3 / 2, -SQRT3 / 2, SQRT3 / 2, -SQRT3 / 3, -SQRT3 / 3, 2 * SQRT3 / 3, 0.0, 0.0, 0.0],
    "dr_grpo": [0.5, -0.5, -0.5, 0.5, -1 / 3, -1 / 3, 2 / 3, 0.0, 0.0, 0.0],
    "rloo": [2 / 3, -2 / 3, -2 / 3, 2 / 3, -0.5, -0.5, 1.0, 0.0, 0.0, 0.0],
}


def test_advantage_methods_constant():
    assert ADVANTAGE_METHODS == ("grpo", "dr_grpo", "rloo")


@pytest.mark.parametrize("method", ["grpo", "dr_grpo", "rloo"])
def test_advantage_methods_per_row_by_hand(method):
    out = mc_advantage(METHOD_REWARDS, METHOD_GROUPS, method=method)
    expected = torch.tensor(METHOD_EXPECTED[method], dtype=torch.float64).float()
    torch.testing.assert_close(out.advantages, expected, atol=1e-7, rtol=0)
    assert out.advantages[7:].tolist() == [0.0, 0.0, 0.0]  # exactly zero, not rounding error
    assert out.keep.all()
    assert out.stats == {"groups": 4, "dropped_groups": 0, "zero_signal_groups": 2, "kept_rows": 10}
    via_class = MCAdvantage(method=method)(METHOD_REWARDS, METHOD_GROUPS)
    assert via_class.advantages.tolist() == out.advantages.tolist()


def test_grpo_method_is_the_default():
    default = mc_advantage(METHOD_REWARDS, METHOD_GROUPS)
    explicit = mc_advantage(METHOD_REWARDS, METHOD_GROUPS, method="grpo")
    assert default.advantages.tolist() == explicit.advantages.tolist()


@pytest.mark.parametrize("method", ["grpo", "dr_grpo", "rloo"])
def test_advantage_methods_episode_mode_by_hand(method):
    # Group "g": episode returns (sum) 1 + 0 = 1, 0, 0.5 + 0.5 + 1 = 2 -> mean 1, centred [0, -1, +1],
    # unbiased std sqrt((0 + 1 + 1) / 2) = 1; rloo: 1 - (0 + 2)/2 = 0, 0 - (1 + 2)/2 = -1.5, 2 - (1 + 0)/2 = 1.5.
    # Group "h": returns 0 and 0 -> mean 0, outside the (0.1, 1.9) bounds: dropped.
    rewards = [1.0, 0.0, 0.0, 0.5, 0.5, 1.0, 0.0, 0.0]
    groups = ["g", "g", "g", "g", "g", "g", "h", "h"]
    episodes = [0, 0, 1, 2, 2, 2, 3, 4]
    per_episode = {"grpo": [0.0, -1.0, 1.0], "dr_grpo": [0.0, -1.0, 1.0], "rloo": [0.0, -1.5, 1.5]}[method]
    e0, e1, e2 = per_episode
    out = mc_advantage(
        rewards, groups, episode_ids=episodes, trajectory_return="sum", keep_return_bounds=(0.1, 1.9), method=method
    )
    torch.testing.assert_close(out.advantages, torch.tensor([e0, e0, e1, e2, e2, e2, 0.0, 0.0]), atol=1e-7, rtol=0)
    assert out.keep.tolist() == [True] * 6 + [False] * 2
    assert out.stats == {"groups": 2, "dropped_groups": 1, "zero_signal_groups": 0, "kept_rows": 6}
    # All-equal episode returns: exactly zero and counted, whatever the method.
    flat = mc_advantage([1.0, 0.0, 0.5, 0.5], ["g"] * 4, episode_ids=[0, 0, 1, 1], trajectory_return="sum",
                        method=method)  # fmt: skip
    assert flat.advantages.tolist() == [0.0] * 4 and flat.stats["zero_signal_groups"] == 1
    with pytest.raises(ValueError, match="expected group_size=4"):
        mc_advantage(rewards, groups, episode_ids=episodes, trajectory_return="sum", group_size=4, method=method)


def test_rloo_against_brute_force_leave_one_out():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(40, generator=gen, dtype=torch.float64)
    groups = (torch.arange(40) % 7).tolist()  # 7 interleaved groups of 5 or 6 rows
    out = mc_advantage(rewards, groups, method="rloo")
    expected = []
    for i in range(40):
        others = [float(rewards[j]) for j in range(40) if j != i and groups[j] == groups[i]]
        expected.append(float(rewards[i]) - sum(others) / len(others))
    torch.testing.assert_close(out.advantages, torch.tensor(expected, dtype=torch.float64).float(), atol=1e-7, rtol=0)
    # rloo = G / (G - 1) * dr_grpo for every group of size G.
    dr = mc_advantage(rewards, groups, method="dr_grpo").advantages.double()
    size = torch.tensor([groups.count(g) for g in groups], dtype=torch.float64)
    torch.testing.assert_close(out.advantages.double(), dr * size / (size - 1), atol=1e-6, rtol=0)


def test_bad_advantage_method_names_the_setting():
    with pytest.raises(ValueError, match=r"method must be one of \('grpo', 'dr_grpo', 'rloo'\), got 'ppo'"):
        mc_advantage([0.0, 1.0], [0, 0], method="ppo")
    with pytest.raises(ValueError, match="method must be one of"):
        MCAdvantage(2, method="RLOO")


# expected values from TorchRL 0.14.1 (torchrl.data.llm.topk.TopKRewardSelector on a replay buffer).
def test_top_k_selector_matches_torchrl():
    rewards = [0, 1, 2, 3, 4] + [1] * 5 + [0, 0, 0, 1, 0]
    groups = ["a"] * 5 + ["b"] * 5 + ["d"] * 5
    kept = select_top_k(rewards, groups, 3, group_size=5)
    # TorchRL kept: ('a', 4.0), ('a', 3.0), ('d', 1.0) -- strictly above the median, all-equal group dropped.
    assert [(groups[i], rewards[i]) for i in kept] == [("a", 4), ("a", 3), ("d", 1)]
    rewards2 = [0.5, 0.9, 0.1, 0.9, 0.7, 0.2] + [0, 0, 0, 1, 0, 0] + [3, 1, 2, 5, 4, 0]
    groups2 = ["c"] * 6 + ["d"] * 6 + ["e"] * 6
    kept2 = TopKRewardSelector(6, 2).select(rewards2, groups2)
    # TorchRL kept: ('c', 0.9), ('c', 0.9), ('d', 1.0), ('e', 5.0), ('e', 4.0)
    assert [(groups2[i], rewards2[i]) for i in kept2] == [("c", 0.9), ("c", 0.9), ("d", 1), ("e", 5), ("e", 4)]
    assert kept2[:2] == [1, 3]  # ties keep row order


def test_top_k_selector_table_and_errors():
    table = pa.table({"group_id": [1, 1, 1, 2, 2, 2], "reward": [0.2, 0.9, 0.5, 0.0, 0.0, 0.0], "id": list("uvwxyz")})
    out = TopKRewardSelector(topk_size=1).transform_table(table)
    assert out.column("id").to_pylist() == ["v"]
    without_median = select_top_k([0.2, 0.9, 0.5], [1, 1, 1], 3, above_median=False)
    assert without_median == [1, 2, 0]
    with pytest.raises(ValueError, match="topk_size must be smaller than or equal to total_dialog_turns"):
        TopKRewardSelector(total_dialog_turns=4, topk_size=5)
    with pytest.raises(ValueError, match="group 2 has 3 rows"):
        select_top_k([0, 1, 0, 1, 2], [1, 1, 2, 2, 2], 1, group_size=2)


def test_top_k_selector_takes_torchrls_arguments_and_a_tensordict_batch():
    """TorchRL's order ``(total_dialog_turns, topk_size)``; rows grouped by ``("text", "prompt")``; a per-token
    reward counts as its mean over tokens, as TorchRL aggregates it (by sums the choice would be row 2)."""
    from tensordict import TensorDict, lazy_stack

    rewards = [[[0.5]], [[2.0], [0.0]], [[3.0], [0.0], [0.0], [0.0]], [[1.0]], [[1.0]], [[1.0]]]
    prompts = ["p", "p", "p", "q", "q", "q"]
    batch = lazy_stack(
        [
            TensorDict({("next", "reward"): torch.tensor(r), ("text", "prompt"): p, "row": torch.tensor(i)})
            for i, (r, p) in enumerate(zip(rewards, prompts, strict=True))
        ]
    )
    selector = TopKRewardSelector(3, 2)
    assert (selector.total_dialog_turns, selector.topk_size, selector.rewards_key) == (3, 2, ("next", "reward"))
    kept = selector.transform_tensordict(batch)
    assert kept["row"].tolist() == [1]  # means 0.5, 1.0, 0.75: median 0.75; group q is all equal: dropped
    with pytest.raises(ValueError, match="group 'p' has 3 rows, expected group_size=2"):
        TopKRewardSelector(2, 1).transform_tensordict(batch)
    with pytest.raises(TypeError, match="needs topk_size"):
        TopKRewardSelector(3)
