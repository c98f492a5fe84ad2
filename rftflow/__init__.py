"""rftflow: reinforcement fine-tuning of language models as Prefect-orchestrated campaigns.

The public API, for notebooks and scripts (the ``rftflow`` command does the same from a shell):

```python
import rftflow

cfg = rftflow.load_config("arith-mix", ["rounds=2"])   # a shipped config by name, a YAML path, or a mapping
summary = rftflow.run_campaign(cfg, run_dir="runs/demo")  # the Prefect flow; resumes an unfinished campaign
rows = rftflow.read_experiences("runs/demo")              # a pyarrow Table of the stored experiences
store = rftflow.open_store("runs/demo")                   # the campaign's store: rounds, checkpoints, state
decision = rftflow.promote(cfg, run_dir="runs/demo")      # the registered version against @champion
model, tokenizer = rftflow.load_registered_model("models:/rftflow-model/1", "sqlite:///runs/demo/mlflow.db")
```

The packages, one per role: ``rftflow.components`` (the loop's parts, no Prefect),
``rftflow.tasks`` (a Prefect task per step), ``rftflow.flows`` (the flows and the CLI),
``rftflow.infra`` (servers), ``rftflow.configs`` (the shipped campaign configs). Importing
``rftflow`` is cheap: each function imports what it needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rftflow.components.version import VERSION as __version__

if TYPE_CHECKING:
    import pyarrow as pa

    from rftflow.components.buffer.experiences import ExperienceStore
    from rftflow.components.config import CampaignConfig
    from rftflow.components.campaign.promotion import Decision



def load_config(source: CampaignConfig | Mapping[str, Any] | str | Path | None = None,
                overrides: Sequence[str] = ()) -> CampaignConfig:
    """A validated campaign config: a shipped config by name (``"arith-mix"``), a YAML file, a
    mapping of config keys, or None (every default), with ``key.path=value`` overrides applied.
    ``ConfigError`` names the bad key in one line."""
    from rftflow.components.config import load_config as load

    return load(source, overrides)


def run_campaign(config: CampaignConfig | Mapping[str, Any] | str | Path | None = None, run_dir: str | Path | None = None,
                 overrides: Sequence[str] = (), *, restart: bool = False, orchestrated: bool = True) -> dict[str, Any]:
    """Run a campaign to its end (or resume it) and return its summary, as ``rftflow run`` does.

    ``orchestrated``: as the ``rft_campaign`` Prefect flow, each step a task run, on the API that
    ``PREFECT_API_URL`` names (else a server started for the call); False: the same steps in plain
    Python, without Prefect. Bad input raises ``ConfigError``; a failed campaign raises its error;
    a stopped one ``StopRequested``."""
    from rftflow.components.config import load_config as load

    from rftflow.components.campaign.preflight import preflight

    checked = preflight(config, run_dir, overrides, restart=restart)  # checked once, before any server starts
    if not orchestrated:
        from rftflow.components.campaign.run import CampaignRun, move_aside

        if checked.finished:
            return _finished_summary(checked)
        if restart:
            move_aside(checked)
        return CampaignRun(checked).run()
    from rftflow.flows.campaign import handing_over, rft_campaign
    from rftflow.flows.prefect_api import embedded_prefect_api

    with embedded_prefect_api(), handing_over(checked, restart):
        state = rft_campaign(checked.cfg.model_dump(mode="json"), str(checked.run_dir), restart=restart,
                             return_state=True)
    return state.result()  # raises what failed or stopped it


def _finished_summary(checked) -> dict[str, Any]:
    import json

    path = checked.run_dir / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {"campaign": checked.cfg.name, "status": "finished"}


def open_store(location: str | Path, campaign: str | None = None) -> ExperienceStore:
    """A campaign's store, from its run dir or a store URL (``file:///…``, ``s3://bucket/prefix``;
    S3 settings from the AWS environment); ``campaign`` may be left out when the store holds one."""
    from rftflow.components.buffer.experiences import open_campaign

    return open_campaign(location, campaign)


def read_experiences(location: str | Path, kind: str = "usual", round: int | None = None,
                     campaign: str | None = None) -> pa.Table:
    """Stored rows of one kind — ``usual`` (explorer experiences), ``expert``, ``human``,
    ``quarantine`` (with ``reason``), ``failed`` or ``tasks`` — of every round or one."""
    return open_store(location, campaign).read_kind(kind, round)


def promote(config: CampaignConfig | Mapping[str, Any] | str | Path | None = None, run_dir: str | Path | None = None,
            overrides: Sequence[str] = (), version: str | None = None) -> Decision:
    """The registered version ``version`` (default the newest) against the ``champion`` alias on the
    campaign's held-out tasks; the alias moves on a clear, significant win (``components.promotion``)."""
    from rftflow.components.campaign.preflight import preflight
    from rftflow.components.campaign.promotion import promote as decide

    return decide(preflight(load_config(config, overrides), run_dir), version)


def load_registered_model(uri: str, tracking_uri: str):
    """(model, tokenizer) of a registered version, ``models:/name/3`` or ``models:/name@champion``,
    from the MLflow registry at ``tracking_uri`` (the campaign's: ``sqlite:///<run dir>/mlflow.db`` by
    default). A LoRA version (an adapter) comes merged into the base it names, itself a
    ``models:/…`` version, downloaded the same way: a plain transformers model either way."""
    import tempfile

    from rftflow.components.campaign.bench import load_bench_model

    with tempfile.TemporaryDirectory() as into:
        return load_bench_model(uri, None, tracking_uri, Path(into))


__all__ = ["__version__", "load_config", "load_registered_model", "open_store", "promote", "read_experiences",
           "run_campaign"]
