"""Promotion through the MLflow registry: a clearly better challenger takes the ``champion`` alias;
an equal one and a clearly worse one do not; every decision is tagged on the versions. The last
step goes through ``rftflow promote`` (the ``promote_model`` flow), which prints one line."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

# "a?b" → "<" or ">": a few SFT steps turn an untrained model (accuracy 0) into one that answers
TASKS = [{"question": f"{a}?{b}", "answer": "<" if a < b else ">"} for a in range(10) for b in range(10) if a != b]


def test_only_a_clearly_better_challenger_becomes_champion(prefect_api, tmp_path, default_config, monkeypatch):
    from mlflow import MlflowClient
    from typer.testing import CliRunner

    from rftflow.components.campaign.preflight import preflight
    from rftflow.components.campaign.promotion import promote
    from rftflow.components.campaign.run import CampaignRun
    from rftflow.flows.cli import app

    tasks = tmp_path / "compare.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    campaign = ["rounds=1", f"taskset.source={tasks}", "taskset.eval_size=40", "taskset.prompt_template={question}=",
                "reward.function=exact_match", "explorer.max_new_tokens=3", "eval.max_new_tokens=3",
                "trainer.micro_batch_size=16", "explorer.tasks_per_round=4", "explorer.repeat_times=4",
                "buffer.expert_per_round=16", f"tracking.uri={uri}", "tracking.registered_model=compare",
                "promotion.min_accuracy=0", "promotion.after_campaign=false"]  # promoted by hand below

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

    tags = {v: client.get_model_version("compare", v).tags for v in ("1", "2", equal, worse)}
    assert [tags[v]["promotion.decision"] for v in ("1", "2", equal, worse)] == ["promoted", "promoted",
                                                                                 "rejected", "rejected"]
    assert float(tags["2"]["promotion.accuracy"]) == strong["eval_accuracy_after"]
    assert float(tags["2"]["promotion.p_value"]) < 0.05 and tags["1"]["promotion.defended.v2"] == "lost"
    assert tags["2"][f"promotion.defended.v{worse}"] == "kept" and tags[worse]["promotion.champion"] == "2"
