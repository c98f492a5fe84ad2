"""rftflow against TRL's ``GRPOTrainer`` on identical work: samples/s, s/step, peak RSS, accuracy.

The work, the same on both sides: one start model directory, reasoning-gym chain_sum (2 terms, at
most 2 digits, prompt "{expression} ="), 8 prompts x 8 sampled responses per step, temperature 1,
``--tokens`` new tokens at most, GRPO advantages (group mean and std), token-mean clipped loss,
beta = 0 (no reference model), AdamW at a constant lr (``--lr``, 1e-3) with no weight decay, gradient norm
clipped to 1, one optimizer step per step, ``--steps`` steps, in float32 with activations kept (TRL's
defaults of bf16 autocast and gradient checkpointing are turned off: they are other work). Each
side runs in its own process with ``--threads`` torch threads; the figures:

- samples/s: steps x 64 / the wall time of the steps (TRL: ``trainer.train()``; rftflow's round
  loop: ``Campaign.run_round`` for every round; apart: the explorer and the trainer as two processes
  of one torch thread each (``mode: explore`` + ``mode: train`` on one store, the explorer one round
  ahead: one step off-policy, where the other sides are on-policy), from the moment both are ready to
  the trainer's last sync; the flow: ``rftflow run`` as a user runs it, its
  ``rounds_wall_seconds``: from the first round's explore to the last round's sync, Prefect task
  runs, MLflow and state writes included; what the flow does before and after them, start-up and
  the final evaluation, checkpoint and registration, is reported apart; ``flow`` runs the default,
  ``orchestration.task_runs: auto`` (a Prefect task run per stage for the first round, then per stage or per
  k rounds by Prefect's share of that round), ``flow_stage`` a task run per stage throughout
  (``orchestration.task_runs: stage``), ``flow_round`` one per round (``task_runs: round``)); each side runs
  ``--repeats`` times, sides interleaved, and the median is reported with the range (on a shared
  2-core machine one side's runs spread by up to a third);
- peak RSS of the process (apart: of both processes, summed);
- held-out greedy accuracy (the same 200 tasks, rftflow's evaluator) after the steps;
- the mean response length in tokens over the steps: the sides sample their own
  responses, so the work stays identical only while their policies do; at the issue's lr 1e-3
  both lose their accuracy within 40 steps, and their lengths part (``--lr`` sets another rate).

Two more measurements of accuracy instead of speed: ``--replay`` runs TRL and then rftflow's
``Trainer`` on TRL's own batches (prompt and completion ids, advantages) from the same start
weights, printing the largest weight difference after any step (an update equal to TRL's up to
float rounding stays far below one step's size); ``--accuracy-seeds 0,1,...`` runs TRL and the loop
once per seed from one start model and prints their held-out accuracy paired by seed, with the
mean difference and its standard error (a seed draws both the tasks' split and the sampling).

A pretrained model, ``--model builtin:smollm2-135m-instruct`` (or a directory, or a .gguf; de-quantized
once to a Hugging Face directory both sides load): raw-text prompts "Question: what is 47 + 38?
Answer:" scored by math_verify, 4 prompts x 4 responses a step, 10 steps, one run per side per
``--seeds`` seed. TRL's dataset is rftflow's rounds' tasks in order, unshuffled, so both sides sample
the same prompts in the same order (checked: a digest of the prompts' token ids). Beside samples/s it
prints the time of each phase (decode, reward + contract, train, sync, other) and the model FLOPs
(``Tokens.model_flops``: 2 per weight per token forward, 6 forward + backward) per second of
each, against this machine's float32 matmul rate (``matmul_gflops``, measured before and after the
runs), and the held-out accuracy of both on the same 200 tasks, paired by task and seed.
``--sides trl_vllm,vllm`` runs both with vLLM in the side's process: TRL's colocate mode and
rftflow's ``vllm`` engine (each "vs TRL" is against TRL on the same engine); where vLLM is not
installed, the vLLM CPU virtualenv's python runs them (``infra.vllm_server.in_process_python``).
One difference stays: TRL lets vLLM choose its dtype (bfloat16 for this float32 model; TRL 1.16 has
no option for it) and corrects the sampling with importance weights, for which it recomputes the
sampled tokens' log-probs under the trainer's model; rftflow's engine samples in ``model.dtype``.

The start model: ``--init warm`` (default) is ``builtin:tiny`` after 1000 SFT steps on
demonstrations, made once by rftflow and saved as a Hugging Face directory, so accuracy means
something (``--init tiny``: the random ``builtin:tiny``, on which no side learns in 40 steps). The
warm model answers in ~3 tokens whatever the limit, so ``--tokens 32`` alone barely lengthens the
work; long responses are ``--init tiny --tokens 32`` (the random model rarely stops: ~30 tokens).

    pip install -e '.[trl]'
    python benchmarks/vs_trl.py                       # 8 and 32 new tokens, 40 steps, 3 runs per side
    python benchmarks/vs_trl.py --tokens 8 --sides trl,loop,apart
    python benchmarks/vs_trl.py --tokens 8 --lr 3e-5 --replay
    python benchmarks/vs_trl.py --tokens 8 --lr 3e-5 --accuracy-seeds 0,1,2,3,4,5
    python benchmarks/vs_trl.py --model builtin:smollm2-135m-instruct --tokens 32 --lr 1e-6   # seeds 0,1,2
    python benchmarks/vs_trl.py --model builtin:smollm2-135m-instruct --tokens 32 --lr 1e-6 --sides trl_vllm,vllm
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from statistics import mean, median

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "arith-mix.yaml"
PROMPTS, GROUP = 8, 8  # prompts x responses per step (--prompts, --group; a pretrained --model: 4 x 4)
SIDES = ("trl", "loop", "apart", "flow", "flow_stage", "flow_round")
# openai, async: --model only, on a vLLM CPU server; trl_vllm, vllm: --model only, vLLM in the side's process
CHILDREN = (*SIDES, "replay", "openai", "async", "trl_vllm", "vllm")
VLLM_SIDES = ("trl_vllm", "vllm")
LR = 1e-3  # the setting
# a pretrained --model answers in words: its prompt asks a question, math_verify reads its final number
REAL_TASK = ["taskset.prompt_template='Question: what is {expression}? Answer:'", "reward.function=math_verify"]


def work() -> list[str]:
    """The work above as rftflow config keys (over configs/arith-mix.yaml), but for the new tokens."""
    return ["algorithm.name=grpo", "algorithm.lr_scale=1", "buffer.expert_per_round=0",
            f"explorer.tasks_per_round={PROMPTS}", f"explorer.repeat_times={GROUP}",
            "trainer.min_lr=null", "trainer.weight_decay=0.0", f"trainer.micro_batch_size={PROMPTS * GROUP}"]


def overrides(model_dir: str, tokens: int, steps: int, seed: int, threads: int, lr: float = LR,
              real: bool = False) -> list[str]:
    """rftflow's config for one run of the work above (``real``: a pretrained model's task)."""
    task = [*REAL_TASK, f"eval.max_new_tokens={tokens}"] if real else []
    return [f"model.path={model_dir}", *work(), *task, f"trainer.lr={lr}", f"explorer.max_new_tokens={tokens}",
            "trainer.warmup_steps=0", f"rounds={steps}", f"seed={seed}", f"threads={threads}", f"eval.every={steps}",
            f"checkpoint.every={steps}", "promotion.after_campaign=false"]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def taskset_and_reward(cfg):
    """The taskset splits and the reward function rftflow's campaign would use."""
    from rftflow.components.data.tasksets import load_tasks
    from rftflow.components.verify.rewards import campaign_rewards

    return load_tasks(cfg.taskset, cfg.seed, cfg.contracts), campaign_rewards(cfg)


def held_out_scores(model, tokenizer, cfg, tasks, reward_fn) -> list[float]:
    """Each held-out task's reward for the model's greedy response (rftflow's evaluator, the same
    tasks in the same order for every side: a paired comparison)."""
    from rftflow.components.explore.engines import HFRolloutEngine
    from rftflow.components.evaluation import greedy

    return greedy.greedy_scores(HFRolloutEngine(model, tokenizer), tasks, reward_fn, cfg.eval.max_new_tokens)


def accuracy(model, tokenizer, cfg, tasks, reward_fn) -> float:
    return correct_share(held_out_scores(model, tokenizer, cfg, tasks, reward_fn))


def correct_share(scores: list[float]) -> float:
    """Held-out accuracy: the share of rewards of 1."""
    return sum(s >= 1.0 for s in scores) / len(scores)


def matmul_params(model) -> dict[str, int]:
    """The weights a token's forward multiplies by: every linear layer's (``body``) and the LM head's
    (``head``; tied to the embedding or not, it is a matmul, where the embedding is a lookup)."""
    import torch

    head = model.get_output_embeddings()
    body = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head)
    return {"body": body, "head": head.weight.numel()}


class Tokens:
    """What a side's sampler produced, counted the same way on both sides: per group its prompt
    (unique), per row its prompt and response tokens (EOS included)."""

    def __init__(self):
        self.groups = self.prompt_unique = self.prompt_rows = self.response = self.rows = 0
        self.decode_s = 0.0
        self.prompts = hashlib.sha256()  # the prompts' token ids, in order: the same on both sides

    def add_prompts(self, prompts: list[list[int]]) -> None:
        for ids in prompts:
            self.prompts.update(json.dumps(ids).encode())

    def add(self, prompt_lengths: list[int], response_lengths: list[int], group: int) -> None:
        self.groups += len(prompt_lengths) // group
        self.prompt_unique += sum(prompt_lengths[::group])
        self.prompt_rows += sum(prompt_lengths)
        self.response += sum(response_lengths)
        self.rows += len(response_lengths)

    def model_flops(self, params: dict[str, int]) -> dict[str, float]:
        """Model FLOPs of the work (2 per weight per token forward, 6 forward + backward; attention's
        score and value products, 4 x layers x width x context per token, are under 2 % at these
        lengths and left out). Decode: each prompt prefilled once, each response token but the last
        fed back (the LM head on a prompt's last position and on each fed token); train: every row's
        prompt and response through the body, its response through the head."""
        body, head = params["body"], params["head"]
        fed = self.response - self.rows  # response tokens that go back into the model
        return {"decode": 2 * (body * (self.prompt_unique + fed) + head * (self.groups + fed)),
                "train": 6 * (body * (self.prompt_rows + self.response) + head * self.response)}

    def report(self) -> dict:
        return {"groups": self.groups, "prompt_unique": self.prompt_unique, "prompt_rows": self.prompt_rows,
                "response": self.response, "rows": self.rows, "prompts_sha256": self.prompts.hexdigest()}


def trl_trainer(cfg, args):
    """TRL's ``GRPOTrainer`` on the work above, and the pieces to evaluate it."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    taskset, reward_fn = taskset_and_reward(cfg)
    by_prompt = {t.prompt: t for t in taskset.train}

    def reward(prompts, completions, **_):
        return [reward_fn(c, by_prompt[p]) for p, c in zip(prompts, completions)]

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    output_dir = tempfile.mkdtemp(prefix="vs-trl-")
    atexit.register(shutil.rmtree, output_dir, True)  # TRL writes nothing there (save_strategy "no"), but makes it
    config = GRPOConfig(
        output_dir=output_dir, use_cpu=not torch.cuda.is_available(), seed=args.seed, max_steps=args.steps,
        per_device_train_batch_size=PROMPTS * GROUP, num_generations=GROUP, max_completion_length=args.tokens,
        temperature=1.0, top_k=0, top_p=1.0, learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, beta=0.0, num_iterations=1, loss_type="dapo", scale_rewards="group",
        report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        # rftflow trains in float32 and keeps activations: TRL 1.16 defaults to bf16 autocast and gradient
        # checkpointing, which is other work (and bf16 is emulated, ~7x slower, on a CPU without avx512_bf16)
        bf16=False, gradient_checkpointing=False,
        shuffle_dataset=False,  # the prompts of rftflow's rounds, in its order (``rounds_tasks``)
        # trl_vllm: vLLM in this process (colocate), as rftflow's ``vllm`` engine; no sleep mode on either side
        **({"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3,
            "vllm_enable_sleep_mode": False} if args.side == "trl_vllm" else {}),
    )
    data = Dataset.from_list([{"prompt": t.prompt} for t in rounds_tasks(cfg, taskset, args.steps)])
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data, processing_class=tokenizer)
    return trainer, tokenizer, taskset, reward_fn


def rounds_tasks(cfg, taskset, steps: int) -> list:
    """The tasks rftflow's rounds 1..``steps`` explore, in order (its task selector over the same
    train split): TRL's dataset, unshuffled, so step s samples round s's prompts."""
    from rftflow.components.buffer.selectors import select_tasks

    return [t for r in range(1, steps + 1) for t in select_tasks(taskset.train, r, PROMPTS, cfg.seed,
                                                                 selector=cfg.explorer.task_selector)]


def side_trl(cfg, args) -> dict:
    """TRL's ``trainer.train()``, timed by phase: decode (``model.generate``), reward (the reward
    function), train (forward, backward, the optimizer step and the loop around them: all but the
    batch preparation), other (the rest of the preparation: tokenising, advantages); no sync (one
    model samples and trains). ``trl_vllm``: decode is vLLM's ``generate`` (TRL's ``VLLMGeneration``)
    and sync its ``sync_weights`` (the weights into vLLM before each step's sampling); the rest as
    above (with vLLM TRL's preparation also recomputes the sampled tokens' log-probs under the
    trainer's model, for its importance-sampling correction: in other)."""
    import torch

    trainer, tokenizer, taskset, reward_fn = trl_trainer(cfg, args)
    lengths, log = [], trainer.log
    tokens, spent = Tokens(), {"prepare": 0.0, "reward": 0.0, "sync": 0.0}
    eos = torch.tensor(trainer.eos_token_ids)
    model = trainer.model

    def timed(name, fn):
        def call(*a, **kw):
            start = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[name] += time.perf_counter() - start
        return call

    generate = model.generate

    def counted_vllm(prompts, *a, **kw):  # token ids in, (prompt ids, completion ids, log-probs, …) out
        start = time.perf_counter()
        out = vllm_generate(prompts, *a, **kw)
        tokens.decode_s += time.perf_counter() - start
        prompt_ids, completion_ids = out[0], out[1]
        tokens.add([len(p) for p in prompt_ids], [len(c) for c in completion_ids], GROUP)
        tokens.add_prompts([list(p) for p in prompt_ids[::GROUP]])
        return out

    def counted_generate(*a, **kw):  # TRL passes input_ids and attention_mask by name
        start = time.perf_counter()
        out = generate(*a, **kw)
        tokens.decode_s += time.perf_counter() - start
        width = kw["input_ids"].shape[1]
        completion = out[:, width:]
        ended = torch.isin(completion, eos.to(completion.device))
        lengths_ = torch.where(ended.any(1), ended.int().argmax(1) + 1, completion.shape[1])
        tokens.add(kw["attention_mask"].sum(1).tolist(), lengths_.tolist(), GROUP)
        tokens.add_prompts([ids[mask.bool()].tolist() for ids, mask in
                            zip(kw["input_ids"][::GROUP], kw["attention_mask"][::GROUP])])
        return out

    def keep_lengths(logs, *rest):  # TRL keeps a length per step until a log, which clears them
        lengths.extend(trainer._metrics["train"].get("completions/mean_length", []))
        return log(logs, *rest)

    if args.side == "trl_vllm":  # colocate: one vLLM call per step over every prompt's G copies
        vllm = trainer.vllm_generation
        vllm_generate, vllm.generate = vllm.generate, counted_vllm
        vllm.sync_weights = timed("sync", vllm.sync_weights)
    else:
        model.generate = counted_generate
    trainer.reward_funcs[0] = timed("reward", trainer.reward_funcs[0])
    trainer._generate_and_score_completions = timed("prepare", trainer._generate_and_score_completions)
    trainer.log = keep_lengths
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    if args.side != "trl_vllm":
        del model.generate
    scores = held_out_scores(model, tokenizer, cfg, taskset.held_out, reward_fn)
    phases = {"decode": tokens.decode_s, "reward": spent["reward"], "train": seconds - spent["prepare"],
              "sync": spent["sync"], "other": spent["prepare"] - tokens.decode_s - spent["reward"] - spent["sync"]}
    return {"seconds": seconds, "accuracy": correct_share(scores), "scores": scores,
            "response_tokens": mean(lengths) if len(lengths) == args.steps else float("nan"),
            "phases": phases, "tokens": tokens.report(), "flops": tokens.model_flops(matmul_params(model))}


def side_replay(cfg, args) -> dict:
    """TRL's own batches through rftflow's trainer: TRL trains ``--steps`` steps, keeping each step's
    batch (prompt and completion ids, advantages) and its weights before the step; rftflow's
    ``Trainer`` then takes one step on each batch from the same start weights. Returns the largest
    weight difference after any step against the size of one TRL step, and both accuracies."""
    import torch

    from rftflow.components.train.trainer import Trainer

    trainer, tokenizer, taskset, reward_fn = trl_trainer(cfg, args)
    batches, weights = [], []
    compute_loss = trainer._compute_loss

    def keep(model, inputs):
        batches.append({k: v.detach().clone() for k, v in inputs.items() if torch.is_tensor(v)})
        weights.append({k: v.detach().clone() for k, v in trainer.model.state_dict().items()})
        return compute_loss(model, inputs)

    trainer._compute_loss = keep
    trainer.train()
    weights.append({k: v.detach().clone() for k, v in trainer.model.state_dict().items()})
    trl_accuracy = accuracy(trainer.model, tokenizer, cfg, taskset.held_out, reward_fn)

    from transformers import AutoModelForCausalLM

    algorithm = cfg.algorithm.resolve()
    ours = Trainer(AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32), tokenizer.pad_token_id,
                   cfg.trainer, algorithm)
    options, apart, step = algorithm.loss_options(), 0.0, 0.0

    def largest_difference(a: dict, b: dict) -> float:
        return max(float((a[k] - b[k]).abs().max()) for k in a)

    for s, batch in enumerate(batches):
        rows = [{"prompt_ids": batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist(),
                 "response_ids": batch["completion_ids"][i][batch["completion_mask"][i].bool()].tolist(),
                 "source": "explorer"} for i in range(len(batch["prompt_ids"]))]
        ours._step(rows, ours._batch(rows), batch["advantages"].float(), algorithm.loss_fn, options)
        apart = max(apart, largest_difference(ours.unwrapped.state_dict(), weights[s + 1]))
        step = max(step, largest_difference(weights[s], weights[s + 1]))
    return {"steps": len(batches), "largest_weight_difference": apart, "largest_trl_step": step,
            "trl_accuracy": trl_accuracy,
            "replayed_accuracy": accuracy(ours.unwrapped, tokenizer, cfg, taskset.held_out, reward_fn)}


def side_loop(cfg, args) -> dict:
    """rftflow's round loop (``Campaign.stage`` for each stage of each round), timed by phase: decode
    (the engine's ``generate_ids``), reward (verify: rewards and the data contract), train, sync,
    other (the rest of explore, and buffer: the round's Parquet write)."""
    from rftflow.components.campaign.schedule import ROUND, Step
    from rftflow.components.campaign.stages import Campaign

    taskset, reward_fn = taskset_and_reward(cfg)
    with tempfile.TemporaryDirectory() as run_dir:
        campaign = Campaign.from_config(cfg, run_dir)
        campaign.prepare()
        campaign.warm_start()  # no steps: publishes the start weights
        tokens, engine = Tokens(), campaign.engine
        policy = getattr(engine, "model", campaign.trainer.unwrapped)  # a server's: the trainer's, synced to it
        start_scores = held_out_scores(policy, campaign.tokenizer, cfg, taskset.held_out, reward_fn)
        generate_ids = engine.generate_ids

        def counted(encoded, **kw):  # in explore only (the sync check samples a few tokens too: that is sync)
            if not exploring:
                return generate_ids(encoded, **kw)
            start = time.perf_counter()
            groups = generate_ids(encoded, **kw)
            tokens.decode_s += time.perf_counter() - start
            rows = [r for g in groups for r in g]
            tokens.add([len(r.prompt_ids) for r in rows], [len(r.response_ids) for r in rows], kw.get("n", 1))
            tokens.add_prompts([list(ids) for ids in encoded])
            return groups

        engine.generate_ids = counted
        spent, exploring = dict.fromkeys(ROUND, 0.0), False
        start, lengths = time.perf_counter(), []
        for r in range(1, args.steps + 1):
            for step in ROUND:
                exploring = step is Step.EXPLORE
                began = time.perf_counter()
                metrics = campaign.stage(step, r)
                spent[step] += time.perf_counter() - began
                if step is Step.EXPLORE:
                    lengths.append(metrics["rollout/response_len"])
        seconds = time.perf_counter() - start
        del engine.generate_ids
        scores = held_out_scores(policy, campaign.tokenizer, cfg, taskset.held_out, reward_fn)
        phases = {"decode": tokens.decode_s, "reward": spent[Step.VERIFY], "train": spent[Step.TRAIN],
                  "sync": spent[Step.SYNC], "other": spent[Step.EXPLORE] - tokens.decode_s + spent[Step.BUFFER]}
        return {"seconds": seconds, "accuracy": correct_share(scores), "scores": scores,
                "response_tokens": mean(lengths), "phases": phases, "tokens": tokens.report(),
                "start_accuracy": correct_share(start_scores),
                "flops": tokens.model_flops(matmul_params(campaign.trainer.unwrapped))}


def side_apart(cfg, args) -> dict:
    """The explorer and the trainer as two processes (``mode: explore`` and ``mode: train``, one torch
    thread each: the same 2 cores) sharing a file store, weights through it (``sync.method:
    checkpoint``); the explorer runs one round ahead (``sync.offset`` 1), so rows are one step off-policy."""
    with tempfile.TemporaryDirectory(prefix="vs-trl-apart-") as store:
        out, processes = {}, {}
        for role in ("train", "explore"):  # output to files: a full pipe would stall one while the other waits on it
            command, env = side_command("apart", args.model_dir, args.tokens, 1, args, "--role", role, "--store", store)
            logs = [open(Path(store) / f"{role}.{stream}", "w+") for stream in ("out", "err")]
            processes[role] = (subprocess.Popen(command, stdout=logs[0], stderr=logs[1], text=True, env=env, cwd=ROOT),
                               logs)
        try:  # until both end, or one fails: the other would wait for it until sync.timeout_seconds
            while None in codes(processes) and not any(codes(processes)):  # some run, none failed
                time.sleep(0.05)
        finally:
            for process, _ in processes.values():
                if process.poll() is None:
                    process.kill()
                    process.wait()
        killed = -signal.SIGKILL
        for role in sorted(processes, key=lambda r: processes[r][0].returncode in (0, killed)):  # the failed one first
            process, logs = processes[role]
            for log in logs:
                log.seek(0)
            texts = [log.read() for log in logs]
            for log in logs:
                log.close()
            out[role] = printed(*texts, process.returncode, f"apart, {role} process")
    train, explore = out["train"], out["explore"]
    # the rounds can start once both are ready (the trainer's start weights published, the explorer's tasks read)
    start = max(train["ready"], explore["ready"])
    return {"seconds": train["end"] - start, "accuracy": train["accuracy"], "response_tokens": explore["response_tokens"],
            "peak_rss_mb": train["peak_rss_mb"] + explore["peak_rss_mb"]}


def codes(processes: dict) -> list[int | None]:
    """Each process's exit code; None while it runs."""
    return [process.poll() for process, _ in processes.values()]


def apart_role(cfg, args) -> dict:
    """One process of ``side_apart``: ``--role train`` prepares, publishes the start weights, then
    trains and publishes each round once the explorer has committed it; ``--role explore`` waits for
    the taskset, then explores, verifies and stores each round with the newest weights it may use."""
    from rftflow.components.campaign.stages import Campaign

    with tempfile.TemporaryDirectory() as run_dir:
        campaign = Campaign.from_config(cfg, run_dir)
        if args.role == "train":
            campaign.prepare()
            campaign.warm_start()  # no steps: publishes the start weights
            ready = time.time()
            for r in range(1, args.steps + 1):
                campaign.train(r)  # waits for the explorer's round r
                campaign.sync(r)
            return {"ready": ready, "end": time.time(), "accuracy": campaign.evaluate()["accuracy/held_out"]}
        campaign.await_taskset()
        ready, lengths = time.time(), []
        for r in range(1, args.steps + 1):
            lengths.append(campaign.explore(r)["rollout/response_len"])  # waits for the weights it may use
            campaign.verify(r)
            campaign.buffer(r)
        return {"ready": ready, "response_tokens": mean(lengths)}


def side_flow(cfg, args, *more: str) -> dict:
    with tempfile.TemporaryDirectory() as run_dir:
        sets = [a for o in [*overrides(args.model_dir, args.tokens, args.steps, args.seed, args.threads, args.lr,
                                       real=args.model is not None), *args.sets, *more]
                for a in ("--set", o)]
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "rftflow.flows.cli", "run", str(CONFIG), "--run-dir", run_dir,
                               *sets], capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - start
        if done.returncode:
            raise SystemExit(f"rftflow run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        from mlflow import MlflowClient

        from rftflow.flows.orchestration import task_run_span

        lengths = MlflowClient(summary["mlflow_tracking_uri"]).get_metric_history(summary["mlflow_run_id"],
                                                                                  "rollout/response_len")
        return {"seconds": summary["rounds_wall_seconds"], "accuracy": summary["eval_accuracy_after"],
                "outside_rounds_s": wall - summary["rounds_wall_seconds"], "peak_rss_mb": rss,
                "response_tokens": mean(m.value for m in lengths) if lengths else float("nan"),
                "task_runs": task_run_span(summary["task_runs"], summary["rounds_per_task_run"])}


def make_warm_start(model_dir: str, args) -> float:
    """``builtin:tiny`` after 1000 SFT steps on demonstrations (rftflow's warm start), saved to ``model_dir``."""
    from rftflow.components.campaign.stages import Campaign
    from rftflow.components.config import load_config

    cfg = load_config(CONFIG, ["name=vs-trl-warm", f"seed={args.seed}", "trainer.warmup_steps=1000",
                               f"threads={args.threads}", "algorithm.name=grpo", "buffer.expert_per_round=0"])
    with tempfile.TemporaryDirectory() as run_dir:
        campaign = Campaign.from_config(cfg, run_dir)
        campaign.prepare()
        campaign.warm_start()
        campaign.trainer.unwrapped.save_pretrained(model_dir)
        campaign.tokenizer.save_pretrained(model_dir)
        return campaign.evaluate()["accuracy/held_out"]


def child(args) -> None:
    """One side, in this process: prints one JSON line."""
    import torch

    import rftflow.flows  # noqa: F401  (quiet service defaults)
    from rftflow.components.config import load_config

    torch.set_num_threads(args.threads)
    role = [f"mode={args.role}", "sync.method=checkpoint", "sync.offset=1",
            f"storage.url={Path(args.store).as_uri()}"] if args.role else []
    engine = ["explorer.engine=vllm"] if args.side == "vllm" else []  # the loop, rollouts on vLLM in this process
    cfg = load_config(CONFIG, ["name=vs-trl", *overrides(args.model_dir, args.tokens, args.steps, args.seed, args.threads,
                                                         args.lr, real=args.model is not None), *role, *engine,
                               *args.sets])
    server = [] if not args.base_url else ["explorer.engine=openai", f"explorer.base_url={args.base_url}",
                                           "explorer.served_model=model"]
    if server:
        cfg = load_config(CONFIG, ["name=vs-trl", *overrides(args.model_dir, args.tokens, args.steps, args.seed,
                                                             args.threads, args.lr, real=True), *server, *args.sets])
    if args.side in ("openai", "vllm"):  # the loop, rollouts on the server or on vLLM in this process
        result = side_loop(cfg, args)
    elif args.side == "async":  # the flow in async mode: the next round's rollouts beside this round's training
        result = side_flow(cfg, args, *server, "mode=async", "sync.offset=1", "algorithm.max_staleness=1")
    elif args.role:
        result = apart_role(cfg, args)
    else:
        result = {"trl": side_trl, "trl_vllm": side_trl, "loop": side_loop, "apart": side_apart, "flow": side_flow,
                  "replay": side_replay,
                  "flow_stage": lambda cfg, args: side_flow(cfg, args, "orchestration.task_runs=stage"),
                  "flow_round": lambda cfg, args: side_flow(cfg, args, "orchestration.task_runs=round")}[args.side](cfg, args)
    result.setdefault("peak_rss_mb", peak_rss_mb())
    print("RESULT " + json.dumps(result), flush=True)


def run_side(side: str, model_dir: str, tokens: int, args) -> dict:
    command, env = side_command(side, model_dir, tokens, args.threads, args)
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    return printed(done.stdout, done.stderr, done.returncode, f"side {side}")


def side_command(side: str, model_dir: str, tokens: int, threads: int, args, *extra: str) -> tuple[list[str], dict]:
    """The command line and environment of one side's process (``extra``: more arguments)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    python = [sys.executable]
    if side in VLLM_SIDES:  # where vLLM is installed: here (a GPU machine), or the vLLM CPU virtualenv
        from rftflow.infra.vllm_server import in_process_python

        python, env = in_process_python(env)
    return [*python, __file__, "--side", side, "--model-dir", model_dir, "--tokens", str(tokens),
            "--steps", str(args.steps), "--seed", str(args.seed), "--threads", str(threads), "--lr", str(args.lr),
            "--prompts", str(PROMPTS), "--group", str(GROUP), *(["--model", args.model] if args.model else []),
            *(["--base-url", args.base_url] if side in ("openai", "async") else []),
            *(a for s in args.sets for a in ("--set", s)), *extra], env


def printed(stdout: str, stderr: str, returncode: int, what: str) -> dict:
    """The JSON on a child's last ``RESULT`` line; ``SystemExit`` naming ``what`` if it failed."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    if returncode or not lines:
        raise SystemExit(f"{what} failed:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="8,32", help="max new tokens, one setting per value")
    parser.add_argument("--steps", type=int, help="steps per run (default 40; with --model 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=LR, help="the constant learning rate of both sides")
    parser.add_argument("--sides", help=f"default {','.join(SIDES)}; with --model trl,loop")
    parser.add_argument("--repeats", type=int, default=3, help="runs per side and setting; the median is reported")
    parser.add_argument("--init", choices=("warm", "tiny"), default="warm")
    parser.add_argument("--model", metavar="PATH",
                        help="a pretrained model instead of --init (builtin:smollm2-135m-instruct, a directory, a .gguf), "
                             "de-quantized once to a Hugging Face directory both sides load; its task asks "
                             "'Question: what is 47 + 38? Answer:' and math_verify scores it; one run per side per --seeds")
    parser.add_argument("--seeds", default="0,1,2", metavar="S,S,...",
                        help="with --model: the seeds, one run per side each (the sampling and the tasks' split)")
    parser.add_argument("--prompts", type=int, help="prompts per step (default 8; with --model 4)")
    parser.add_argument("--group", type=int, help="responses per prompt (default 8; with --model 4)")
    parser.add_argument("--replay", action="store_true",
                        help="instead of timing: TRL's batches through rftflow's trainer, weights compared step by step")
    parser.add_argument("--accuracy-seeds", metavar="S,S,...",
                        help="instead of timing: TRL and the loop from one start model (--seed's) once per seed "
                             "(the tasks' split and the sampling), accuracy paired by seed")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override of each side's campaign (smoke sizes: taskset.size, ...)")
    parser.add_argument("--side", choices=CHILDREN, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--role", choices=("train", "explore"), help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global PROMPTS, GROUP
    PROMPTS, GROUP = args.prompts or (4 if args.model else PROMPTS), args.group or (4 if args.model else GROUP)
    args.steps = args.steps or (10 if args.model else 40)
    if args.side:
        args.tokens = int(args.tokens)
        return child(args)
    if args.model:
        return compare_on_model(args)

    import rftflow.flows  # noqa: F401
    from rftflow.components.explore.models import resolve_model_path

    sides = (args.sides or ",".join(SIDES)).split(",")
    with tempfile.TemporaryDirectory(prefix="vs-trl-model-") as warm_dir:
        if args.init == "warm":
            import torch

            torch.set_num_threads(args.threads)
            start = time.perf_counter()
            before = make_warm_start(warm_dir, args)
            model_dir = warm_dir
            print(f"start model: builtin:tiny + 1000 SFT steps, held-out accuracy {before:.3f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
        else:
            model_dir = resolve_model_path("builtin:tiny")
        if args.replay:
            return print_replay(run_side("replay", model_dir, int(args.tokens.split(",")[0]), args), args)
        if args.accuracy_seeds:
            return print_accuracy_by_seed(model_dir, args)
        rows = []
        for tokens in (int(t) for t in args.tokens.split(",")):
            runs: dict[str, list[dict]] = {side: [] for side in sides}
            for repeat in range(args.repeats):  # sides interleaved, so a slow spell of the machine hits all
                for side in sides:
                    runs[side].append(r := run_side(side, model_dir, tokens, args))
                    print(f"{tokens} tokens, {side}, run {repeat + 1}/{args.repeats}: "
                          f"{samples_per_s(r['seconds'], args.steps):.0f} samples/s, accuracy {r['accuracy']:.3f}, "
                          f"response tokens {r['response_tokens']:.1f}"
                          + (f", a task run per {r['task_runs']}" if "task_runs" in r else ""), flush=True)
            rows.append((tokens, {side: summarize(rs, args.steps) for side, rs in runs.items()}))
    print(f"\n{args.steps} steps of {PROMPTS} prompts x {GROUP} responses, lr {args.lr:g}, {args.threads} threads, "
          f"seed {args.seed}, start model {args.init}; median of {args.repeats} runs per side (range)\n")
    print("| new tokens | side | samples/s (range) | s/step | peak RSS MB | accuracy | response tokens | vs TRL |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")
    for tokens, results in rows:
        base = results.get("trl", {}).get("samples_per_s")
        for side, r in results.items():
            ratio = f"{r['samples_per_s'] / base:.2f}x" if base else "-"
            print(f"| {tokens} | {side} | {r['samples_per_s']:.0f} ({r['range']}) | {r['seconds'] / args.steps:.3f} | "
                  f"{r['peak_rss_mb']:.0f} | {r['accuracy']:.3f} | {r['response_tokens']:.1f} | {ratio} |")
        for flow in ("flow", "flow_stage", "flow_round"):
            if "loop" in results and flow in results:
                print(f"| {tokens} | {flow} / loop time | {results[flow]['seconds'] / results['loop']['seconds']:.2f} | | "
                      f"| | | before and after the rounds {results[flow]['outside_rounds_s']:.0f} s |")


def matmul_gflops(threads: int, size: int = 2048, repeats: int = 5) -> float:
    """The float32 matmul rate where the sides compute: the best of ``repeats`` (size x size) @
    (size x size) products, 2 size³ FLOPs each, at ``threads`` torch threads (on a GPU, if there
    is one: 8192², TF32 off as in both sides' float32 work)."""
    import torch

    torch.set_num_threads(threads)
    cuda = torch.cuda.is_available()
    size = 8192 if cuda else size
    a, b = (torch.randn(size, size, device="cuda" if cuda else "cpu") for _ in range(2))

    def product() -> None:
        torch.mm(a, b)
        if cuda:
            torch.cuda.synchronize()

    product()
    best = min(_timed(product) for _ in range(repeats))
    return 2 * size ** 3 / best / 1e9


def where() -> str:
    """Where the sides compute, for the printed figures."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"


def _timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def compare_on_model(args) -> None:
    """TRL and rftflow's loop on a pretrained model, one run per side per seed (sides interleaved):
    samples/s, the time and model FLOPs by phase, held-out accuracy paired by task and seed."""
    import rftflow.flows  # noqa: F401  (quiet defaults: before torch imports tqdm)
    import torch
    from rftflow.components.explore.models import load_model

    sides, seeds, tokens = (args.sides or "trl,loop").split(","), [int(s) for s in args.seeds.split(",")], int(args.tokens.split(",")[0])
    scratch = tempfile.TemporaryDirectory(prefix="vs-trl-")  # what the sides and the server leave: removed at the end
    atexit.register(scratch.cleanup)
    os.environ["TMPDIR"] = tempfile.tempdir = scratch.name
    peak = matmul_gflops(args.threads)
    print(f"float32 matmul on {where()}, {args.threads} threads: {peak:.1f} GFLOP/s", flush=True)
    with tempfile.TemporaryDirectory(prefix="vs-trl-model-") as model_dir:
        torch.set_num_threads(args.threads)
        model, tokenizer = load_model(args.model)  # a GGUF de-quantized here once: both sides load this directory
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        del model
        runs: dict[str, list[dict]] = {side: [] for side in sides}
        with ExitStack() as servers:
            if {"openai", "async"} & set(sides):  # one vLLM CPU server for every run that needs one
                from rftflow.infra.vllm_server import start_server

                # on the cores the sides use (vLLM's one-process executor: no worker spinning beside the trainer)
                server = start_server(model_dir, served_model="model", threads=args.threads,
                                      cores=f"0-{args.threads - 1}")
                servers.callback(server.stop)
                args.base_url = server.url
            for seed in seeds:
                for side in sides:
                    r = run_side(side, model_dir, tokens, argparse.Namespace(**{**vars(args), "seed": seed}))
                    runs[side].append(r)
                    print(f"seed {seed}, {side}: {samples_per_s(r['seconds'], args.steps):.2f} samples/s, "
                          f"response tokens {r['response_tokens']:.1f}, accuracy {r['accuracy']:.3f}, phases (s) "
                          f"{json.dumps({k: round(v, 1) for k, v in r.get('phases', {}).items()})}", flush=True)
    peak_after = matmul_gflops(args.threads)
    print(f"\n{args.model}: {args.steps} steps of {PROMPTS} prompts x {GROUP} responses, up to {tokens} new tokens, "
          f"lr {args.lr:g}, beta 0, float32, {where()}, {args.threads} threads, seeds {args.seeds}; matmul peak {peak:.1f} GFLOP/s "
          f"before the runs, {peak_after:.1f} after; medians over seeds (range)\n")
    print("| side | samples/s (range) | response tokens | s/step: decode | reward + contract | train | sync | other "
          "| decode GFLOP/s | train GFLOP/s | model GFLOP/s | % of matmul peak | vs TRL |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for side, rs in runs.items():
        against = "trl_vllm" if side in VLLM_SIDES else "trl"  # TRL on the same rollout engine
        base = median(samples_per_s(r["seconds"], args.steps) for r in runs[against]) if against in runs else None
        rates = [samples_per_s(r["seconds"], args.steps) for r in rs]
        if "phases" not in rs[0]:  # the async flow: its rounds' wall time only
            print(f"| {side} | {median(rates):.2f} ({min(rates):.2f}-{max(rates):.2f}) | "
                  f"{mean(r['response_tokens'] for r in rs):.1f} | | | | | | | | | | "
                  f"{median(rates) / base:.2f}x |" if base else "-")
            continue
        phase = {k: median(r["phases"][k] for r in rs) / args.steps for k in rs[0]["phases"]}
        decode = median(r["flops"]["decode"] / r["phases"]["decode"] for r in rs) / 1e9
        train = median(r["flops"]["train"] / r["phases"]["train"] for r in rs) / 1e9
        model_rate = median((r["flops"]["decode"] + r["flops"]["train"]) / r["seconds"] for r in rs) / 1e9
        ratio = f"{median(rates) / base:.2f}x" if base else "-"
        print(f"| {side} | {median(rates):.2f} ({min(rates):.2f}-{max(rates):.2f}) | "
              f"{mean(r['response_tokens'] for r in rs):.1f} | {phase['decode']:.2f} | {phase['reward']:.2f} | "
              f"{phase['train']:.2f} | {phase['sync']:.2f} | {phase['other']:.2f} | {decode:.1f} | {train:.1f} | "
              f"{model_rate:.1f} | {100 * model_rate / peak:.0f} % | {ratio} |")
    for trl, ours in (("trl", "loop"), ("trl_vllm", "vllm")):
        if {trl, ours} <= runs.keys():
            same = all(t["tokens"]["prompts_sha256"] == lp["tokens"]["prompts_sha256"]
                       for t, lp in zip(runs[trl], runs[ours]))
            print(f"\n{trl} and {ours}: the same prompts, in the same order, in every seed: {'yes' if same else 'NO'}")
            print_paired_accuracy(runs[trl], runs[ours], args.steps)


def print_paired_accuracy(trl: list[dict], loop: list[dict], steps: int) -> None:
    """Held-out accuracy of both sides on the same tasks (per seed), the mean per-task difference
    and its standard error."""
    from statistics import stdev

    differences = [(b >= 1.0) - (a >= 1.0) for t, lp in zip(trl, loop) for a, b in zip(t["scores"], lp["scores"])]
    tasks = len(trl[0]["scores"])
    error = stdev(differences) / len(differences) ** 0.5
    print(f"\nheld-out accuracy after {steps} steps, {tasks} tasks x {len(trl)} seeds, greedy, the same tasks for both: "
          f"start model {mean(r['start_accuracy'] for r in loop):.3f}, after TRL {mean(r['accuracy'] for r in trl):.3f}, "
          f"rftflow {mean(r['accuracy'] for r in loop):.3f}; "
          f"rftflow - TRL {mean(differences):+.3f} (standard error {error:.3f}, paired by task and seed)")


def print_replay(r: dict, args) -> None:
    print(f"\nTRL's {r['steps']} batches (lr {args.lr:g}, seed {args.seed}) through rftflow's trainer from the same start "
          f"weights: largest weight difference after any step {r['largest_weight_difference']:.2e} "
          f"(one TRL step moves a weight by up to {r['largest_trl_step']:.2e}); held-out accuracy TRL "
          f"{r['trl_accuracy']:.3f}, replayed {r['replayed_accuracy']:.3f}")


def print_accuracy_by_seed(model_dir: str, args) -> None:
    """Held-out accuracy after ``--steps`` of TRL and the loop, one run each per seed, paired."""
    from statistics import stdev

    tokens, pairs = int(args.tokens.split(",")[0]), []
    for seed in (int(s) for s in args.accuracy_seeds.split(",")):
        runs = {side: run_side(side, model_dir, tokens, argparse.Namespace(**{**vars(args), "seed": seed}))
                for side in ("trl", "loop")}
        pairs.append((seed, runs["trl"]["accuracy"], runs["loop"]["accuracy"]))
        print(f"seed {seed}: accuracy TRL {pairs[-1][1]:.3f}, loop {pairs[-1][2]:.3f}", flush=True)
    trl, loop = [p[1] for p in pairs], [p[2] for p in pairs]
    differences = [b - a for a, b in zip(trl, loop)]
    error = stdev(differences) / len(differences) ** 0.5 if len(differences) > 1 else float("nan")
    print(f"\n{len(pairs)} seeds, {args.steps} steps, lr {args.lr:g}, {tokens} tokens: mean accuracy TRL {mean(trl):.3f}, "
          f"loop {mean(loop):.3f}; loop - TRL {mean(differences):+.3f} (standard error {error:.3f})")


def summarize(runs: list[dict], steps: int) -> dict:
    """One side's runs: the median seconds (and samples/s from it), the samples/s range, the mean
    accuracy (runs of one seed differ in float order only), the largest peak RSS, the median time outside the rounds."""
    rates = [samples_per_s(r["seconds"], steps) for r in runs]
    seconds = median(r["seconds"] for r in runs)
    out = {"seconds": seconds, "samples_per_s": samples_per_s(seconds, steps), "range": f"{min(rates):.0f}-{max(rates):.0f}",
           "accuracy": mean(r["accuracy"] for r in runs), "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
           "response_tokens": mean(r["response_tokens"] for r in runs)}
    if "outside_rounds_s" in runs[0]:
        out["outside_rounds_s"] = median(r["outside_rounds_s"] for r in runs)
    return out


def samples_per_s(seconds: float, steps: int) -> float:
    return steps * PROMPTS * GROUP / seconds


if __name__ == "__main__":
    main()
