"""``mode: bench``: evaluate several models on one or more held-out tasksets, one MLflow run.

Models (``bench.models``) are checkpoint versions of the campaign in the run's store
(``checkpoint:12`` is ``checkpoints/v000012``, weight version 12; ``checkpoint:latest``), Hugging Face model directories, ``builtin:<name>``, or
registered MLflow versions (``models:/name/3``, ``models:/name@champion``); a LoRA campaign's
checkpoint or version is its adapter, evaluated merged into the base it names. Tasksets
(``bench.tasksets``) are taskset sources, each held out the way the campaign holds out its own
(``taskset.eval_size`` distinct tasks, ``seed``); none given: the campaign's held-out split. Each
(model, taskset) pair is scored by greedy accuracy with the campaign's reward, as ``evaluate`` does.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from rftflow.components.buffer.weights import WeightStore

from rftflow.components.buffer.layout import open_run_store
from rftflow.components.data.tasksets import Task, load_mixture, load_tasks
from rftflow.components.explore.workflows import make_workflow
from rftflow.components.explore.engines import HFRolloutEngine
from rftflow.components.explore.models import load_model, load_processor, resolve_model_path
from rftflow.components.verify.rewards import make_rewards
from rftflow.components.campaign.preflight import Preflight
from rftflow.components.train import adapters
from rftflow.components.tracking import Tracker


class BenchModelError(ValueError):
    """A ``bench.models`` entry that names no model; the message is one line naming it."""


def resolve_bench_model(ref: str, store: WeightStore, tracking_uri: str, into: Path) -> str:
    """A local model directory for ``ref`` (see the module docstring); ``ValueError`` naming it."""
    if ref.startswith("checkpoint:"):
        versions = [m["version"] for m in store.checkpoints()]
        wanted = ref.split(":", 1)[1]
        version = versions[-1] if wanted == "latest" and versions else int(wanted) if wanted.isdigit() else None
        if version not in versions:
            raise BenchModelError(f"bench.models {ref!r}: no such checkpoint in {store.url}/{store.campaign}; "
                             f"committed: {', '.join(f'checkpoint:{v}' for v in versions) or 'none'}")
        store.read_checkpoint(version, into)
        return str(into)
    if ref.startswith("models:/"):
        try:
            return download_model_version(ref, tracking_uri, into)
        except Exception as e:  # noqa: BLE001 — MLflow's errors (no such model or version) in one line
            raise BenchModelError(f"bench.models {ref!r}: {str(e).splitlines()[0]}") from None
    try:
        return resolve_model_path(ref)
    except (ValueError, OSError) as e:
        raise BenchModelError(f"bench.models {ref!r}: {str(e).splitlines()[0]}") from None


def download_model_version(ref: str, tracking_uri: str, into: Path) -> str:
    """The files of registered version ``models:/name/3`` or ``models:/name@alias`` in ``tracking_uri``'s
    registry, downloaded into ``into``. Resolved with a client on that URI: MLflow's own ``models:/``
    download makes clients on the default tracking URI too, which in MLflow 3 is
    ``sqlite:///mlflow.db`` in the current directory (a file nobody asked for)."""
    import mlflow
    from mlflow import MlflowClient

    name, sep, alias = ref.removeprefix("models:/").partition("@")
    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    if sep:
        version = client.get_model_version_by_alias(name, alias).version
    else:
        name, _, version = name.rpartition("/")
    source = client.get_model_version_download_uri(name, version)
    return mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=str(into), tracking_uri=tracking_uri)


def load_bench_model(ref: str, store: WeightStore | None, tracking_uri: str, into: Path):
    """(model, tokenizer) of ``ref`` (see ``resolve_bench_model``); a LoRA adapter (a checkpoint or
    registered version of a LoRA campaign) is merged into the base it names, resolved the same way."""
    path = resolve_bench_model(ref, store, tracking_uri, into)
    if not adapters.is_adapter_dir(path):
        return load_model(path)
    base_dir = into / "base"
    base_dir.mkdir()
    model, tokenizer = load_bench_model(adapters.adapter_base(path), store, tracking_uri, base_dir)
    return adapters.merge_into(model, path), tokenizer


def eval_engine(ref: str, store: WeightStore | None, tracking_uri: str, cfg) -> HFRolloutEngine:
    """An ``hf`` engine over model ``ref`` (see ``load_bench_model``), for greedy evaluation."""
    with tempfile.TemporaryDirectory() as into:
        model, tokenizer = load_bench_model(ref, store, tracking_uri, Path(into))
        processor = load_processor(model.name_or_path)  # a vision-language model's, read while its files are here
    return HFRolloutEngine(model, tokenizer, batch_size=cfg.explorer.batch_size, chat_template=cfg.model.chat_template,
                           processor=processor)


def held_out(checked: Preflight, source: str | None) -> list[Task]:
    """The held-out split of ``source`` (None: the campaign's taskset, or its mixture's parts')."""
    cfg = checked.cfg
    if source is None and cfg.mixture:
        return load_mixture(cfg.part_tasksets(), cfg.seed, cfg.contracts).held_out
    taskset = cfg.taskset if source is None else cfg.taskset.model_copy(update={"source": source})
    return load_tasks(taskset, cfg.seed, cfg.contracts).held_out


def bench(checked: Preflight) -> dict[str, Any]:
    """Evaluate every model on every taskset; one MLflow run (``<name>-bench``) with the metric
    ``bench/accuracy/<taskset>`` at step = the model's index and the table ``bench.json``. Returns
    the summary (also ``<run dir>/bench.json``)."""
    cfg, out = checked.cfg, checked.run_dir
    store = WeightStore(open_run_store(cfg.storage, out), cfg.name)
    sources = cfg.bench.tasksets or [cfg.taskset.source]
    tasksets = {source: held_out(checked, source) for source in sources}
    rewards = {source: make_rewards(cfg.reward, cfg.taskset.model_copy(update={"source": source})) for source in sources}
    tracker = Tracker(checked.tracking_uri, cfg.tracking.experiment, f"{cfg.name}-bench",
                      artifact_root=out / "mlartifacts", tags={"campaign": cfg.name, "rftflow.mode": "bench"})
    tracker.log_params({"bench": cfg.bench.model_dump(), "seed": cfg.seed, "taskset.eval_size": cfg.taskset.eval_size})
    rows = []
    for index, ref in enumerate(cfg.bench.models):
        engine = eval_engine(ref, store, checked.tracking_uri, cfg)
        for source, tasks in tasksets.items():
            workflow = make_workflow(cfg, engine.tokenizer, reward_fn=rewards[source],
                                     context_limit=getattr(engine.model.config, "max_position_embeddings", None))
            accuracy = workflow.evaluate(engine, tasks, rewards[source], cfg.reward.function,
                                         cfg.eval.max_new_tokens)["accuracy/held_out"]
            rows.append({"model": ref, "taskset": source, "tasks": len(tasks), "accuracy": accuracy})
            tracker.log_metrics({f"bench/accuracy/{_metric_name(source)}": accuracy}, step=index)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(rows, indent=2) + "\n")
    tracker.client.log_table(tracker.run_id, {k: [r[k] for r in rows] for k in rows[0]}, "bench.json")
    tracker.finish()
    return {"campaign": cfg.name, "mode": "bench", "results": rows, "mlflow_tracking_uri": tracker.uri,
            "mlflow_run_id": tracker.run_id, "run_dir": str(out)}


def _metric_name(source: str) -> str:
    """A taskset source as an MLflow metric name part (``reasoning_gym:chain_sum`` → ``chain_sum``)."""
    name = source.split(":", 1)[1] if source.startswith("reasoning_gym:") else Path(source).stem
    return "".join(c if c.isalnum() or c in "_-." else "_" for c in name)
