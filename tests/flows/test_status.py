"""``rftflow status`` and ``rftflow run`` on a campaign that already ran."""

from typer.testing import CliRunner

from rftflow.components.campaign.preflight import preflight
from rftflow.components.campaign.run import CampaignRun
from rftflow.flows.cli import app

CAMPAIGN = ["name=told", "rounds=2", "checkpoint.every=1", "eval.every=1"]


def _args(*overrides: str) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


def test_status_tells_where_a_campaign_stands_and_a_finished_one_is_left_alone(tmp_path, default_config, small):
    run_dir = tmp_path / "run"
    CampaignRun(preflight(default_config, run_dir, [*small, *CAMPAIGN])).run()
    status = CliRunner().invoke(app, ["status", str(run_dir)], terminal_width=200)
    assert status.exit_code == 0, status.output
    cells = dict(tuple(c.strip() for c in line.split("│")[1:3]) for line in status.output.splitlines()
                 if line.count("│") == 3)
    assert cells["status"] == "finished" and cells["rounds done"] == "2 of 2" and cells["attempts"] == "1"
    assert cells["last checkpoint"].startswith("told/checkpoints/v000003 (round 2")
    assert cells["model version"] == "1" and cells["last error"] == "none"
    before = sorted(p.name for p in (run_dir / "store" / "told" / "state" / "campaign").iterdir())
    again = CliRunner().invoke(app, ["run", str(default_config), "--run-dir", str(run_dir), *_args(*small, *CAMPAIGN)],
                               terminal_width=300)
    assert again.exit_code == 0, again.output
    assert again.output.count("\n") == 1 and "campaign told in " in again.output and "finished at" in again.output
    assert "nothing to do; --restart runs it again" in again.output
    assert sorted(p.name for p in (run_dir / "store" / "told" / "state" / "campaign").iterdir()) == before  # untouched
    missing = CliRunner().invoke(app, ["status", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and f"no run dir or store at {tmp_path / 'nowhere'}" in missing.stderr
