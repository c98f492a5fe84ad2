"""A learning claim tested by learning: with a fixed seed, GRPO alone raises the reward."""

import json
import statistics
from pathlib import Path

import pytest

from rftflow.components.campaign.stages import Campaign


def comparison_tasks(path: Path) -> Path:
    """"a?b" → "<" or ">" for distinct digits: easy to learn, and half right by chance."""
    rows = [{"question": f"{a}?{b}", "answer": "<" if a < b else ">"} for a in range(10) for b in range(10) if a != b]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow
def test_grpo_raises_reward_on_an_easy_task(tmp_path, default_config):
    campaign = Campaign.from_config(default_config, tmp_path, [
        "name=learn", "seed=0", f"taskset.source={comparison_tasks(tmp_path / 'cmp.jsonl')}",
        "taskset.eval_size=10", "taskset.prompt_template={question}=", "reward.function=exact_match",
        "algorithm.name=grpo", "algorithm.lr_scale=1", "trainer.lr=1e-3", "trainer.micro_batch_size=32", "trainer.warmup_steps=10",
        "explorer.tasks_per_round=16", "explorer.repeat_times=8", "explorer.max_new_tokens=3",
    ])
    campaign.prepare()
    campaign.warm_start()  # 10 SFT steps teach the answer format only: about half right by chance
    rewards = [campaign.run_round(r)["reward/mean"] for r in range(1, 31)]
    first, last = statistics.mean(rewards[:5]), statistics.mean(rewards[-5:])
    print(f"reward: first 5 rounds {first:.3f} → last 5 rounds {last:.3f}")
    assert last > first + 0.25


@pytest.mark.slow
def test_grpo_on_episodes_raises_the_success_of_a_multi_turn_game(tmp_path):
    """configs/guess-number.yaml at 40 rounds of 16 games (the config plays 32), seed 0: the
    policy's own episodes (their success is the reward; the environment's tokens are masked) win
    more often after GRPO than before, and so does the greedy policy on held-out games."""
    config = Path(__file__).resolve().parents[3] / "configs" / "guess-number.yaml"
    campaign = Campaign.from_config(config, tmp_path,
                                    ["seed=0", "rounds=40", "threads=1", "explorer.tasks_per_round=16"])
    campaign.prepare()
    campaign.warm_start()  # 50 SFT steps on binary-search games
    held_out_before = campaign.evaluate()["accuracy/held_out"]
    success = [campaign.run_round(r)["episode/success"] for r in range(1, 41)]
    held_out_after = campaign.evaluate()["accuracy/held_out"]
    first, last = statistics.mean(success[:10]), statistics.mean(success[-10:])
    print(f"episode success: rounds 1-10 {first:.3f} → 31-40 {last:.3f}; "
          f"held-out greedy {held_out_before:.3f} → {held_out_after:.3f}")
    assert last >= first + 0.05, (first, last, success)
    assert held_out_after > held_out_before, (held_out_before, held_out_after)


@pytest.mark.slow
def test_grpo_with_a_calculator_tool_raises_held_out_accuracy(tmp_path):
    """configs/calculator-tools.yaml at 10 rounds (the config runs 20), seed 1: the warm start stops
    once the greedy policy solves 60% of the addition and of the subtraction problems among 64
    training problems, and GRPO on the policy's own episodes (tool responses masked) then raises the
    sampled reward and the greedy accuracy on held-out problems."""
    config = Path(__file__).resolve().parents[3] / "configs" / "calculator-tools.yaml"
    campaign = Campaign.from_config(config, tmp_path, ["seed=1", "rounds=10", "threads=1"])
    campaign.prepare()
    warm = campaign.warm_start()
    held_out_before = campaign.evaluate()["accuracy/held_out"]
    rewards = [campaign.run_round(r)["reward/mean"] for r in range(1, 11)]
    held_out_after = campaign.evaluate()["accuracy/held_out"]
    first, last = statistics.mean(rewards[:3]), statistics.mean(rewards[-3:])
    print(f"warm start: {warm['warmup/steps']:.0f} steps, check {warm['warmup/check_accuracy']:.3f}; sampled "
          f"reward rounds 1-3 {first:.3f} → 8-10 {last:.3f}; held-out greedy {held_out_before:.3f} → {held_out_after:.3f}")
    assert warm["warmup/check_accuracy"] >= 0.6 and warm["warmup/steps"] < 600  # it stopped at the check
    assert last >= first + 0.05, (first, last, rewards)
    assert held_out_after > held_out_before, (held_out_before, held_out_after, rewards)
