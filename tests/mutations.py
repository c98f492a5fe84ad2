"""Mutation checks of the suite: each entry breaks one feature (a snippet of a file replaced, or the
machine changed through the environment), runs the tests named to guard it, and passes when they
fail. Each runs in a fresh copy of the working tree (the repository's own files are never changed,
so an interrupted run leaves nothing behind; the copy goes at the end, also on Ctrl-C or SIGTERM,
with any process still running from it). A mutation of a file with uncommitted changes is refused
(its snippet is written against committed code).

    python tests/mutations.py                          # every mutation, one after the other
    python tests/mutations.py --list                   # their names and what each breaks
    python tests/mutations.py lease-not-renewed        # some, by name
    python tests/mutations.py --baseline NAME          # first the tests unmutated: they must pass

A mutation is a row of ``MUTATIONS``: a name, what it breaks, the test node ids that must fail,
and either a file with a snippet found exactly once in it and its replacement, or the
environment of the test run (``env``, or ``prepare`` making a folder the environment points at).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPY_IGNORED = (".git", ".venv", ".venv-vllm", "__pycache__", "*.egg-info", "build", "dist", "site", "runs",
                ".pytest_cache")
EXIT_TESTS_FAILED, EXIT_REFUSED_AT_START = 1, 4  # pytest's "tests failed"; tests/conftest.py's missing part


@dataclass(frozen=True)
class Mutation:
    name: str
    breaks: str  # the feature broken, in words
    tests: tuple[str, ...]  # node ids (from the repository root) of which one at least must fail
    file: str | None = None  # the file mutated, from the repository root
    old: str = ""  # a snippet found exactly once in it
    new: str = ""  # what replaces it
    more: tuple[tuple[str, str], ...] = ()  # further (snippet, replacement) pairs in the same file
    env: dict[str, str] = field(default_factory=dict)  # the test run's environment, over this one's
    prepare: Callable[[Path], dict[str, str]] | None = None  # a scratch folder → more environment
    exit: int = EXIT_TESTS_FAILED  # how the run must end: tests failed, or the suite refused to start


def _path_without_bwrap(scratch: Path) -> dict[str, str]:
    """A PATH whose folders hold every command of this one's but bubblewrap."""
    folder = scratch / "bin"
    folder.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        for tool in Path(directory).glob("*") if Path(directory).is_dir() else ():
            target = folder / tool.name
            if tool.name != "bwrap" and not target.exists() and os.access(tool, os.X_OK):
                target.symlink_to(tool)
    return {"PATH": str(folder)}


KILL = "tests/flows/test_kill_resume.py::"
USER = "tests/flows/test_user_failures.py::"
MUTATIONS = [
    # CI fails when a part it tests cannot run
    Mutation("ci-no-vllm-env", "the vLLM CPU virtualenv is missing (its build failed): the suite must not skip",
             ("tests/components/explore/test_server_engines.py::test_openai_engine_logprobs_agree_with_the_trainer"
              "_and_weights_reload_in_place",), env={"RFTFLOW_VLLM_VENV": "/nonexistent/.venv-vllm"},
             exit=EXIT_REFUSED_AT_START),
    Mutation("ci-no-bwrap", "bubblewrap is not installed: the suite must not run the code reward's tests without it",
             ("tests/components/campaign/test_domain_rewards.py",), prepare=_path_without_bwrap,
             exit=EXIT_REFUSED_AT_START),
    # every benchmark runs
    Mutation("benchmark-broken", "benchmarks/storage.py no longer runs (a renamed argument)",
             ("tests/test_benchmarks.py::test_the_benchmark_runs_at_a_smoke_size_and_prints_its_table[storage.py]",),
             "benchmarks/storage.py", "write_shard(store, prefix, tables[part], part)",
             "write_shard(store, prefix, tables[part], compression=part)"),
    # kill trials prove where the kill landed; no process outlives a signal
    Mutation("shard-marker-first", "a shard's commit marker is written before its bytes (a crash inside the write "
             "leaves a committed shard without its rows)",
             (KILL + "test_a_killed_run_resumes_to_the_uninterrupted_result[2]",), "components/buffer/shards.py",
             '''    store.put(shard_key(prefix, part), data)
    kill_point("shard", shard_key(prefix, part))
    meta = {"rows": rows, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return store.put(marker_key(prefix, part), json.dumps(meta).encode(), if_absent=True)''',
             '''    meta = {"rows": rows, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    won = store.put(marker_key(prefix, part), json.dumps(meta).encode(), if_absent=True)
    kill_point("shard", shard_key(prefix, part))
    store.put(shard_key(prefix, part), data)
    return won'''),
    Mutation("checkpoint-manifest-first", "a checkpoint's manifest is written before its files (a crash inside "
             "the write leaves a committed checkpoint without its files)",
             (KILL + "test_a_killed_run_resumes_to_the_uninterrupted_result[3]",), "components/buffer/weights.py",
             '''        kill_point("checkpoint", prefix)
        self.objects.put(f"{prefix}/{CHECKPOINT_MANIFEST}", manifest, if_absent=True)''',
             '''        self.objects.put(f"{prefix}/{CHECKPOINT_MANIFEST}", manifest, if_absent=True)
        kill_point("checkpoint", prefix)'''),
    Mutation("server-outlives-sigkill", "the embedded Prefect server is not ended with its killed run",
             (KILL + "test_no_process_outlives_a_killed_run",), "flows/prefect_api.py",
             "ctypes.CDLL(None).prctl(1, signal.SIGTERM)", "ctypes.CDLL(None).prctl(1, 0)"),
    # the server is stopped by the run (``stop``) and by the kernel when the run ends (its parent-death
    # signal): both go, or the other one still ends it
    Mutation("server-outlives-stop", "a stopped run leaves its embedded Prefect server running",
             ("tests/flows/test_stops.py::test_ctrl_c_in_the_warm_start_stops_at_once_and_the_same_command_resumes",),
             "flows/prefect_api.py", '''    ctypes.CDLL(None).prctl(1, signal.SIGTERM)
except (OSError, AttributeError):''', '''    ctypes.CDLL(None).prctl(1, 0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
except (OSError, AttributeError):''',
             more=(("        self.process.terminate()\n        try:\n            self.process.wait(timeout=5)\n"
                    "        except subprocess.TimeoutExpired:\n            self.process.kill()\n"
                    "            self.process.wait()\n", ""),)),
    # conditions on events, not wall time
    Mutation("lease-not-renewed", "a lease's renewal writes the same bytes (its holder looks dead)",
             ("tests/components/buffer/test_leases.py::test_a_renewed_lease_is_kept_and_a_silent_one_is_taken_over",),
             "components/buffer/leases.py", "            lease.beat += 1\n", "            lease.beat += 0\n"),
    Mutation("lease-taken-early", "a live lease is taken over at the second look, renewed or not",
             ("tests/components/buffer/test_leases.py::test_a_renewed_lease_is_kept_and_a_silent_one_is_taken_over",),
             "components/buffer/leases.py",
             "            if first[0] != data:  # renewed since: its holder is alive",
             "            if False:  # renewed since: its holder is alive"),
    # asserts that bite
    Mutation("ui-rows-shifted", "the UI's round table shows each round the previous round's figures",
             ("tests/flows/test_campaign.py::test_the_ui_shows_progress_a_round_table_and_a_summary_linking_mlflow",),
             "flows/monitor.py", "{col: _cell(history.get(r, {}).get(key))",
             "{col: _cell(history.get(max(r - 1, 0), {}).get(key))"),
    Mutation("last-evaluation-skipped", "the last round is not evaluated (the summary reports an earlier one)",
             ("tests/components/campaign/test_workflow_modes.py::test_both_and_async_run_episodes_and_log_their_"
              "metrics",), "components/campaign/schedule.py",
             "    return round_no % cfg.eval.every == 0 or round_no == cfg.rounds",
             "    return round_no % cfg.eval.every == 0"),
    Mutation("trainer-misses-explorer-rows", "the trainer reads the explorers' rows a round late (none in round 1)",
             ("tests/flows/test_sharded_explorers.py::test_two_explorers_share_the_rounds_on_s3_and_the_store_holds_"
              "each_experience_once",), "components/buffer/sampling.py",
             "usual, commit = take_fifo(self.store, buf.train_rows, round_no)",
             "usual, commit = take_fifo(self.store, buf.train_rows, round_no - 1 if round_no else round_no)"),
    Mutation("sync-check-skipped", "the sync check never compares the server's log-probs with the trainer's",
             ("tests/components/explore/test_server_engines.py::test_a_whole_campaign_explores_with_the_openai_engine"
              "_and_syncs_the_server",), "components/explore/sync.py",
             '''    metrics = {"sync/checked": 1.0}
    if logprobs:''', '''    metrics = {"sync/checked": 1.0}
    if False:'''),
    # untested user paths
    Mutation("code-never-passes", "the code reward runs a program without its last line (nothing passes)",
             ("tests/flows/test_reward_campaigns.py::test_the_code_reward_scores_programs_that_pass_in_a_campaign",),
             "components/verify/code.py", "def extract_program(response: str, task: Task) -> str:\n",
             "def extract_program(response: str, task: Task) -> str:\n    return _extract(response, task)[:-2]\n\n\n"
             "def _extract(response: str, task: Task) -> str:\n"),
    Mutation("reward-call-abandoned", "a team's reward call past its timeout is left running, not killed",
             ("tests/components/verify/test_rewards.py::test_a_timed_out_call_is_killed_and_its_rows_quarantined_"
              "while_the_others_score",), "components/verify/imported.py",
             "            self.close(wait=0)\n", "            self.conn.close()\n"),
    Mutation("judge-scale", "the judge's grade is read on a scale of 10 whatever the rubric's max_score",
             ("tests/components/explore/test_server_engines.py::test_a_campaign_scored_by_a_judge_on_the_server_"
              "stores_its_grades",), "components/verify/judge.py", "read_score(text, s.max_score, s.guided) / s.max_score",
             "read_score(text, s.max_score, s.guided) / 10"),
    Mutation("reward-model-constant", "the reward model's head is ignored (every pair scores 0.5)",
             ("tests/flows/test_reward_campaigns.py::test_a_campaign_scored_by_a_reward_model_stores_the_models_"
              "scores",), "components/verify/reward_model.py", "torch.sigmoid(logits[:, 0])",
             "torch.sigmoid(logits[:, 0] * 0)"),
    Mutation("stall-never-armed", "the stall alert waits for a campaign's end instead of its rounds",
             ("tests/flows/test_alerts.py",), "flows/alerts.py", "trigger=EventTrigger(after={ROUND_EVENT},",
             "trigger=EventTrigger(after={ENDED_EVENT},"),
    Mutation("crash-not-alerted", "the failure alert leaves out crashed flow runs (a SIGKILLed campaign)",
             ("tests/flows/test_alerts.py",), "flows/alerts.py",
             'expect={"prefect.flow-run.Failed", "prefect.flow-run.Crashed"}', 'expect={"prefect.flow-run.Failed"}'),
    Mutation("gc-under-a-running-campaign", "buffer gc takes a live campaign for a dead one",
             ("tests/flows/test_alerts.py",), "components/campaign/state.py",
             "            return last.pid != os.getpid() and _pid_alive(last.pid)",
             "            return False"),
    Mutation("s3-listing-drops-json", "the S3 store's listing leaves out JSON objects (leases, commit markers)",
             ("tests/flows/test_sharded_explorers.py::test_two_explorers_share_the_rounds_on_s3_and_the_store_holds_"
              "each_experience_once",), "components/buffer/store.py",
             'if not obj["Key"].endswith("/")  # "folder" placeholders some tools create',
             'if not obj["Key"].endswith(("/", ".json"))  # "folder" placeholders some tools create'),
    Mutation("wheel-without-data", "the wheel leaves out the shipped data file (configs/data/*.jsonl)",
             ("tests/test_package.py",), "pyproject.toml", '"rftflow.configs" = ["*.yaml", "data/*.jsonl"]',
             '"rftflow.configs" = ["*.yaml"]'),
    # failures users meet: sizes, a second Ctrl-C, a lost store, exit codes, the warm start's checkpoints
    Mutation("sizes-unchecked", "preflight lets a response past the model's positions and a batch past the memory "
             "through (the campaign then fails in round 1)",
             (USER + "test_sizes_that_cannot_fit_are_refused_in_one_line_before_any_work",),
             "components/campaign/sizes.py", "    shape = model_shape(cfg.model)\n", "    shape = None\n"),
    Mutation("second-ctrl-c-raises", "a second Ctrl-C while a campaign stops raises KeyboardInterrupt wherever it "
             "lands (a traceback, or death by the signal)",
             ("tests/flows/test_interrupts.py::test_a_second_ctrl_c_stops_at_once_in_one_line_every_time_and_the_"
              "campaign_resumes",), "flows/campaign.py", "        if AT_ONCE is not None:\n", "        if False:\n"),
    Mutation("late-ctrl-c-kills", "a Ctrl-C in the interpreter's last steps kills the command by the signal",
             ("tests/flows/test_interrupts.py::test_ctrl_c_in_the_interpreters_last_steps_never_kills_the_command_by_"
              "the_signal",), "flows/cli.py", "    atexit.register(_signals_ignored_at_the_end)  # registered first: "
             "run last\n", ""),
    Mutation("lost-state-unseen", "a run dir's store that lost its campaign starts a new one in silence",
             (USER + "test_a_store_that_lost_the_campaign_of_a_run_dir_is_refused_until_restart",),
             "components/campaign/state.py", "    from mlflow import MlflowClient\n\n    from rftflow.components.tracking",
             "    return []\n    from mlflow import MlflowClient\n\n    from rftflow.components.tracking"),
    Mutation("store-outage-refused", "a store down past its budget at the start exits 2 (a refusal), as before",
             (USER + "test_a_hung_store_and_bad_data_fail_with_1_leaving_the_run_dir_as_it_was",), "flows/cli.py",
             "    except StoreUnavailable as e:  # the store down past its outage budget: a failure, not bad input\n"
             "        _fail(str(e), EXIT_FAILED)", "    except StoreUnavailable as e:\n        _fail(str(e))"),
    Mutation("failed-ingest-writes-store-json", "a failed ingest records its store in store.json first",
             (USER + "test_a_hung_store_and_bad_data_fail_with_1_leaving_the_run_dir_as_it_was",), "flows/cli.py",
             "    try:  # the store is opened (and the run dir's store.json written) only for a file that passes\n",
             "    open_run_store(cfg.storage, checked.run_dir)\n    try:\n"),
    Mutation("corrupt-checkpoint-overwritten", "a checkpoint set aside as corrupt stays at its version's keys, where "
             "the redone round's checkpoint overwrites it", ("tests/components/buffer/test_corrupt_kept.py",),
             "components/buffer/weights.py", "        aside = self.key(*CORRUPT_DIR, f\"v{version:06d}-{time.strftime(",
             "        aside = prefix or self.key(*CORRUPT_DIR, f\"v{version:06d}-{time.strftime("),
    Mutation("warm-start-from-zero", "a campaign stopped or killed in its warm start does it again from its first "
             "step", ("tests/components/campaign/test_warm_checkpoints.py",), "components/train/warm_start.py",
             "        resumed = self.resume()\n", "        resumed = None\n"),
    Mutation("warm-start-steps-again", "a resumed warm start takes its steps again from the first on, over the "
             "restored weights (a longer warm start than an uninterrupted one)",
             ("tests/components/campaign/test_warm_checkpoints.py",), "components/train/warm_start.py",
             "tc.warmup_lr, step_done, first=done)", "tc.warmup_lr, step_done, first=0)"),
    # the layering table of docs/architecture.md
    Mutation("layers-sideways", "explore's multi-turn workflow imports verify (a room of its own level)",
             ("tests/test_layers.py::test_every_import_of_every_module_follows_the_layering_table",),
             "components/explore/workflows/multi_turn.py",
             "from rftflow.components.explore.environments import environment_factory\n",
             "from rftflow.components.explore.environments import environment_factory\n"
             "from rftflow.components.verify.rewards import is_correct\n"),
    Mutation("layers-upward-in-a-function", "data imports explore inside a function (a room above it)",
             ("tests/test_layers.py::test_every_import_of_every_module_follows_the_layering_table",),
             "components/data/builtin_tasks.py", "    rng = random.Random(seed)\n",
             "    from rftflow.components.explore.environments import calculator\n\n    rng = random.Random(seed)\n"),
    # pictures: the contract's image rules and a taskset's picture files
    Mutation("image-bomb-decoded", "a picture's pixels are decoded before its declared size is checked (a "
             "decompression bomb is expanded)",
             ("tests/components/data/test_image_contracts.py::test_a_bomb_is_refused_from_its_header_without_decoding_"
              "a_pixel",), "components/data/image_checks.py", "                width, height = image.size\n",
             "                image.load()\n                width, height = image.size\n"),
    Mutation("image-hash-unchecked", "a picture whose bytes are not the ones its sha256 names passes",
             ("tests/components/data/test_image_contracts.py::test_hostile_images_of_experience_rows_are_quarantined_"
              "naming_the_image",), "components/data/image_checks.py", "    if actual != sha256:\n",
             "    if False:\n"),
    Mutation("image-hash-trusted-by-name", "a picture claiming a hash already checked on another row is not hashed",
             ("tests/components/data/test_image_contracts.py::test_hostile_images_of_experience_rows_are_quarantined_"
              "naming_the_image",), "components/data/image_checks.py",
             "    if hashed is None or sha256 not in hashed or hashed[sha256] != data:\n",
             "    if hashed is None or sha256 not in hashed:\n"),
    Mutation("image-rule-ignored", "an experience row's image problems never set its images_valid rule",
             ("tests/components/data/test_image_contracts.py",), "components/data/contracts.py",
             "np.array([problem is None for problem in images or [None] * table.num_rows], dtype=bool)",
             "np.ones(table.num_rows, dtype=bool)"),
    Mutation("task-images-from-cwd", "a taskset's picture paths are read from the current folder, not the taskset's",
             ("tests/components/data/test_taskset_images.py::test_paths_bytes_data_urls_and_entries_make_the_same_"
              "tasks",), "components/data/tasksets.py",
             'images = {"base": Path() if source.startswith(HUB_PREFIX) else path.parent,', 'images = {"base": Path(),'),
    Mutation("pictures-in-every-row", "an experience shard keeps each row's picture bytes (not stored once by hash)",
             ("tests/components/buffer/test_pictures.py::test_a_picture_shared_by_16_rows_is_stored_once_and_rows_"
              "read_back_with_its_bytes",), "components/buffer/images.py",
             '"key": key, "data": None}', '"key": key, "data": item.get("data")}'),
    Mutation("picture-trusted-on-read", "a picture read back from the store is not checked against its hash",
             ("tests/components/buffer/test_pictures.py::test_a_picture_altered_or_missing_in_the_store_fails_the_"
              "read_naming_its_key",), "components/buffer/images.py",
             "                if digest(got[key]) != item[\"sha256\"]:\n", "                if False:\n"),
    Mutation("gc-keeps-pictures", "buffer gc never deletes a picture no kept row shows",
             ("tests/components/buffer/test_pictures.py::test_gc_deletes_the_pictures_only_dropped_rounds_showed",),
             "components/buffer/retention.py", "    _unseen_pictures(store, keys, result)\n", ""),
    Mutation("vlm-adapter-on-pictures", "LoRA on a vision-language model adapts its image encoder and connector too",
             ("tests/components/campaign/test_vision_campaign.py::test_lora_on_a_vision_language_model_over_a_text_"
              "and_vision_mixture",), "components/train/adapters.py",
             'exclude_modules=VISION_SIDE if hasattr(model.config, "vision_config") else None', "exclude_modules=None"),
]


def _dirty(path: str) -> bool:
    """Whether ``path`` differs from the last commit (someone's work in progress) or is not committed."""
    status = subprocess.run(["git", "status", "--porcelain", "--", path], cwd=ROOT, capture_output=True, text=True)
    return bool(status.stdout.strip()) or status.returncode != 0


def _copy(scratch: Path) -> Path:
    """A copy of the working tree (its links kept), with links to this checkout's virtualenvs, and
    its packages importable from it by their import names: each ``[tool.setuptools.package-dir]``
    entry of pyproject.toml (``"rftflow.flows" = "flows"``) a link in the copy (rftflow/flows ->
    ../flows), so that with the copy first on PYTHONPATH no module is read from this checkout (whose
    editable install maps the same names here)."""
    import tomllib

    tree = scratch / "tree"
    shutil.copytree(ROOT, tree, symlinks=True, ignore=shutil.ignore_patterns(*COPY_IGNORED))
    for venv in (".venv", ".venv-vllm"):
        if (ROOT / venv).exists():
            (tree / venv).symlink_to(ROOT / venv)
    mapped = tomllib.loads((tree / "pyproject.toml").read_text()).get("tool", {}).get("setuptools", {})
    for name, folder in mapped.get("package-dir", {}).items():
        link = tree.joinpath(*name.split("."))
        if name and not link.exists():
            link.symlink_to(os.path.relpath(tree / folder, link.parent))
    return tree


def _end_processes_of(tree: Path) -> None:
    """SIGKILL every process started from ``tree`` (its runs carry it in PYTHONPATH) that is still running."""
    mark = f"PYTHONPATH={tree}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue


def run(mutation: Mutation, mutate: bool = True) -> tuple[str, str]:
    """Apply ``mutation`` in a copy (unless not ``mutate``: the baseline), run its tests there:
    (outcome, one line). The outcome is ``killed`` (the tests failed as they must), ``survived``
    (they passed), ``refused`` (a dirty file, a snippet not found once) or ``invalid`` (the run
    ended some other way)."""
    if mutation.file and _dirty(mutation.file):
        return "refused", f"{mutation.file} has uncommitted changes"
    with tempfile.TemporaryDirectory(prefix=f"mutation-{mutation.name}-") as scratch:
        tree = _copy(Path(scratch))
        try:
            if mutation.file and mutate:
                target = tree / mutation.file
                text = target.read_text()
                for old, new in ((mutation.old, mutation.new), *mutation.more):
                    if text.count(old) != 1:
                        return "refused", f"its snippet is in {mutation.file} {text.count(old)} times, not once"
                    text = text.replace(old, new)
                target.write_text(text)
            env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1",
                   **(mutation.env if mutate else {})}
            env.pop("RFTFLOW_ALLOW_MISSING", None)
            if mutation.prepare is not None and mutate:
                env |= mutation.prepare(Path(scratch))
            began = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider",
                                   *mutation.tests], cwd=tree, env=env, capture_output=True, text=True)
            seconds = time.monotonic() - began
        finally:
            _end_processes_of(tree)
    lines = [line for line in (done.stdout + done.stderr).strip().splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit {done.returncode}"
    if mutation.exit == EXIT_REFUSED_AT_START:
        last = next((line for line in lines if line.startswith("Exit: ")), last)
    if done.returncode == mutation.exit:
        return "killed", f"{last} ({seconds:.0f} s)"
    if done.returncode == 0:
        return "survived", f"the tests passed: {last} ({seconds:.0f} s)"
    return "invalid", f"pytest exited {done.returncode}: {last} ({seconds:.0f} s)"


def _stop_on_sigterm(*_) -> None:
    raise KeyboardInterrupt  # the copy and its processes go as on Ctrl-C


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--baseline", action="store_true", help="run each mutation's tests unmutated first")
    args = parser.parse_args()
    by_name = {m.name: m for m in MUTATIONS}
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        parser.error(f"unknown mutations {unknown}; known: {', '.join(by_name)}")
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name}: {m.breaks}\n    {m.file or 'environment'} -> {' '.join(m.tests)}")
        return 0
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    outcomes = []
    try:
        return _run_all([by_name[n] for n in args.names] or MUTATIONS, args.baseline, outcomes)
    except KeyboardInterrupt:  # the copy and its processes are gone (``run``'s cleanup)
        print(f"interrupted after {len(outcomes)} mutation(s)", file=sys.stderr)
        return 130


def _run_all(mutations: list[Mutation], baseline: bool, outcomes: list[str]) -> int:
    """Run ``mutations`` one after the other, printing each outcome; 0 if every one was killed."""
    for m in mutations:
        print(f"{m.name}: {m.breaks} ...", flush=True)
        if baseline:
            outcome, line = run(m, mutate=False)
            if outcome != "survived":  # unmutated, the tests must pass
                outcomes.append("refused" if outcome == "refused" else "invalid")
                print(f"    {outcomes[-1]}: unmutated, {line}", flush=True)
                continue
        outcome, line = run(m)
        outcomes.append(outcome)
        print(f"    {outcome}: {line}", flush=True)
    counts = {o: outcomes.count(o) for o in ("killed", "survived", "refused", "invalid")}
    print(", ".join(f"{n} {o}" for o, n in counts.items()))
    return 0 if counts["killed"] == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
