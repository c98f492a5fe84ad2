"""The multi_turn workflow on a GPU with the hf engine, without Prefect, MLflow or the store (a GPU
machine that has torch and transformers needs only pydantic, pyyaml, pyarrow and gymnasium):
episodes token in / token out on CUDA, the behaviour log-probs against the trainer's on every model
token, then a 50-step warm start and GRPO rounds on the guess-number game (32 games × 8 episodes a
round). Prints one JSON line: the card, held-out greedy success before and after, the sampled
success of the first and last 10 rounds, the worst log-prob difference, the seconds.

    python benchmarks/gpu_episodes.py              # 100 rounds
    ROUNDS=2 python benchmarks/gpu_episodes.py     # a short run (also on CPU)
    SMOKE=1 ROUNDS=1 python benchmarks/gpu_episodes.py   # the smallest run (tests): 8 held-out games, 4 a round
"""
import copy, importlib.util, json, statistics, sys, time
print(sys.version.split()[0])
print("missing:", [m for m in ("torch", "transformers", "accelerate", "pydantic", "yaml", "pyarrow", "gymnasium",
                               "safetensors", "numpy") if importlib.util.find_spec(m) is None])
import torch
import os
DEV = "cuda" if torch.cuda.is_available() else "cpu"
ROUNDS = int(os.environ.get("ROUNDS", "100"))
SMOKE = os.environ.get("SMOKE") == "1"
HELD, GAMES, WARM = (8, 4, 2) if SMOKE else (128, 32, 50)  # held-out games, games a round, warm-start steps
CARD = torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu"
print("torch", torch.__version__, CARD)
torch.manual_seed(0)
from rftflow.components.algorithms import resolve
from rftflow.components.config import CampaignConfig, TrainerConfig
from rftflow.components.data.tasksets import _to_task
from rftflow.components.explore.engines import HFRolloutEngine
from rftflow.components.data.builtin_tasks import builtin_task_entries
from rftflow.components.explore.models import load_model
from rftflow.components.explore.workflows import Sampling, make_workflow
from rftflow.components.train.batching import batch_tensors, response_logprobs
from rftflow.components.train.trainer import Trainer
from rftflow.components.verify.rewards import campaign_rewards

cfg = CampaignConfig.model_validate({"taskset": {"source": "builtin:guess_number", "workflow": "multi_turn"},
                                     "reward": {"function": "env_return"}, "workflow": {"max_turns": 6}})
tasks = [_to_task(e, "guess {low}-{high}:") for e in builtin_task_entries("guess_number", {}, 4000, 0)]
train, held = tasks[128:], tasks[:HELD]
model, tok = load_model("builtin:tiny")
engine = HFRolloutEngine(copy.deepcopy(model).to(DEV), tok)
workflow = make_workflow(cfg, tok, reward_fn=campaign_rewards(cfg), context_limit=256)
expert = workflow.expert_table(engine, train, campaign="gpu").to_pylist()
trainer = Trainer(model, tok.pad_token_id, TrainerConfig(micro_batch_size=64, lr=5e-4, min_lr=1e-5),
                  resolve("grpo", lr_scale=0.3))
print("trainer device", trainer.accelerator.device)
start = time.perf_counter()
trainer.warm_start([expert[i:i + 64] for i in range(0, WARM * 64, 64) if expert[i:i + 64]][:WARM], 2e-3)
engine.load_state_dict({k: v.detach().clone() for k, v in trainer.unwrapped.state_dict().items()})
before = workflow.evaluate(engine, held, None, "env_return", 4)["accuracy/held_out"]
success = []
worst = 0.0
for r in range(1, ROUNDS + 1):
    rows = workflow.explore(engine, train[(r - 1) * GAMES % 3800:][:GAMES], campaign="gpu", round_no=r, repeat_times=8,
                            temperature=1.0, max_new_tokens=4, model_version=r).to_pylist()
    for row in rows:
        row["reward"] = float(sum(row["step_rewards"] or ()))
    success.append(statistics.mean(row["reward"] for row in rows))
    if r == 1:  # behaviour log-probs vs the trainer's, on every model token
        batch = {k: v.to(DEV) for k, v in batch_tensors(rows, tok.pad_token_id, None).items()}
        with torch.no_grad():
            ours = response_logprobs(trainer.unwrapped, batch, 1.0).cpu()
        worst = max(abs(float(ours[i, t]) - lp) for i, row in enumerate(rows)
                    for t, (m, lp) in enumerate(zip(row["response_mask"], row["response_logprobs"])) if m)
        print("episodes with environment turns:", sum(0 in row["response_mask"] for row in rows), "of", len(rows),
              "| worst |logprob diff| on model tokens:", f"{worst:.2e}")
    trainer.set_lr(trainer.round_lr(r, ROUNDS))
    trainer.train(rows, [list(range(i, min(i + 64, len(rows)))) for i in range(0, len(rows), 64)])
    engine.load_state_dict({k: v.detach().clone() for k, v in trainer.unwrapped.state_dict().items()})
after = workflow.evaluate(engine, held, None, "env_return", 4)["accuracy/held_out"]
print(json.dumps({"card": CARD, "held_out_before": before, "held_out_after": after,
                  "sampled_success_rounds_1_10": statistics.mean(success[:10]),
                  "sampled_success_last_10_rounds": statistics.mean(success[-10:]),
                  "logprob_worst": worst, "seconds": round(time.perf_counter() - start, 1)}))
