"""Failures as users cause them, each checked for its one line and the exit code of the README's
table: sizes that cannot fit the model or the memory (refused before any work), a store that lost
the campaign a run dir knows (refused until ``--restart``), a store that hangs at the start and an
ingested file past its bad-row threshold (both failures, and the run dir's files left as they
were), bad input to every verb, and Ctrl-C to a command that is not a campaign."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import SMALL
from tests.flows.user import UserRun, lines_with, run_to_end, sets

pytestmark = pytest.mark.slow  # the CLI in subprocesses, two short campaigns


def _one_error(code: int, out: str, expected_code: int, pattern: str, lines: int = 1) -> str:
    """The command exited ``expected_code`` with one line ``error: …`` matching ``pattern`` (of at most
    ``lines``), and no traceback."""
    assert code == expected_code, out[-3000:]
    assert "Traceback" not in out and len(out.strip().splitlines()) <= lines, out[-3000:]
    assert len(lines_with(out, "error:")) == 1, out[-3000:]
    line = lines_with(out, "error:")[0]
    assert re.search(pattern, line), line
    return line


def _files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_sizes_that_cannot_fit_are_refused_in_one_line_before_any_work(cli_env, tmp_path):
    run_dir = tmp_path / "run"
    for override, pattern in (
            ("explorer.max_new_tokens=100000000", r"explorer\.max_new_tokens 100000000: a prompt of \d+ tokens and "
             r"100000000 new ones pass the 256 positions of builtin:tiny \(max_position_embeddings\); at most \d+ "
             r"new tokens fit"),
            ("trainer.micro_batch_size=100000000", r"trainer\.micro_batch_size: a micro-batch of 100000000 rows of "
             r"\d+ tokens needs at least [\d.]+ GiB for its attention keys, values and logits \(docs/capacity\.md\), "
             r"more than the [\d.]+ GiB of memory available")):
        code, out = run_to_end(["run", "--run-dir", str(run_dir), "--no-progress", *sets(*SMALL, override)],
                               env=cli_env)
        _one_error(code, out, 2, pattern)
    assert not run_dir.exists()  # nothing made, nothing loaded


def test_a_store_that_lost_the_campaign_of_a_run_dir_is_refused_until_restart(cli_env, tmp_path):
    from mlflow import MlflowClient

    run_dir = tmp_path / "run"
    args = ["run", "--run-dir", str(run_dir), "--no-progress", *sets(*SMALL, "name=wiped", "rounds=1")]
    code, out = run_to_end(args, env=cli_env)
    assert code == 0, out[-3000:]
    first_run = json.loads((run_dir / "summary.json").read_text())["mlflow_run_id"]
    shutil.rmtree(run_dir / "store")  # emptied under it (a bucket emptied, a server restarted without its data)
    code, out = run_to_end(args, env=cli_env)
    line = _one_error(code, out, 2, rf"run dir {run_dir} ran campaign 'wiped' before \(MLflow run {first_run} in "
                                    r"sqlite:///.*mlflow\.db\), but its state is missing from its store")
    assert f"expected under {(run_dir / 'store').as_uri()}/wiped/state/campaign/" in line and "--restart" in line
    assert not (run_dir / "store").exists()  # refused before any work: nothing made in its place
    elsewhere = (tmp_path / "elsewhere").as_uri()  # a wrong storage.url: the same refusal, naming where it looked
    code, out = run_to_end([*args, "--set", f"storage.url={elsewhere}"], env=cli_env)
    assert f"expected under {elsewhere}/wiped/state/campaign/" in _one_error(code, out, 2, "state is missing")
    code, out = run_to_end([*args, "--restart"], env=cli_env)  # knowingly: a new campaign, the old run set aside
    assert code == 0, out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["attempts"] == 1 and summary["mlflow_run_id"] != first_run
    client = MlflowClient(summary["mlflow_tracking_uri"])
    assert "rftflow.moved_aside" in client.get_run(first_run).data.tags
    assert "rftflow.moved_aside" not in client.get_run(summary["mlflow_run_id"]).data.tags
    # a corrupt store: a failure (1), in one line naming the shard
    shard = run_dir / "store" / "wiped" / "experiences" / "usual" / "round=1" / "part-00000.parquet"
    shard.write_bytes(shard.read_bytes()[:100])
    code, out = run_to_end(["buffer", "export", str(run_dir), "--out", str(tmp_path / "rows.jsonl")], env=cli_env)
    _one_error(code, out, 1, r"round=1/part-00000\.parquet is corrupt")


def test_a_hung_store_and_bad_data_fail_with_1_leaving_the_run_dir_as_it_was(cli_env, tmp_path, s3_server,
                                                                              s3_bucket):
    from tests.faultproxy import FaultProxy

    run_dir, demos, bad = tmp_path / "run", tmp_path / "demos.jsonl", tmp_path / "bad.jsonl"
    demos.write_text("".join(json.dumps({"prompt": f"{a} + 1 =", "response": str(a + 1)}) + "\n" for a in range(4)))
    bad.write_text("".join(json.dumps({"prompt": f"{a} + 2 ="}) + "\n" for a in range(4)))  # no response
    with FaultProxy(urlsplit(s3_server.endpoint_url).port) as proxy:
        env = {**cli_env, **s3_server.env}
        store = sets(*SMALL, "name=hung", f"storage.url=s3://{s3_bucket}/team", "storage.addressing_style=path",
                     f"storage.endpoint_url={proxy.endpoint_url}", "storage.outage_seconds=3")
        code, out = run_to_end(["ingest", "expert", str(demos), "--run-dir", str(run_dir), *store], env=env)
        assert code == 0, out[-3000:]
        recorded = json.loads((run_dir / "store.json").read_text())
        assert recorded["endpoint_url"] == proxy.endpoint_url and recorded["outage_seconds"] == 3
        before, objects = _files(run_dir), sorted(s3_server.client().list_objects_v2(Bucket=s3_bucket)["Contents"],
                                                  key=lambda o: o["Key"])
        # bad data past contracts.max_bad_fraction: 1, nothing stored, store.json as it was (not even rewritten
        # with another store's address)
        code, out = run_to_end(["ingest", "expert", str(bad), "--run-dir", str(run_dir), *store,
                                "--set", f"storage.url=s3://{s3_bucket}/other"], env=env)
        assert code == 1 and "Traceback" not in out, out[-3000:]
        assert re.search(r"error: file .*bad\.jsonl: 4 of 4 rows \(100%\) break the contract", out), out
        assert _files(run_dir) == before
        after = sorted(s3_server.client().list_objects_v2(Bucket=s3_bucket)["Contents"], key=lambda o: o["Key"])
        assert [(o["Key"], o["ETag"]) for o in after] == [(o["Key"], o["ETag"]) for o in objects]

        proxy.hang()  # accepts connections, never answers
        for verb in (["run", "--run-dir", str(run_dir), "--no-progress", *store], ["status", str(run_dir)],
                     ["buffer", "ls", str(run_dir)]):
            started = time.monotonic()
            code, out = run_to_end(verb, env=env)
            # the store down past its budget: a failure, after the store's one warning that it retries
            _one_error(code, out, 1, r"store s3://.*/team unavailable for \d+ s", lines=2)
            assert time.monotonic() - started < 120, verb  # its 3 s budget, not the default 120 s
        assert _files(run_dir) == before

        # by URL (the default budget, 120 s): Ctrl-C while it waits for the store
        status = UserRun(["status", f"s3://{s3_bucket}/team"], env={**env, "AWS_ENDPOINT_URL": proxy.endpoint_url})
        status.wait_for("retrying for up to 120 s", timeout=120)
        status.interrupt()  # Ctrl-C to the group
        code, out = status.finish(timeout=60)
        assert code == 130 and "Traceback" not in out and "Aborted" not in out, out
        assert out.strip().splitlines()[-1] == "stopped: rftflow status stopped at once (SIGINT)", out
        assert len(lines_with(out, "stopped:")) == 1, out


@pytest.mark.parametrize("verb, pattern", [
    (["run", "--set", "nope=1"], r"nope"),
    (["promote", "--set", "nope=1"], r"nope"),
    (["config", "show", "--set", "trainer.nope=1"], r"trainer\.nope"),
    (["status", "{tmp}/nowhere"], r"no run dir or store at .*nowhere"),
    (["buffer", "ls", "{tmp}/nowhere"], r"no run dir or store at .*nowhere"),
    (["buffer", "export", "{tmp}/nowhere", "--out", "{tmp}/x.csv"], r"--out .*x\.csv: the file name must end in"),
    (["ingest", "expert", "{tmp}/missing.jsonl", "--run-dir", "{tmp}/run", *sets(*SMALL)], r"missing\.jsonl"),
])
def test_bad_input_to_every_verb_is_refused_with_2(cli_env, tmp_path, verb, pattern):
    code, out = run_to_end([a.replace("{tmp}", str(tmp_path)) for a in verb], env=cli_env)
    _one_error(code, out, 2, pattern)
    assert not (tmp_path / "run").exists()
