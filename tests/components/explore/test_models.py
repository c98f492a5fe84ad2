from transformers import AutoModelForCausalLM, AutoTokenizer

from rftflow.components.explore.models import resolve_model_path


def test_builtin_tiny_is_a_qwen2_model_directory_loaded_by_auto_classes(tiny):
    model, tokenizer = tiny
    path = resolve_model_path("builtin:tiny")
    # the same directory loads with the plain Auto classes, as any local model would
    again = AutoModelForCausalLM.from_pretrained(path)
    assert again.config.model_type == "qwen2"
    assert type(AutoTokenizer.from_pretrained(path)).__name__ == "Qwen2Tokenizer"
    assert sum(p.numel() for p in model.parameters()) < 5_000_000


def test_char_tokenizer_round_trips_text_one_token_per_character(tiny):
    _, tokenizer = tiny
    text = "23 - 60 = -37\nok"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode([*ids, tokenizer.eos_token_id], skip_special_tokens=True) == text


def test_a_gguf_file_or_a_directory_with_one_is_a_model_path(tmp_path):
    import pytest

    from rftflow.components.explore.models import check_model_path, resolve_model_path

    gguf = tmp_path / "one" / "m.Q4.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    for path in (str(gguf), str(gguf.parent)):
        check_model_path(path)
        assert resolve_model_path(path) == str(gguf)
    (tmp_path / "one" / "other.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match=r"several \.gguf files \(m\.Q4\.gguf, other\.gguf\); name one"):
        check_model_path(str(gguf.parent))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="a directory without config.json or a .gguf file"):
        check_model_path(str(tmp_path / "empty"))


def test_processes_of_a_process_group_build_a_builtin_model_at_once_into_a_whole_directory(tmp_path):
    """transformers writes a model from rank 0 of an initialised process group only: the others,
    building the same model at the same moment, must wait for it and not publish a directory
    without weights."""
    import os
    import subprocess
    import sys

    script = tmp_path / "load.py"
    script.write_text("import time\n"
                      "from accelerate import Accelerator\n"
                      "if Accelerator(cpu=True).process_index == 0:\n"  # the process group, before the model is built
                      "    time.sleep(3)\n"  # rank 1 first: without rank 0's writes it has no model to publish
                      "from rftflow.components.explore.models import load_model\n"
                      "model, _ = load_model('builtin:tiny')\n"
                      "print('parameters', sum(p.numel() for p in model.parameters()))\n")
    env = {**os.environ, "RFTFLOW_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(script)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("parameters") == 2
    built = list((tmp_path / "cache").glob("builtin-tiny-*"))
    assert len(built) == 1 and (built[0] / "config.json").is_file() and (built[0] / "model.safetensors").is_file()


def test_building_a_builtin_model_draws_its_weights_from_its_seed_and_leaves_the_callers_rng_alone(tmp_path):
    """A campaign seeds torch, then loads its model: a build on a cache miss must not reseed torch, or
    the same campaign seed gives another run depending on whether the model was already built."""
    import torch
    from safetensors.torch import load_file

    from rftflow.components.explore.models import build_builtin

    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    first = build_builtin("tiny", tmp_path / "a", seed=7)
    assert torch.equal(torch.rand(4), expected)  # the caller's stream goes on as if nothing was built
    second = build_builtin("tiny", tmp_path / "b", seed=7)
    weights_a, weights_b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert weights_a.keys() == weights_b.keys() and all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
