"""A 3-round campaign with its store on a real S3 HTTP server (moto, 127.0.0.1), read back by pyarrow."""

import pyarrow.parquet as pq
from pyarrow import fs
from typer.testing import CliRunner

from rftflow.components.campaign.stages import Campaign
from rftflow.components.data.experience import SCHEMA
from rftflow.flows.cli import app


def test_campaign_on_s3_is_readable_by_plain_pyarrow(s3_server, s3_bucket, tmp_path, monkeypatch, default_config, small):
    campaign = Campaign.from_config(default_config, tmp_path, [
        *small, "name=s3c", "rounds=3", f"storage.url=s3://{s3_bucket}/campaigns", "storage.addressing_style=path",
        f"storage.endpoint_url={s3_server.endpoint_url}",
    ])
    assert campaign.store.url == f"s3://{s3_bucket}/campaigns"
    campaign.prepare()
    for r in (1, 2, 3):
        metrics = campaign.run_round(r)
        assert metrics["sample/usual_rows"] == 16  # FIFO: exactly this round's rows, read back from S3
    assert campaign.store.read_state("fifo_cursor")["shard"].endswith("round=3/part-00000.parquet")
    assert not (tmp_path / "store").exists()  # nothing went to the local default

    s3 = fs.S3FileSystem(endpoint_override=s3_server.endpoint_url, scheme="http", region="us-east-1",
                         access_key="testing", secret_key="testing")
    usual = f"{s3_bucket}/campaigns/s3c/experiences/usual"
    files = [f.path for f in s3.get_file_info(fs.FileSelector(usual, recursive=True)) if f.path.endswith(".parquet")]
    table = pq.read_table(files, filesystem=s3, partitioning=None)
    assert table.num_rows == 48 and table.schema.names == SCHEMA.names
    assert sorted(set(table.column("round").to_pylist())) == [1, 2, 3]

    # `rftflow buffer RUN_DIR` finds the store, endpoint included, without the AWS_ENDPOINT_URL the run had
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    ls = CliRunner().invoke(app, ["buffer", "ls", str(tmp_path)], terminal_width=200)
    assert ls.exit_code == 0, ls.output
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in ls.output.splitlines() if "│" in line]
    assert [["usual", str(r), "explorer", "16"] in cells for r in (1, 2, 3)] == [True] * 3
