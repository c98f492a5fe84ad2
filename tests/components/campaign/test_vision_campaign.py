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
from rftflow.components.data.images import digest, images_argument

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
    assert campaign.syncs_checked == 2  # after each round, log-probs with the probe's picture included
    processor = campaign.processor
    tasks = campaign.tasks_by_id
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
    # the registered model is a vision-language model directory: it loads and samples as the policy
    from rftflow.components.explore.engines import HFRolloutEngine
    from rftflow.components.explore.models import load_model, load_processor

    model, tokenizer = load_model(str(tmp_path / "run" / "model"))
    saved = load_processor(str(tmp_path / "run" / "model"))
    engine = HFRolloutEngine(model, tokenizer, chat_template=True, processor=saved)
    some = campaign.eval_tasks[:4]
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
