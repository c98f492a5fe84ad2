"""A vision campaign from the shipped config, cut to a few rounds: warm start, GRPO rounds, sync
checks with pictures; every stored row holds the picture its task showed, each picture one object
in the store, shown and exported by ``rftflow buffer``; the model it registers is a model directory
with its processor, which samples as the trained policy does."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rftflow.components.campaign.preflight import preflight
from rftflow.components.campaign.run import CampaignRun
from PIL import Image

from rftflow.components.data.images import digest, images_argument, task_images

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "vision-tiny.yaml"
SMALL = ("rounds=2", "taskset.size=200", "taskset.eval_size=10", "trainer.warmup_steps=6", "trainer.warmup_until=null",
         "trainer.micro_batch_size=16", "explorer.tasks_per_round=4", "explorer.repeat_times=4", "eval.every=2",
         "checkpoint.every=2", "sync.check_logprobs_every=1")


def test_a_vision_campaign_trains_on_rows_that_keep_their_pictures(tmp_path):
    run = CampaignRun(preflight(CONFIG, tmp_path / "run", SMALL))
    run.run()
    campaign = run.campaign
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["accuracy_by"] == "share of responses with vision ≥ 1"
    assert campaign.sync_check.done == 2  # after each round, log-probs with the probe's picture included
    processor = campaign.processor
    tasks = campaign.splits.by_id
    for kind in ("usual", "expert"):
        rows = campaign.store.read_kind(kind).to_pylist()
        assert rows
        for row in rows:
            [image] = row["images"]
            assert image["sha256"] == digest(image["data"]) == tasks[row["task_id"]].metadata["images"][0]["sha256"]
            assert row["prompt_ids"].count(processor.image_token_id) == processor.image_seq_len
            assert row["domain"] == "vision" or kind == "expert"
    # each picture is one object in the store, however many rows (a group of 4, the gold answer) show it
    shown = {row["images"][0]["sha256"] for kind in ("usual", "expert") for row in campaign.store.read_kind(kind).to_pylist()}
    assert sorted(campaign.store.picture_keys()) == sorted(f"images/{sha}" for sha in shown)
    _buffer_verbs_show_and_export_the_pictures(tmp_path / "run", tmp_path / "usual.jsonl")
    # each evaluation shows 8 held-out tasks in MLflow: their pictures, greedy answers and rewards
    from rftflow.components.verify.vision import vision_answer

    artifacts = Path(run.tracker.artifact_uri.removeprefix("file://"))
    assert run.answers_shown == {0: ["answers/round-0000-pictures.json"], 2: ["answers/round-0002-pictures.json"]}
    table = json.loads((artifacts / "answers" / "round-0002-pictures.json").read_text())
    assert table["columns"] == ["taskset", "task_id", "prompt", "picture", "answer", "reward"]
    assert [row[1] for row in table["data"]] == [t.task_id for t in campaign.splits.eval[:8]]
    held_out = {t.task_id: t for t in campaign.splits.eval}
    for _, task_id, _, picture, answer, reward in table["data"]:
        shown = Image.open(artifacts / picture["filepath"]).convert("RGB")
        assert shown.tobytes() == task_images(held_out[task_id])[0].tobytes()
        assert reward == vision_answer(answer, held_out[task_id])
    # the registered model is a vision-language model directory: it loads and samples as the policy
    from rftflow.components.explore.engines import HFRolloutEngine
    from rftflow.components.explore.models import load_model, load_processor

    model, tokenizer = load_model(str(tmp_path / "run" / "model"))
    saved = load_processor(str(tmp_path / "run" / "model"))
    engine = HFRolloutEngine(model, tokenizer, chat_template=True, processor=saved)
    some = campaign.splits.eval[:4]
    args = dict(**images_argument(some), n=1, max_new_tokens=6, greedy=True)
    ours = engine.generate([t.prompt for t in some], **args)
    policy = HFRolloutEngine(campaign.trainer.unwrapped, campaign.tokenizer, chat_template=True, processor=processor)
    with torch.no_grad():
        theirs = policy.generate([t.prompt for t in some], **args)
    assert [g[0].response_ids for g in ours] == [g[0].response_ids for g in theirs]


def _buffer_verbs_show_and_export_the_pictures(run_dir: Path, out: Path) -> None:
    """``rftflow buffer show`` names each row's picture; ``export`` writes it as a data: URL a taskset takes."""
    from typer.testing import CliRunner

    from rftflow.components.data.image_sources import image_entries
    from rftflow.flows.cli import app

    shown = CliRunner().invoke(app, ["buffer", "show", str(run_dir), "--limit", "2"], env={"COLUMNS": "400"})
    assert shown.exit_code == 0 and shown.stdout.count("images/") >= 2, shown.stdout
    exported = CliRunner().invoke(app, ["buffer", "export", str(run_dir), "--out", str(out)])
    assert exported.exit_code == 0, exported.stdout
    for line in out.read_text().splitlines():
        row = json.loads(line)
        [image] = row["images"]
        [entry] = image_entries(image["data"], out.parent, 1 << 20)
        assert entry["sha256"] == image["sha256"] and image["key"] == f"images/{image['sha256']}"


MIXTURE = [  # pictures and sums in one campaign: the VLM reads both
    {"name": "pictures", "weight": 1, "reward": "vision", "taskset": {"eval_size": 8}},
    {"name": "sums", "weight": 1, "reward": "score_answer",
     "taskset": {"source": "reasoning_gym:chain_sum", "params": {}, "domain": None, "prompt_template": "{expression} =",
                 "eval_size": 8}},
]


def test_lora_on_a_vision_language_model_over_a_text_and_vision_mixture(tmp_path):
    """``model.lora`` on the VLM, a mixture of a picture taskset and a text one: adapters on the text
    decoder only (the image encoder and connector stay the base's), the explorer's log-probs with
    pictures checked after each round's sync, each part's rows stored (pictures only on its own) and
    its reward and held-out accuracy tracked; the registered version, merged into its registered
    base, is the trained policy."""
    import yaml
    from mlflow import MlflowClient

    import rftflow
    from rftflow.components.train.adapters import merged_weights

    config = yaml.safe_load(CONFIG.read_text()) | {"mixture": MIXTURE}
    run = CampaignRun(preflight(config, tmp_path / "run", (*SMALL, "model.lora.rank=8")))
    run.run()
    campaign = run.campaign
    policy = campaign.trainer.unwrapped
    adapted = {name.split(".lora_A")[0] for name, _ in policy.named_parameters() if ".lora_A" in name}
    assert adapted and all(".text_model." in name for name in adapted), sorted(adapted)
    assert campaign.sync_check.done == 2
    rows = campaign.store.read_kind("usual").to_pylist()
    parts = {campaign.splits.by_id[row["task_id"]].metadata["taskset"]: bool(row["images"]) for row in rows}
    assert parts == {"pictures": True, "sums": False}
    client = MlflowClient(f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    metrics = client.get_run(run.tracker.run_id).data.metrics
    by_taskset = json.loads((tmp_path / "run" / "summary.json").read_text())["eval_accuracy_by_taskset"]
    for part in ("pictures", "sums"):
        assert f"reward/{part}/mean" in metrics and f"accuracy/{part}/held_out" in metrics, sorted(metrics)
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.tracker.run_id,
                                                                              f"accuracy/{part}/held_out"))
        assert [step for step, _ in history] == [0, 2]  # before the rounds, after the last
        assert by_taskset[part] == {"before": history[0][1], "after": history[-1][1]}

    merged = merged_weights(policy)
    base = policy.get_base_model().state_dict()
    for name, tensor in base.items():  # the picture side is the base's, bit for bit
        if ".vision_model." in name or ".connector." in name:
            assert torch.equal(merged[name.replace(".base_layer.", ".")], tensor)
    assert any(not torch.equal(merged[k], base[k.replace("q_proj.", "q_proj.base_layer.")])
               for k in merged if ".text_model." in k and k.endswith("q_proj.weight"))  # the adapter moved them
    model, _ = rftflow.load_registered_model("models:/vision-tiny/1", f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    registered = model.state_dict()
    assert registered.keys() == merged.keys() and all(torch.equal(registered[k], merged[k]) for k in merged)
