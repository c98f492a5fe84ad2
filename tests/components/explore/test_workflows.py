"""Workflows: episodes token in / token out, masks on the environment's and tools' tokens, the
trainer ignoring them, behaviour log-probs that match the trainer's, and environments that fail
(raise, hang, return garbage) ending in quarantine with their reason while the campaign goes on."""

from __future__ import annotations

import copy
import json
import time

import gymnasium as gym
import pytest
import torch

from rftflow.components.config import WorkflowConfig
from rftflow.components.data.contracts import ContractBounds, check_experiences
from rftflow.components.data.builtin_tasks import builtin_task_entries
from rftflow.components.explore.workflows import Sampling
from rftflow.components.explore.workflows.episodes import ChatFormat
from rftflow.components.train.batching import batch_tensors, response_logprobs
from tests.components.conftest import GUESS, TOOLS, _setup

@pytest.mark.parametrize("config", [GUESS, TOOLS], ids=["multi_turn", "tool_use"])
def test_episode_ids_are_the_engines_own_plus_the_environments_and_the_mask_is_zero_on_the_environments(warm, config):
    torch.manual_seed(0)
    cfg, engine, workflow, tasks = _setup(warm, config)
    experts = workflow.experts(tasks[:4], engine)  # expert episodes: turns of every kind, reaching the end
    sampled = [e for g in workflow.run(tasks[:4], engine, n=2, sampling=Sampling(max_new_tokens=90 if config is TOOLS
                                                                                 else 4)) for e in g]
    fmt = ChatFormat(warm[1], chat_template=False)
    assert any(t["role"] != "assistant" for e in sampled for t in e.turns) or config is TOOLS
    for episode in [*experts, *sampled]:
        assert len(episode.ids) == len(episode.mask) == len(episode.logprobs)
        rebuilt, mask = [], []
        for turn in episode.turns:
            ids = episode.ids[turn["start"]:turn["end"]]
            if turn["role"] == "assistant":
                mask += [1] * len(ids)
            else:  # the environment's or tool's turn: its own rendering, never the model's
                assert ids == fmt.turn_ids(turn["role"], turn["content"])
                assert all(lp == 0.0 for lp in episode.logprobs[turn["start"]:turn["end"]])
                mask += [0] * len(ids)
            rebuilt += ids
        assert rebuilt == episode.ids and mask == episode.mask
    assert any(0 in e.mask for e in experts)  # environment tokens occur
    # sampled model turns are exactly the ids the engine returned for exactly that context
    returned: dict[tuple, list] = {}
    for encoded, out in engine.calls:
        for ctx, (r,) in zip(encoded, out):
            returned.setdefault(tuple(ctx), []).append((r.response_ids, r.logprobs))
    for episode in sampled:
        for turn in (t for t in episode.turns if t["role"] == "assistant"):
            context = tuple(episode.prompt_ids + episode.ids[:turn["start"]])
            ours = (episode.ids[turn["start"]:turn["end"]], episode.logprobs[turn["start"]:turn["end"]])
            assert ours in returned[context]


def _episode_rows(workflow, engine, tasks, n: int, max_new_tokens: int) -> list[dict]:
    table = workflow.explore(engine, tasks, campaign="c", round_no=1, repeat_times=n, temperature=1.0,
                             max_new_tokens=max_new_tokens, model_version=0)
    return table.to_pylist()


def test_the_trainers_logprobs_match_the_behaviour_logprobs_on_every_model_token(warm):
    """hf engine, multi-turn episodes: log-probs recomputed over the whole episode (the
    environment's tokens in the context) agree with those recorded while sampling."""
    torch.manual_seed(1)
    cfg, engine, workflow, tasks = _setup(warm, GUESS)
    rows = _episode_rows(workflow, engine, tasks[:6], n=4, max_new_tokens=4)
    assert any(0 in r["response_mask"] for r in rows)
    batch = batch_tensors(rows, warm[1].pad_token_id, None)
    with torch.no_grad():
        ours = response_logprobs(engine.model, batch, 1.0)  # (B, R)
    worst = 0.0
    for i, r in enumerate(rows):
        for t, (m, lp) in enumerate(zip(r["response_mask"], r["response_logprobs"])):
            if m:
                worst = max(worst, abs(float(ours[i, t]) - lp))
    assert worst < 1e-3, worst


def test_changing_only_masked_tokens_logprobs_leaves_the_loss_and_the_update_unchanged(warm):
    from rftflow.components.algorithms import resolve
    from rftflow.components.config import TrainerConfig
    from rftflow.components.train.trainer import Trainer

    torch.manual_seed(2)
    cfg, engine, workflow, tasks = _setup(warm, GUESS)
    rows = _episode_rows(workflow, engine, tasks[:4], n=4, max_new_tokens=4)
    for k, r in enumerate(rows):  # rewards that differ within each group, so advantages are not 0
        r["reward"] = float(k % 2)
    assert any(0 in r["response_mask"] for r in rows)
    changed = copy.deepcopy(rows)
    for r in changed:  # behaviour log-probs of environment tokens: garbage
        r["response_logprobs"] = [lp if m else -50.0 * (t + 1) for t, (m, lp) in
                                  enumerate(zip(r["response_mask"], r["response_logprobs"]))]
    results = []
    for batch in (rows, changed):
        trainer = Trainer(copy.deepcopy(warm[0]), warm[1].pad_token_id, TrainerConfig(micro_batch_size=16),
                          resolve("grpo"))
        metrics = trainer.train(batch, [list(range(len(batch)))])
        results.append((metrics, {k: v.clone() for k, v in trainer.unwrapped.state_dict().items()}))
    (m1, w1), (m2, w2) = results
    assert m1["loss/total"] == pytest.approx(m2["loss/total"], abs=1e-7)
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    # and the same change on model tokens does move it (the test can fail)
    moved = copy.deepcopy(rows)
    for r in moved:
        r["response_logprobs"] = [lp - 1.0 if m else lp for m, lp in zip(r["response_mask"], r["response_logprobs"])]
    trainer = Trainer(copy.deepcopy(warm[0]), warm[1].pad_token_id, TrainerConfig(micro_batch_size=16),
                      resolve("grpo"))
    assert trainer.train(moved, [list(range(len(moved)))])["loss/total"] != pytest.approx(m1["loss/total"], abs=1e-6)


def test_tool_errors_return_to_the_model_and_are_counted(tiny):
    def slow(x: int) -> str:
        """Sleep.

        Args:
            x: ignored
        """
        time.sleep(5)
        return "late"

    def broken(x: int) -> str:
        """Raise.

        Args:
            x: ignored
        """
        raise ValueError("no such thing")

    cfg, engine, workflow, tasks = _setup(tiny, TOOLS)
    workflow.cfg = WorkflowConfig(timeout_seconds=0.3)
    workflow.tools |= {"slow": slow, "broken": broken}
    from rftflow.components.explore.workflows.episodes import Episode

    episode = Episode(tasks[0], [1, 2, 3], turns=[])
    episode.text = ('<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
                    '<tool_call>{"name": "nope", "arguments": {}}</tool_call><tool_call>{bad json</tool_call>'
                    '<tool_call>{"name": "broken", "arguments": {"x": 1}}</tool_call>'
                    '<tool_call>{"name": "slow", "arguments": {"x": 1}}</tool_call>')
    start = time.monotonic()
    workflow.act(episode)
    assert time.monotonic() - start < 3
    content = episode.turns[-1]["content"]
    assert "<tool_response>42</tool_response>" in content
    assert "unknown tool 'nope'" in content and "not valid JSON" in content and "no such thing" in content
    assert "did not return within 0.3 s" in content
    assert (episode.tool_calls, episode.tool_errors) == (5, 4) and not episode.done
    assert episode.mask == [0] * len(episode.ids)


def test_chat_format_appends_what_the_template_puts_between_two_assistant_turns(tiny):
    tokenizer = copy.deepcopy(tiny[1])
    tokenizer.chat_template = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<eos>\n{% endfor %}"
                               "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    text = ChatFormat(tokenizer, chat_template=True).turn_text("user", "higher")
    assert text == "\n<|user|>higher<eos>\n<|assistant|>"


class FlakyEnv(gym.Env):
    """Guess-number-like, failing on purpose by the task's secret: 1-8 raises, 9-16 hangs, 17-24
    returns garbage, the rest behave."""

    def reset(self, *, seed=None, options=None):
        self.secret = int(options["task"]["metadata"]["secret"])
        return "", {}

    def step(self, action):
        if self.secret <= 8:
            raise RuntimeError("the game server crashed")
        if self.secret <= 16:
            time.sleep(30)
        if self.secret <= 24:
            return None, "much", False, False, {}
        return "done", 0.0, True, False, {}


def test_environments_that_raise_hang_or_return_garbage_are_quarantined_with_their_reason(warm, tmp_path):
    from rftflow.components.campaign.stages import Campaign

    config = {**GUESS, "name": "flaky", "rounds": 1, "threads": 1, "model": {"path": str(warm[2])},
              "taskset": {**GUESS["taskset"], "size": 200, "eval_size": 4},
              "workflow": {"environment": f"{__name__}:FlakyEnv", "timeout_seconds": 0.5, "max_turns": 2},
              "explorer": {"tasks_per_round": 16, "repeat_times": 2, "max_new_tokens": 4},
              "algorithm": {"name": "grpo"}, "buffer": {"expert_per_round": 0}, "contracts": {"max_bad_fraction": 1.0},
              "trainer": {"warmup_steps": 0, "micro_batch_size": 32}}
    campaign = Campaign.from_config(config, tmp_path / "run")
    campaign.prepare()
    campaign.warm_start()
    start = time.monotonic()
    metrics = campaign.run_round(1)
    assert time.monotonic() - start < 25  # the hung steps were given up on, not waited for
    campaign.store.flush()
    quarantined = campaign.store.read_kind("quarantine", 1)
    reasons = quarantined.column("reason").to_pylist()
    secrets = {t.task_id: t.metadata["secret"] for t in campaign.splits.train}
    by_kind = {"raised": 0, "hung": 0, "garbage": 0}
    for tid, reason in zip(quarantined.column("task_id").to_pylist(), reasons):
        s = secrets[tid]
        if s <= 8:
            assert reason.startswith("episode failed: the environment's step raised RuntimeError: the game server crashed")
            by_kind["raised"] += 1
        elif s <= 16:
            assert reason.startswith("episode failed: the environment's step did not return within 0.5 s"), reason
            by_kind["hung"] += 1
        elif s <= 24:
            assert reason.startswith("episode failed: the environment's step returned (None, 'much'"), reason
            by_kind["garbage"] += 1
    explored = campaign.store.read_staging(1, "rollouts")
    bad_secrets = sum(secrets[t] <= 24 for t in explored.column("task_id").to_pylist())
    # every episode of a failing environment is quarantined, none stored with a reward; the rest go on
    assert quarantined.num_rows == bad_secrets and all(by_kind.values()), by_kind
    assert metrics["buffer/usual_rows"] == explored.num_rows - bad_secrets and metrics["train/steps"] >= 1
    assert metrics["episode/errors"] == bad_secrets and metrics["episode/timeouts"] == by_kind["hung"]


def test_the_contract_rejects_a_mask_that_does_not_follow_the_turns(tiny):
    cfg, engine, workflow, tasks = _setup(tiny, GUESS)
    table = workflow.expert_table(engine, tasks[:3], campaign="c")
    rows = table.to_pylist()
    rows[0]["response_mask"] = [1] * len(rows[0]["response_ids"])  # environment tokens marked as the model's
    rows[1]["turns"][1]["start"] += 1  # a gap between turns
    from rftflow.components.data.experience import to_table

    verdict = check_experiences(to_table(rows), ContractBounds(), kind="expert")
    assert verdict.counts == {"rows": 3, "accepted": 1, "quarantined": 2}
    assert all("turns_consistent" in r for r in verdict.quarantined.column("reason").to_pylist())
    assert verdict.accepted.column("experience_id").to_pylist() == [rows[2]["experience_id"]]


def test_greedy_scores_promotion_compares_are_the_episodes_returns(warm):
    """Promotion counts solved held-out tasks from ``greedy_scores``: for a game, its return."""
    from rftflow.components.verify.rewards import make_rewards

    cfg, engine, workflow, tasks = _setup(warm, GUESS)
    reward_fn = make_rewards(cfg.reward, cfg.taskset)
    scores = workflow.greedy_scores(engine, tasks[:16], reward_fn, "env_return", 4)
    accuracy = workflow.evaluate(engine, tasks[:16], reward_fn, "env_return", 4)["accuracy/held_out"]
    assert 0 < sum(s >= 1.0 for s in scores) == round(accuracy * 16)


class SlowEnv(gym.Env):
    """Never ends on its own; each step takes 0.3 s."""

    def reset(self, *, seed=None, options=None):
        return "", {}

    def step(self, action):
        time.sleep(0.3)
        return "higher", 0.0, False, False, {}


def test_episode_seconds_ends_a_rounds_episodes_as_timeouts_and_they_are_not_failures(warm):
    from rftflow.components.verify.check import check_round
    from rftflow.components.verify.rewards import make_rewards

    config = {**GUESS, "workflow": {"environment": f"{__name__}:SlowEnv", "max_turns": 8, "episode_seconds": 0.5}}
    cfg, engine, workflow, tasks = _setup(warm, config)
    start = time.monotonic()
    table = workflow.explore(engine, tasks[:4], campaign="c", round_no=1, repeat_times=2, temperature=1.0,
                             max_new_tokens=4, model_version=0)
    elapsed = time.monotonic() - start
    infos = [json.loads(i) for i in table.column("info").to_pylist()]
    assert len(infos) == 8 and elapsed < 0.5 + 2 * 0.3 + 5  # not 8 turns of 0.3 s
    assert max(i["turns"] for i in infos) < 8 and not any(i["success"] for i in infos)
    assert any(i["timed_out"] for i in infos)  # the round's budget ended them (others: a turn cut at 4 tokens)
    assert not any("error" in i for i in infos)  # a round's budget truncates episodes; nothing failed
    checked = check_round(table, {t.task_id: t for t in tasks}, make_rewards(cfg.reward, cfg.taskset), "env_return",
                          ContractBounds(), [], seed=0)
    assert checked.verdict.quarantined.num_rows == 0  # kept, with the reward they earned


def test_the_calculator_taskset_draws_operands_from_min_value_and_names_its_operator():
    entries = builtin_task_entries("calculator", {"min_value": 34, "style": "plain"}, 200, seed=0)
    for e in entries:
        a, rest = e["metadata"]["expression"].split("*")
        b, c = rest.replace("-", "+").split("+")
        assert 34 <= int(a) <= 99 and 34 <= int(b) <= 99 and 11 <= int(c) <= 99
        assert e["metadata"]["operator"] in e["metadata"]["expression"] and len(e["answer"]) == 4
    assert {e["metadata"]["operator"] for e in entries} == {"+", "-"}
    with pytest.raises(ValueError, match=r"params.min_value must be from 1 to params.max_value \(99\), got 120"):
        builtin_task_entries("calculator", {"min_value": 120}, 1, seed=0)
