from transformers import AutoModelForCausalLM, AutoTokenizer

from components.explore.models import resolve_model_path


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
