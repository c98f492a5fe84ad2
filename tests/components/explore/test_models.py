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
