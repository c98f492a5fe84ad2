"""A trainer in 2 processes (``accelerate launch``, DDP over gloo, one thread each) makes the update
one process makes with the same batch: GRPO (with an SFT warm start), MIX, PPO (critic and KL)
and DPO, each in another loss aggregation, in float64 so that what is compared is the arithmetic
of the split, not float32 rounding; so do 2 processes that shard the model (``trainer.fsdp``) and
its reference model, critic or LoRA adapter, and both continue from a checkpoint to the same weights."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
ROOT = HERE.parents[2]


def _launch(out: Path, processes: int, *options: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    script = [str(HERE / "data_parallel_steps.py"), str(out), *options]
    if processes == 1:
        command = [sys.executable, *script]
    else:
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                   str(ROOT / "infra" / "accelerate" / "ddp.yaml"), "--num_processes", str(processes), *script]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


PRETRAINED_TEST = "test_two_processes_sharding_a_pretrained_model_make_the_one_process_update"


@pytest.fixture(scope="module")
def launched(request, tmp_path_factory) -> tuple[dict, dict]:
    """What 1 process and 2 processes (whole, then sharded) saved: one launch each, with the
    SmolLM2 round too when its test is among those collected."""
    out = tmp_path_factory.mktemp("data-parallel")
    real = ("--pretrained",) if any(item.name == PRETRAINED_TEST for item in request.session.items) else ()
    _launch(out / "one.pt", 1, *real)
    _launch(out / "two.pt", 2, "--fsdp", *real)
    return torch.load(out / "one.pt"), torch.load(out / "two.pt")


@pytest.fixture(scope="module")
def parameters(launched):
    one, two = launched
    return ({"processes": one["processes"], **one["plain"]}, {"processes": two["processes"], **two["plain"]},
            {"processes": two["processes"], **two["sharded"]})


def test_two_processes_make_the_one_process_update(parameters, tiny):
    one, two, _ = parameters
    initial = {name: p.detach().double() for name, p in tiny[0].named_parameters()}
    assert one["processes"] == 1 and two["processes"] == 2
    for case in ("grpo", "grpo-kl", "grpo-lora", "mix", "ppo", "dpo"):
        if case == "grpo-lora":  # the adapter's B starts at 0
            moved = max(float(v.abs().max()) for k, v in one[case].items() if "lora_B" in k)
        else:
            moved = max(float((one[case][k] - initial[k]).abs().max()) for k in initial)
        assert moved > 1e-3, f"{case}: the updates did not move the parameters"
        differs = max(float((one[case][k] - two[case][k]).abs().max()) for k in one[case])
        assert differs < 1e-9, f"{case}: 2 processes differ from 1 by {differs:.2e}"
    assert any(k.startswith("critic.") for k in two["ppo"])  # the critic's parameters are compared too


def _differs(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_a_checkpoint_continues_to_the_weights_of_a_trainer_never_stopped(parameters):
    one, two, sharded = parameters
    for case in ("grpo-kl", "grpo-lora", "ppo"):  # with a reference model, a LoRA adapter, a critic
        assert _differs(one[f"resumed:{case}"], one[case]) == 0.0
        assert _differs(two[f"resumed:{case}"], one[case]) < 1e-9
        assert _differs(sharded[f"resumed:{case}"], one[case]) < 1e-9


def test_two_processes_sharding_the_model_make_the_one_process_update(parameters):
    one, _, sharded = parameters
    assert sharded["processes"] == 2
    for case in ("grpo", "grpo-kl", "grpo-lora", "mix", "ppo", "dpo"):
        assert 0.4 < sharded[f"{case}.held"] < 0.6, "rank 0 does not hold about half of the policy"
        differs = _differs(one[case], sharded[case])
        assert differs < 1e-9, f"{case}: 2 sharded processes differ from 1 by {differs:.2e}"


@pytest.mark.slow
def test_two_processes_sharding_a_pretrained_model_make_the_one_process_update(launched):
    ran, two = launched
    one, start, sharded = ran["plain"]["pretrained"], ran["plain"]["start"], two["sharded"]["pretrained"]
    assert len(one) > 200  # SmolLM2's 30 layers' tensors
    assert max(float((one[k] - start[k]).abs().max()) for k in one) > 1e-6  # the round moved the weights
    assert _differs(one, sharded) < 1e-6  # float32: the order of the sums differs, not the update
