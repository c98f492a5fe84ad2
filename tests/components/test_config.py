import pytest

from rftflow.components.config import SHIPPED_CONFIGS, CampaignConfig, ConfigError, load_config


def test_defaults_validate_and_default_campaign_loads(default_config):
    assert CampaignConfig().algorithm.name == "mix"
    cfg = load_config(default_config)
    assert cfg.name == "arith-mix" and cfg.taskset.params["max_digits"] == 2


@pytest.mark.parametrize("path", sorted(SHIPPED_CONFIGS.glob("*.yaml")), ids=lambda path: path.name)
def test_every_shipped_config_loads_by_its_name(path):
    assert load_config(path.stem).name == path.stem


def test_overrides_parse_values_as_yaml():
    cfg = load_config(None, ["rounds=3", "trainer.lr=1e-4", "taskset.params.max_digits=1"])
    assert cfg.rounds == 3 and cfg.trainer.lr == pytest.approx(1e-4) and cfg.taskset.params == {"max_digits": 1}


def test_unknown_key_is_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("trainer:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'trainer\.lrr'"):
        load_config(path)


def test_an_error_names_its_source_the_set_or_the_file_and_a_yaml_error_its_line_and_column(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: ok\ntrainer:\n  lr: 0.1\n")
    with pytest.raises(ConfigError, match=r"^--set trainer\.lrr=1: unknown config key 'trainer\.lrr'$"):
        load_config(path, ["trainer.lrr=1"])
    with pytest.raises(ConfigError, match=r"^--set trainer=\{lr: -1\}: config key 'trainer\.lr'"):
        load_config(path, ["rounds=2", "trainer={lr: -1}"])  # a section set whole
    path.write_text("name: ok\ntrainer:\n  lr: -1\n")
    with pytest.raises(ConfigError, match=rf"^{path}: config key 'trainer\.lr'"):
        load_config(path, ["rounds=2"])  # the file's value, not the --set's
    path.write_text("name: ok\ntrainer:\n  lr: [1, 2\n")
    with pytest.raises(ConfigError, match=rf"^{path}:4:1: not valid YAML \(expected ',' or '\]', but got '<stream end>'; "
                                          r"while parsing a flow sequence at 3:7\)$"):
        load_config(path)


def test_wrong_type_is_named_with_the_value():
    with pytest.raises(ConfigError, match=r"config key 'rounds'.*got 'many'"):
        load_config(None, ["rounds=many"])


def test_missing_config_file_and_bad_override():
    with pytest.raises(ConfigError, match="config file not found"):
        load_config("nope.yaml")
    with pytest.raises(ConfigError, match="expected key.path=value"):
        load_config(None, ["rounds"])


def test_cross_field_check_names_the_keys():
    with pytest.raises(ConfigError, match=r"buffer\.expert_per_round must be > 0 for `sft`"):
        load_config(None, ["algorithm.name=sft"])


def test_a_config_comes_from_a_path_a_mapping_or_a_config_with_overrides(default_config):
    from_path = load_config(default_config, ["rounds=3"])
    from_mapping = load_config(from_path.model_dump(mode="json"), ["seed=4"])
    assert from_mapping.rounds == 3 and from_mapping.seed == 4 and from_mapping.name == "arith-mix"
    assert load_config(from_mapping) is from_mapping and load_config(from_mapping, ["seed=5"]).seed == 5
    data = {"trainer": {"lr": 0.1}}
    load_config(data, ["trainer.min_lr=0.01"])
    assert data == {"trainer": {"lr": 0.1}}  # the caller's mapping is left as it was
