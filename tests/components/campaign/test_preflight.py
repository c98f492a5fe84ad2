"""The validation gate: bad input fails before any work and before anything is written, in one
line naming the culprit, whether the campaign starts from ``preflight`` or ``Campaign.from_config``.
(The CLI and the flow are tried in tests/flows.)"""

import pytest

from rftflow.components.campaign.stages import Campaign
from rftflow.components.config import ConfigError
from rftflow.components.campaign.preflight import preflight

# (overrides, what the one line says); ``{tmp}`` is the test's tmp dir
BAD = {
    "unknown key": (["trainer.learning_rate=0.1"], "unknown config key 'trainer.learning_rate'"),
    "wrong type": (["explorer.repeat_times=lots"], "config key 'explorer.repeat_times'"),
    "moved key": (["algorithm.expert_ratio=0.5"], "'algorithm.expert_ratio' moved to 'buffer.expert_ratio'"),
    "unknown advantage": (["algorithm.advantage=nope"], "algorithm.advantage: unknown advantage 'nope'; known:"),
    "unknown loss option": (["algorithm.advantage_options={lamda: 1}"], "takes no option(s) lamda"),
    "unknown operator": (["pipelines.experiences=[{op: shuffle}]"],
                         "pipelines.experiences[0]: unknown operator 'shuffle'; known:"),
    "bad operator option": (["pipelines.tasks=[{op: length_filter, max_chars: many}]"],
                            "pipelines.tasks[0] (length_filter): option max_chars='many'"),
    "missing task file": (["taskset.source={tmp}/nope.jsonl"], "taskset file not found: {tmp}/nope.jsonl"),
    "unreadable task file": (["taskset.source={tmp}/tasks.parquet"], "{tmp}/tasks.parquet: not a readable Parquet file"),
    "unknown dataset": (["taskset.source=reasoning_gym:no_such_set"], "taskset reasoning_gym:no_such_set"),
    "missing model": (["model.path=/nonexistent"], "model.path '/nonexistent': no such directory"),
    "model dir without a model": (["model.path={tmp}"], "a directory without config.json"),
    "unknown builtin": (["model.path=builtin:huge"], "unknown built-in model; known: builtin:tiny"),
    "store scheme": (["storage.url=ftp://x/y"], "storage.url 'ftp://x/y': unsupported scheme 'ftp'; supported: file://, s3://"),
    "tracking store": (["tracking.uri={tmp}/mlruns"], "MLflow 3 keeps no runs in plain files"),
    "tracking server down": (["tracking.uri=http://127.0.0.1:9"],
                             "tracking.uri 'http://127.0.0.1:9': no MLflow server answers ([Errno 111] Connection refused)"),
    "sft without demonstrations": (["algorithm.name=sft", "buffer.expert_per_round=0"],
                                   "buffer.expert_per_round must be > 0"),
    "early warm-start end on two processes": (
        ["trainer.warmup_until=0.5", "trainer.processes=2"],
        "trainer.warmup_until needs one trainer process (trainer.processes is 2)"),
    "a sharded model in one process": (
        ["trainer.fsdp=true"], "trainer.fsdp shards the policy across trainer processes: set trainer.processes ≥ 2"),
    "warm-start checks near a bar that is not above": (
        ["trainer.warmup_until=0.4", "trainer.warmup_check_near=0.5"],
        "trainer.warmup_check_near (0.5) needs a trainer.warmup_until above it (it is 0.4)"),
}


@pytest.fixture
def bad(tmp_path):
    """``bad(case) -> (overrides, expected line)`` with ``{tmp}`` filled in (and the files it names made)."""
    (tmp_path / "tasks.parquet").write_text("not parquet")

    def case(name: str) -> tuple[list[str], str]:
        overrides, line = BAD[name]
        return [o.replace("{tmp}", str(tmp_path)) for o in overrides], line.replace("{tmp}", str(tmp_path))

    return case


@pytest.mark.parametrize("case", sorted(BAD))
def test_the_gate_names_the_culprit_in_one_line_before_anything_is_written(case, bad, tmp_path, default_config):
    overrides, line = bad(case)
    run_dir = tmp_path / "run"
    for start in (preflight, Campaign.from_config):  # the gate itself, and a notebook's campaign
        with pytest.raises(ConfigError) as e:
            start(default_config, run_dir, overrides)
        assert line in str(e.value) and "\n" not in str(e.value)
    assert not run_dir.exists()


def test_a_run_dir_that_is_a_file_or_under_a_file_is_refused(tmp_path, default_config):
    (tmp_path / "file").write_text("")
    for run_dir, line in ((tmp_path / "file", "exists and is not a directory"),
                          (tmp_path / "file" / "run", f"{tmp_path / 'file'} is a file, not a directory")):
        with pytest.raises(ConfigError, match=line):
            preflight(default_config, run_dir)


def test_a_good_campaign_passes_and_resolves_its_parts(tmp_path, default_config, small):
    checked = preflight(default_config, tmp_path / "run", small)
    assert checked.cfg.rounds == 2 and checked.algorithm.loss == "mix" and checked.algorithm.mu == 0.9
    assert checked.tracking_uri == f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}"
    assert checked.store_url == (tmp_path / "run" / "store").as_uri()
    assert not (tmp_path / "run").exists()  # checking writes nothing


def test_mlflow_tracking_uri_is_the_default_tracking_store_when_set(tmp_path, default_config, small, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'team.db'}")
    assert preflight(default_config, tmp_path / "run", small).tracking_uri == f"sqlite:///{tmp_path / 'team.db'}"
    explicit = preflight(default_config, tmp_path / "run", [*small, f"tracking.uri=sqlite:///{tmp_path / 'own.db'}"])
    assert explicit.tracking_uri == f"sqlite:///{tmp_path / 'own.db'}"  # the config's key wins
