"""Promotion through the MLflow registry: a clearly better challenger takes the ``champion`` alias;
an equal one and a clearly worse one do not; every decision is tagged on the versions. The last
step goes through ``rftflow promote`` (the ``promote_model`` flow), which prints one line."""

from __future__ import annotations

import json
import re

import pytest
import torch

pytestmark = pytest.mark.slow

# "a?b" → "<" or ">": a few SFT steps turn an untrained model (accuracy 0) into one that answers
TASKS = [{"question": f"{a}?{b}", "answer": "<" if a < b else ">"} for a in range(10) for b in range(10) if a != b]


def comparison(tmp_path, registered: str) -> tuple[str, list[str]]:
    """(tracking URI, overrides) of one-round campaigns on ``TASKS`` registering ``registered``,
    promoted by hand (the floor at 0)."""
    tasks = tmp_path / "compare.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return uri, ["rounds=1", f"taskset.source={tasks}", "taskset.eval_size=40", "taskset.prompt_template={question}=",
                 "reward.function=exact_match", "explorer.max_new_tokens=3", "eval.max_new_tokens=3",
                 "trainer.micro_batch_size=16", "explorer.tasks_per_round=4", "explorer.repeat_times=4",
                 "buffer.expert_per_round=16", f"tracking.uri={uri}", f"tracking.registered_model={registered}",
                 "promotion.min_accuracy=0", "promotion.after_campaign=false"]


def test_only_a_clearly_better_challenger_becomes_champion(prefect_api, tmp_path, default_config, monkeypatch):
    from mlflow import MlflowClient
    from typer.testing import CliRunner

    from rftflow.components.campaign.preflight import preflight
    from rftflow.components.campaign.promotion import promote
    from rftflow.components.campaign.run import CampaignRun
    from rftflow.flows.cli import app

    uri, campaign = comparison(tmp_path, "compare")

    def train(name: str, steps: int) -> dict:
        return CampaignRun(preflight(default_config, tmp_path / name, [*campaign, f"name={name}",
                                                                       f"trainer.warmup_steps={steps}"])).run()

    weak, strong = train("weak", 0), train("strong", 150)  # versions 1 and 2
    assert weak["eval_accuracy_after"] < 0.2 < 0.6 < strong["eval_accuracy_after"]
    client = MlflowClient(uri, registry_uri=uri)
    source = {str(v.version): v.source for v in client.search_model_versions("name='compare'")}
    equal = str(client.create_model_version("compare", source["2"]).version)  # the strong model again: version 3
    worse = str(client.create_model_version("compare", source["1"]).version)  # the weak one again: version 4
    weak_config = [*campaign, "name=weak", "trainer.warmup_steps=0"]  # promotion reads the weak campaign's run dir
    checked = preflight(default_config, tmp_path / "weak", weak_config)

    first = promote(checked, "1")  # no champion yet: the floor (0 here) decides
    assert first.promoted and str(client.get_model_version_by_alias("compare", "champion").version) == "1"
    better = promote(checked, "2")
    assert better.promoted and better.p_value < 0.05 and better.only_challenger > 10 and better.only_champion == 0
    assert str(client.get_model_version_by_alias("compare", "champion").version) == "2"
    same = promote(checked, equal)
    assert not same.promoted and "< margin" in same.reason and same.only_challenger == same.only_champion == 0

    monkeypatch.chdir(tmp_path)  # the CLI resolves the config and run dir like `rftflow run`
    result = CliRunner().invoke(app, ["promote", str(default_config), "--run-dir", str(tmp_path / "weak"),
                                      "--version", worse, *[a for s in weak_config for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1].startswith(f"compare v{worse}: not promoted (accuracy ")
    assert str(client.get_model_version_by_alias("compare", "champion").version) == "2"
    # where to see it: the flow run on the Prefect API it reported to (this test's), and no MLflow
    # server shows the registry (a SQLite file; no `rftflow up` over the run dir)
    from prefect import get_client
    from prefect.settings import PREFECT_UI_URL

    lines = result.stderr.strip().splitlines()
    flow_run_id = re.fullmatch(rf"flow run: {re.escape(PREFECT_UI_URL.value().rstrip('/'))}/runs/flow-run/([\w-]+)",
                               lines[-2]).group(1)
    assert lines[-1] == f"mlflow: no server shows it; its registry is {uri} (`rftflow up {tmp_path / 'weak'}` serves it)", \
        lines
    with get_client(sync_client=True) as prefect:
        flow_run = prefect.read_flow_run(flow_run_id)
    assert flow_run.flow_id and flow_run.name.startswith(f"promote-{worse}-")
    label = checked.label
    assert set(flow_run.tags) == {f"campaign {label}", f"model compare ({tmp_path.name}/mlflow.db)",
                                  f"challenger v{worse}", "champion v2", "not promoted"}, flow_run.tags

    tags = {v: client.get_model_version("compare", v).tags for v in ("1", "2", equal, worse)}
    assert [tags[v]["promotion.decision"] for v in ("1", "2", equal, worse)] == ["promoted", "promoted",
                                                                                 "rejected", "rejected"]
    assert float(tags["2"]["promotion.accuracy"]) == strong["eval_accuracy_after"]
    assert float(tags["2"]["promotion.p_value"]) < 0.05 and tags["1"]["promotion.defended.v2"] == "lost"
    assert tags["2"][f"promotion.defended.v{worse}"] == "kept" and tags[worse]["promotion.champion"] == "2"


# another machine: mlflow, transformers and PEFT only, a fresh HOME; the version's answers to every task
LOAD_ELSEWHERE = """
import json, sys, tempfile
import mlflow, torch
from mlflow import MlflowClient
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

uri, name, version, questions = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
client = MlflowClient(uri, registry_uri=uri)
def files(name, version):
    return mlflow.artifacts.download_artifacts(client.get_model_version_download_uri(name, version),
                                               dst_path=tempfile.mkdtemp(), tracking_uri=uri)
base_name, base_version = client.get_model_version(name, version).tags["base_model"].removeprefix("models:/").split("/")
adapter = files(name, version)
tokenizer = AutoTokenizer.from_pretrained(adapter)
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(files(base_name, base_version)), adapter)
model = model.merge_and_unload().eval()
answers = []
for q in questions:
    ids = torch.tensor([tokenizer(q + "=", add_special_tokens=False)["input_ids"]])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False,
                         pad_token_id=tokenizer.pad_token_id)
    answers.append(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
print(json.dumps(answers))
"""


def test_lora_versions_name_their_base_once_load_elsewhere_and_are_promoted(tmp_path, default_config):
    import subprocess
    import sys

    from mlflow import MlflowClient

    from rftflow.components.campaign.bench import eval_engine
    from rftflow.components.campaign.preflight import preflight
    from rftflow.components.campaign.promotion import promote
    from rftflow.components.campaign.run import CampaignRun

    uri, campaign = comparison(tmp_path, "adapted")
    campaign += ["model.lora={rank: 16, alpha: 64}", "trainer.warmup_lr=3.0e-3"]

    def train(name: str, steps: int, *extra: str) -> dict:
        return CampaignRun(preflight(default_config, tmp_path / name, [*campaign, f"name={name}",
                                                                       f"trainer.warmup_steps={steps}", *extra])).run()

    weak, strong = train("weak", 0), train("strong", 400, "tracking.register_merged=true")  # adapter versions 1, 2
    assert weak["eval_accuracy_after"] < 0.2 < 0.5 < strong["eval_accuracy_after"]
    client = MlflowClient(uri, registry_uri=uri)
    assert [str(v.version) for v in client.search_model_versions("name='adapted-base'")] == ["1"]  # the base, once
    for v in ("1", "2"):
        version = client.get_model_version("adapted", v)
        assert version.tags["base_model"] == "models:/adapted-base/1" and version.tags["adapter"] == "lora"

    checked = preflight(default_config, tmp_path / "weak", [*campaign, "name=weak", "trainer.warmup_steps=0"])
    assert promote(checked, "1").promoted  # no champion yet: the floor (0 here) decides
    decision = promote(checked, "2")
    assert decision.promoted and decision.p_value < 0.05
    assert str(client.get_model_version_by_alias("adapted", "champion").version) == "2"
    assert float(client.get_model_version("adapted", "2").tags["promotion.accuracy"]) == strong["eval_accuracy_after"]

    questions = [t["question"] for t in TASKS]
    home = tmp_path / "elsewhere"
    home.mkdir()
    done = subprocess.run([sys.executable, "-c", LOAD_ELSEWHERE, uri, "adapted", "2", json.dumps(questions)],
                          cwd=home, env={"PATH": "/usr/bin:/bin", "HOME": str(home), "HF_HUB_OFFLINE": "1",
                                         "TMPDIR": str(home)},  # that machine's temp dir (the download)
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    answers = json.loads(done.stdout.splitlines()[-1])
    engine = eval_engine("models:/adapted@champion", None, uri, checked.cfg)  # as promotion and `evaluate` load it
    ours = [g[0].text for g in engine.generate([q + "=" for q in questions], max_new_tokens=3, greedy=True)]
    assert answers == ours
    import rftflow

    model, tokenizer = rftflow.load_registered_model("models:/adapted/2", uri)  # the adapter merged into its base
    ids = torch.tensor([tokenizer(questions[0] + "=", add_special_tokens=False)["input_ids"]])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False,
                         pad_token_id=tokenizer.pad_token_id)
    assert tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True) == answers[0]
    merged = client.get_model_version("adapted-merged", "1")  # tracking.register_merged: a plain model too
    assert merged.tags["adapter_version"] == "models:/adapted/2"
    engine = eval_engine("models:/adapted-merged/1", None, uri, checked.cfg)
    assert [g[0].text for g in engine.generate([q + "=" for q in questions], max_new_tokens=3, greedy=True)] == ours
    assert sum(a == t["answer"] for a, t in zip(answers, TASKS)) > 0.5 * len(TASKS)
