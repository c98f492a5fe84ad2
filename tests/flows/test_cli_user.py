"""The CLI verbs and flags the README shows, run in a subprocess as a user runs them, each checked
for its output and exit code: ``run`` (progress off a terminal, ``--restart``), ``status`` (a run
dir after a restart, an S3 store by URL), ``buffer ls|show|export|gc`` (a corrupt shard among
them), ``ingest expert``, and the exit codes' table in the README."""

from __future__ import annotations

import json
import re

import pytest

from tests.flows.user import ROOT, clean, lines_with, run_to_end, sets

pytestmark = pytest.mark.slow  # whole campaigns through the CLI

SMALL = ["rounds=2", "taskset.size=300", "taskset.eval_size=10", "trainer.warmup_steps=2",
         "trainer.micro_batch_size=16", "explorer.tasks_per_round=4", "explorer.repeat_times=4",
         "buffer.expert_per_round=8", "promotion.min_accuracy=0"]


def _cells(output: str) -> dict[str, str]:
    """A two-column rich table as {first cell: second cell} (wrapped cells joined)."""
    cells: dict[str, str] = {}
    key = None
    for line in output.splitlines():
        parts = [p.strip() for p in re.split(r"[│┃]", line)[1:-1]]
        if len(parts) != 2:
            continue
        if parts[0]:
            key = parts[0]
            cells[key] = parts[1]
        elif key:
            cells[key] += " " + parts[1]
    return cells


def test_run_restart_status_and_buffer_verbs_as_a_user_runs_them(cli_env, tmp_path):
    run_dir = tmp_path / "run"
    args = ["run", "--run-dir", str(run_dir), *sets(*SMALL, "name=user")]
    code, out = run_to_end(args, env=cli_env)  # progress on (the default), stdout not a terminal: plain lines
    assert code == 0, out[-3000:]
    clean(out)
    assert re.search(r"^\d\d:\d\d:\d\d progress round 2/2: reward [\d.]+  acc [\d.]+ \(\d+ s\)$", out, re.M), out[-2000:]
    assert lines_with(out, "progress warm start 2/2: sft loss")
    code, again = run_to_end(args, env=cli_env)
    assert code == 0 and "nothing to do; --restart runs it again" in again
    code, out = run_to_end([*args, "--restart"], env=cli_env)
    assert code == 0, out[-3000:]
    code, out = run_to_end(["status", str(run_dir)], env=cli_env)
    cells = _cells(out)
    assert code == 0 and cells["status"] == "finished" and cells["attempts"] == "1", out
    assert re.fullmatch(r"user\.moved-\d{8}-\d{6} \(by --restart; --campaign NAME shows one\)", cells["moved aside"])
    moved = cells["moved aside"].split()[0]
    code, out = run_to_end(["status", str(run_dir), "--campaign", moved], env=cli_env)
    assert code == 0 and _cells(out)["status"] == "finished"

    code, out = run_to_end(["buffer", "gc", str(run_dir)], env=cli_env)  # a dry run by default
    assert code == 0 and re.search(r"^(\d+) objects would be deleted; --apply deletes them$", out, re.M), out
    would = int(re.search(r"^(\d+) objects would be deleted", out, re.M).group(1))
    staged = len(list((run_dir / "store" / "user" / "staging").rglob("*.parquet")))
    assert would > 0 and staged > 0
    code, out = run_to_end(["buffer", "gc", str(run_dir), "--apply"], env=cli_env)
    assert code == 0 and f"deleted {would} objects" in out and not (run_dir / "store" / "user" / "staging").exists()

    code, out = run_to_end(["buffer", "show", str(run_dir), "--kind", "usual", "--round", "2", "--limit", "2"],
                           env=cli_env)
    assert code == 0 and "usual: 16 rows in round 2" in out
    shard = run_dir / "store" / "user" / "experiences" / "usual" / "round=2" / "part-00000.parquet"
    shard.write_bytes(shard.read_bytes()[:100])  # truncated on the disk
    for verb in (["buffer", "ls", str(run_dir)], ["buffer", "export", str(run_dir), "--out", str(tmp_path / "x.jsonl")]):
        code, out = run_to_end(verb, env=cli_env)
        errors = lines_with(out, "error:")
        assert code == 1 and "Traceback" not in out and len(out.strip().splitlines()) <= 2, out
        assert len(errors) == 1 and re.search(r"user/experiences/usual/round=2/part-00000\.parquet is corrupt: 100 "
                                              r"bytes where its commit marker records \d+ \(truncated", errors[0]), out


def test_ingest_expert_and_status_of_an_s3_store_by_url(cli_env, tmp_path, s3_server, s3_bucket):
    env = {**cli_env, **s3_server.env}
    store = [f"storage.url=s3://{s3_bucket}/team", "storage.addressing_style=path"]
    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(json.dumps({"prompt": f"{a} + 1 =", "response": str(a + 1)}) + "\n" for a in range(5)))
    ingest = ["ingest", "expert", str(demos), "--run-dir", str(tmp_path / "run"), *sets(*SMALL, "name=s3user", *store)]
    code, out = run_to_end(ingest, env=env)
    cells = _cells(out)
    assert code == 0 and (cells["rows"], cells["accepted"], cells["new"], cells["already present"]) == ("5", "5", "5", "0")
    code, out = run_to_end(["run", "--run-dir", str(tmp_path / "run"), "--no-progress", *sets(*SMALL, "name=s3user",
                                                                                              *store)], env=env)
    assert code == 0, out[-3000:]
    code, out = run_to_end(["status", f"s3://{s3_bucket}/team"], env=env)
    cells = _cells(out)
    assert code == 0 and cells["status"] == "finished" and cells["rounds done"] == "2 of 2", out
    code, out = run_to_end(["buffer", "ls", f"s3://{s3_bucket}/team"], env=env)
    expert = [line for line in out.splitlines() if re.search(r"│ expert\s+│\s+0 │ expert\s+│", line)]
    assert code == 0 and expert and int(expert[0].split("│")[4]) == 246 + 5, out


def test_the_readme_documents_every_exit_code_the_cli_uses():
    from rftflow.flows import cli

    readme = (ROOT / "README.md").read_text()
    table = {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d+) \| ([^|]+) \|$", readme, re.M)}
    used = {0, cli.EXIT_FAILED, cli.EXIT_REFUSED, cli.EXIT_STOPPED}
    assert set(table) == used, table
    assert "another attempt" in table[cli.EXIT_REFUSED] and "signal" in table[cli.EXIT_STOPPED]
