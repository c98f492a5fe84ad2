"""Algorithm presets: chosen by name, resolved once into a frozen ``Algorithm``, every part
overridable, unknown names and options refused with the key named."""

import dataclasses

import pytest

from rftflow.components.algorithms import PRESETS, resolve
from rftflow.components.config import ConfigError, load_config


def test_presets_resolve_and_config_keys_override_them():
    dapo = resolve("dapo")
    assert (dapo.clip_high, dapo.clip_low, dapo.dynamic_sampling) == (0.28, 0.2, True)
    assert resolve("dapo", clip_high=0.3).clip_high == 0.3
    dr = resolve("dr_grpo")
    assert dr.advantage_options == {"std_normalize": False} and dr.agg == "seq-mean-token-sum-norm"
    custom = resolve("grpo", advantage="rloo", agg="seq-mean-token-mean")
    assert custom.advantage == "rloo" and custom.loss_options()["agg"] == "seq-mean-token-mean"
    assert not resolve("sft").uses_explorer and resolve("mix").uses_expert
    assert resolve("ppo").needs_critic and resolve("dpo").pairwise and resolve("dpo").needs_reference
    assert resolve("grpo", kl_coef=0.1).needs_reference and not resolve("grpo").needs_reference


def test_the_resolved_algorithm_is_frozen_and_read_by_attribute():
    algorithm = load_config(None, ["algorithm.name=gspo", "algorithm.clip_high=0.001"]).algorithm.resolve()
    assert algorithm.ratio_level == "sequence" and algorithm.clip_high == 0.001 and algorithm.clip_low == 3e-4
    with pytest.raises(dataclasses.FrozenInstanceError):
        algorithm.clip_low = 0.5  # type: ignore[misc]
    with pytest.raises(TypeError):
        algorithm.advantage_options["eps"] = 1.0  # type: ignore[index]


def test_advantage_options_merge_over_the_presets():
    assert resolve("reinforce_pp", advantage_options={"eps": 1e-8}).advantage_options == {"baseline": True, "eps": 1e-8}
    assert resolve("dr_grpo", advantage_options={"std_over": "batch"}).advantage_options == {
        "std_normalize": False, "std_over": "batch"}
    # another advantage than the preset's: the preset's options do not apply to it
    assert resolve("reinforce_pp", advantage="grpo").advantage_options == {}


def test_bad_algorithm_combinations_fail_naming_the_key():
    with pytest.raises(ValueError, match=r"algorithm.advantage_options: 'grpo' takes no option\(s\) std_normalise; "
                                         r"it takes: eps, std_normalize, std_over"):
        resolve("grpo", advantage_options={"std_normalise": False})
    resolve("ppo", advantage_options={"lam": 0.9})  # GAE's options come after its three tensors
    with pytest.raises(ValueError, match=r"algorithm.loss: 'dpo' trains on \(chosen, rejected\) pairs .* 'mix'"):
        resolve("mix", loss="dpo")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_names_registered_parts(name):
    algorithm = resolve(name)
    assert algorithm.loss_fn is not None and (algorithm.advantage is None) == (algorithm.advantage_fn is None)


def test_unknown_advantage_or_loss_fails_with_the_known_names():
    with pytest.raises(ValueError, match=r"algorithm\.advantage: unknown advantage 'nope'; known: .*rloo"):
        resolve("grpo", advantage="nope")
    with pytest.raises(ValueError, match=r"algorithm\.loss: unknown loss 'nope'; known: dpo, mix, opmd, ppo_clip, sft"):
        resolve("grpo", loss="nope")
    with pytest.raises(ConfigError, match=r"algorithm\.name"):
        load_config(None, ["algorithm.name=magic"])


def test_keys_that_left_the_algorithm_section_name_their_new_place():
    with pytest.raises(ConfigError, match=r"'algorithm.expert_per_round' moved to 'buffer.expert_per_round'"):
        load_config(None, ["algorithm.expert_per_round=8"])
    with pytest.raises(ConfigError, match=r"'algorithm.critic_lr' moved to 'trainer.critic_lr'"):
        load_config(None, ["algorithm.critic_lr=1e-3"])
    assert load_config(None, ["buffer.expert_ratio=0.25"]).buffer.expert_ratio == 0.25
