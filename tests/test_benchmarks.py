"""Every script in benchmarks/ runs to its end at a smoke size and prints its table, so a broken
benchmark is found here, not when someone needs its figure. The figures themselves are not checked
(they are measured under the load of the suite); what is checked is that the script ran and printed
what it prints. A script whose dependency CI does not install, or that needs a GPU, skips naming it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SMALL

pytestmark = [pytest.mark.slow, pytest.mark.benchmark]

ROOT = Path(__file__).resolve().parents[1]
SETS = [a for s in SMALL for a in ("--set", s)]  # the default campaign cut to a few seconds
ONE_ROUND = [*SETS, "--set", "rounds=1"]
# the tasks a few rounds need, where each process would read and check the default campaign's 50,000
FEW_TASKS = [a for s in SMALL if s.startswith("taskset.") for a in ("--set", s)]

# script → (arguments at a smoke size, a text of the table or line it prints at its end)
SMOKE = {
    "algorithms.py": (["--algorithms", "sft,grpo,mix", "--seeds", "0", "--rounds", "1", "--warmup-steps", "2",
                       "--rows-per-round", "64", *SETS], "| algorithm | after warm start"),
    "before_after.py": (["arith-mix", "--rounds", "1", *SETS], '"reward_first_5"'),
    "checkpoint.py": (["--rounds", "1", "--repeat", "1", *SETS], "| backend | round s | save s"),
    "contracts.py": (["--rounds", "1", *SETS], "first check of the process"),
    "decode_step.py": (["--rows", "8", "--prompts", "2", "--steps", "4", "--repeats", "1", "--threads", "1"],
                       "generate (sampled"),
    "episodes.py": (["--tasks", "4", "--repeat-times", "2", "--repeats", "1", "--warmup-steps", "2"],
                    "batched / one at a time"),
    "gpu_episodes.py": ([], '"held_out_after"'),
    "lora.py": (["--model", "builtin:tiny", "--rank", "4", "--rows", "2", "--prompt", "8", "--response", "8",
                 "--steps", "2", "--syncs", "1", "--threads", "1"], "s / sync"),
    "lora_learning.py": (["--seeds", "0", "--rounds", "1", "--rank", "4", "--threads", "1", *SETS,
                          "--set", "explorer.tasks_per_round=2"], '"variant": "full"'),
    "modes.py": (["--rounds", "1", "--warmup", "2", "--no-openai", *SETS], "| mode | rounds wall s"),
    "overhead.py": (["--setting", "trl-sized", "--rounds", "2", "--warmup-steps", "2", *SETS],
                    "orchestration (Prefect"),
    "own_data.py": (["--seeds", "0", "--set", "trainer.warmup_steps=2", "--set", "rounds=1", "--set",
                     "explorer.tasks_per_round=4", "--set", "eval.every=1", "--set", "taskset.eval_size=20"],
                    "| seed | held-out tasks |"),
    "real_model.py": (["--rounds", "1", "--set", "model.path=builtin:tiny", "--set", "model.chat_template=false",
                       "--set", "trainer.warmup_steps=2", "--set", "taskset.eval_size=8",
                       "--set", "explorer.tasks_per_round=2", "--set", "explorer.repeat_times=2"],
                      "held-out accuracy  before"),
    "real_skill.py": (["arith-mix", "--seeds", "0", *ONE_ROUND], "McNemar"),
    "rewards.py": (["--problems", "4", "--wrong", "2", "--workers", "2", "--trivial", "2"], "solutions/s"),
    "scale.py": (["--rollout", "--train", "--smoke", *FEW_TASKS], "| explorer parts | how many"),
    "skipped_work.py": (["--config", "arith-mix", "--prompts", "8", "--rows", "4", "--response-tokens", "8",
                         "--repeats", "1", "--threads", "1"], "weights equal after"),
    "storage.py": (["--rows", "2000", "--shards", "2", "--repeat", "1"], "s3:// (moto)"),
    "vision.py": (["--set", "rounds=1", "--set", "taskset.size=60", "--set", "taskset.eval_size=10", "--set",
                   "trainer.warmup_steps=2", "--set", "trainer.warmup_until=null", "--set", "explorer.tasks_per_round=2",
                   "--set", "explorer.repeat_times=2", "--set", "threads=1"], '"blanked"'),
    "vs_trl.py": (["--init", "tiny", "--sides", "trl,loop", "--tokens", "4", "--steps", "2", "--repeats", "1",
                   "--prompts", "2", "--group", "2", "--threads", "1", *FEW_TASKS], "| new tokens | side"),
    "write_behind.py": (["--rounds", "1", "--repeats", "1", "--threads", "1", "--backends", "s3-latency",
                         "--latency-ms", "2", *FEW_TASKS],
                        "| s3-latency |"),
}
# what a script needs that the test command may not install: script → (module, why it is missing)
NEEDS = {"vs_trl.py": ("trl", "the trl extra is not installed (pip install -e '.[trl]')")}


def test_every_benchmark_script_has_a_smoke_size():
    scripts = {p.name for p in (ROOT / "benchmarks").glob("*.py")}
    assert scripts == set(SMOKE), f"no smoke size for {sorted(scripts - set(SMOKE))}; gone: {sorted(set(SMOKE) - scripts)}"


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_the_benchmark_runs_at_a_smoke_size_and_prints_its_table(script, tmp_path):
    if not (ROOT / "benchmarks" / script).is_file():
        pytest.skip(f"benchmarks/{script} is gone (test_every_benchmark_script_has_a_smoke_size names it)")
    module, why = NEEDS.get(script, (None, ""))
    if module and importlib.util.find_spec(module) is None:
        pytest.skip(why)
    args, printed = SMOKE[script]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ROUNDS": "1", "SMOKE": "1"}  # gpu_episodes.py reads the last two
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    out = done.stdout + done.stderr
    print(done.stdout)  # the table, in the test's captured output
    assert done.returncode == 0 and "Traceback" not in out, out[-4000:]
    assert printed in done.stdout, done.stdout[-4000:]
