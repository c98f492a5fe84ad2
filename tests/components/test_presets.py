"""Algorithm presets: chosen by name, every part overridable, unknown names listed."""

import random

import pyarrow as pa
import pytest

from components.algorithms import check_algorithm
from components.config import ALGORITHM_PRESETS, AlgorithmConfig, ConfigError, load_config
from components.sampling import (
    drop_stale, drop_zero_variance_groups, first_groups, informative_groups, preference_pairs, stratified_order,
)


def test_presets_resolve_and_config_keys_override_them():
    dapo = AlgorithmConfig(name="dapo")
    assert dapo.setting("clip_high") == 0.28 and dapo.setting("clip_low") == 0.2 and dapo.setting("dynamic_sampling")
    assert AlgorithmConfig(name="dapo", clip_high=0.3).setting("clip_high") == 0.3
    dr = AlgorithmConfig(name="dr_grpo")
    assert dr.setting("advantage_options") == {"std_normalize": False} and dr.setting("agg") == "seq-mean-token-sum-norm"
    custom = AlgorithmConfig(name="grpo", advantage="rloo", agg="seq-mean-token-mean")
    assert custom.setting("advantage") == "rloo" and custom.loss_options()["agg"] == "seq-mean-token-mean"
    assert not AlgorithmConfig(name="sft").uses_explorer and AlgorithmConfig(name="mix").uses_expert


def test_advantage_options_merge_over_the_presets():
    rpp = AlgorithmConfig(name="reinforce_pp", advantage_options={"eps": 1e-8})
    assert rpp.setting("advantage_options") == {"baseline": True, "eps": 1e-8}  # the preset's baseline is kept
    assert AlgorithmConfig(name="dr_grpo", advantage_options={"std_over": "batch"}).setting("advantage_options") == {
        "std_normalize": False, "std_over": "batch"}
    # another advantage than the preset's: the preset's options do not apply to it
    assert AlgorithmConfig(name="reinforce_pp", advantage="grpo").setting("advantage_options") == {}


def test_bad_algorithm_combinations_fail_before_any_work():
    with pytest.raises(ConfigError, match=r"advantage_options.*'grpo' takes no option\(s\) std_normalise; it takes: "
                                          r"eps, std_normalize, std_over"):
        check_algorithm(AlgorithmConfig(name="grpo", advantage_options={"std_normalise": False}))
    check_algorithm(AlgorithmConfig(name="ppo", advantage_options={"lam": 0.9}))  # GAE's options after its tensors
    with pytest.raises(ConfigError, match=r"algorithm.loss.*'dpo' trains on \(chosen, rejected\) pairs .* 'mix'"):
        check_algorithm(AlgorithmConfig(name="mix", loss="dpo"))


def test_every_preset_names_registered_parts():
    for name in ALGORITHM_PRESETS:
        check_algorithm(AlgorithmConfig(name=name))


def test_unknown_advantage_or_loss_fails_with_the_known_names():
    with pytest.raises(ConfigError, match=r"algorithm\.advantage.*unknown advantage 'nope'; known: .*rloo"):
        check_algorithm(load_config(None, ["algorithm.advantage=nope"]).algorithm)
    with pytest.raises(ConfigError, match=r"algorithm\.loss.*known: dpo, mix, opmd, ppo_clip, sft"):
        check_algorithm(load_config(None, ["algorithm.loss=nope"]).algorithm)
    with pytest.raises(ConfigError, match=r"algorithm\.name"):
        load_config(None, ["algorithm.name=magic"])


def test_dynamic_sampling_drops_groups_with_equal_rewards():
    table = pa.table({"group_id": ["a", "a", "b", "b", "c"], "reward": [1.0, 1.0, 0.0, 1.0, 0.5]})
    kept, dropped = drop_zero_variance_groups(table)
    assert dropped == 2  # a (all 1) and c (a group of one)
    assert kept.column("group_id").to_pylist() == ["b", "b"]


def test_stratified_order_gives_every_micro_batch_the_expert_share():
    is_expert = [i % 4 == 0 for i in range(64)]  # 16 of 64
    order = stratified_order(is_expert, 16, random.Random(0))
    assert sorted(order) == list(range(64))  # a permutation: nothing dropped or repeated
    assert [sum(is_expert[i] for i in order[k:k + 16]) for k in range(0, 64, 16)] == [4, 4, 4, 4]
    assert order != stratified_order(is_expert, 16, random.Random(1))  # shuffled within each kind
    uneven = [i < 13 for i in range(50)]  # 13 of 50: cumulative round(13·e/50) at e = 16, 32, 48, 50
    order = stratified_order(uneven, 16, random.Random(0))
    assert [sum(uneven[i] for i in order[k:k + 16]) for k in range(0, 50, 16)] == [4, 4, 4, 1]


def test_staleness_limit_drops_old_experiences():
    table = pa.table({"model_version": [1, 2, 3, 4, 5]})
    kept, dropped = drop_stale(table, current_version=5, max_staleness=2)
    assert kept.column("model_version").to_pylist() == [3, 4, 5] and dropped == 2


def test_dynamic_sampling_counts_informative_groups_and_fills_to_exactly_n():
    table = pa.table({"group_id": ["a", "a", "b", "b", "c", "c", "d", "d"],
                      "reward": [1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.5, 0.0]})
    assert informative_groups(table) == 3  # b, c, d
    kept, _ = drop_zero_variance_groups(table)
    assert first_groups(kept, 2).column("group_id").to_pylist() == ["b", "b", "c", "c"]
    assert first_groups(kept, 5).num_rows == 6


def test_preference_pairs_match_best_with_worst_and_skip_ties():
    table = pa.table({"group_id": ["a"] * 5 + ["b"] * 2 + ["c"] * 2,
                      "reward": [0.0, 1.0, 0.0, 1.0, 0.5, 1.0, 1.0, 0.0, 0.2],
                      "i": list(range(9))})
    pairs, n = preference_pairs(table)
    # a ranked: 1, 3 (1.0), 4 (0.5), 0, 2 (0.0) → (1, 2), (3, 0); 4 is the middle. b: tie → none. c: (8, 7)
    assert n == 3 and pairs.column("i").to_pylist() == [1, 2, 3, 0, 8, 7]
    rewards = pairs.column("reward").to_pylist()
    assert all(c > r for c, r in zip(rewards[0::2], rewards[1::2]))
