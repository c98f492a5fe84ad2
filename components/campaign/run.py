"""``CampaignRun``: one attempt at a campaign, durable — state, MLflow run, checkpoints, resume.

A campaign's progress lives in its store (``campaign.state``: status, last round and stage, the
newest checkpoint, held-out accuracies, the MLflow run, every attempt) and in checkpoints
(``Campaign.checkpoint``). An attempt on a campaign that never started prepares it; an attempt on
an unfinished one restores the newest checkpoint and redoes the rounds after it: their explore
and buffer writes from the interrupted attempt are reused (shard keys are deterministic and
commits are put-if-absent), the FIFO cursor, replay counts and pass rates are put back as they
were, and the same MLflow run continues without logging a metric twice at one step. Model,
optimizer and RNG states are restored, so the campaign ends exactly where an uninterrupted one
ends. What is left to do is ``schedule.phases``, defined once: ``run`` walks it in plain Python
(``do``: each step its row of the step table, ``campaign.steps``), the Prefect flow as the tasks
made from the same rows. Nothing here imports Prefect.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rftflow.components.buffer.experiences import ExperienceStore
from rftflow.components.buffer.layout import open_run_store, shard_order
from rftflow.components.buffer.weights import CorruptCheckpoint
from rftflow.components.campaign.state import StateStore, claim, now, state_role
from rftflow.components.campaign.schedule import Phase, Planned, phases, round_stages
from rftflow.components.campaign.stages import Campaign
from rftflow.components.campaign.steps import StepKey, spec_of
from rftflow.components.data.report import validation_report
from rftflow.components.evaluation.shown import answer_tables
from rftflow.components.campaign.preflight import Preflight, run_name
from rftflow.components.explore.engines import weights_digest
from rftflow.components.stopping import StopFlag
from rftflow.components.explore.models import load_model
from rftflow.components.train import adapters
from rftflow.components.train.checkpoints import OPTIMIZER_FILES
from rftflow.components.tracking import Tracker, charted
from rftflow.components.version import VERSION

log = logging.getLogger("rftflow")
COMMIT_SECONDS = 5.0  # a round's metrics and state are written at most this often (see ``_tracked``)


class NoUsableCheckpoint(RuntimeError):
    """A campaign with checkpoints, none of them whole: it cannot resume (the message is one line)."""


def first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else ""


class CampaignRun:
    """An attempt at the campaign ``checked`` describes (``preflight``'s result).

    Made, it has written its attempt into the campaign's state, opened (or reopened) the MLflow
    run, loaded the models, and — for an unfinished campaign — restored the newest checkpoint:
    ``rounds_left`` are the rounds still to do, ``fresh`` whether ``prepare`` and the warm start
    come first.
    """

    def __init__(self, checked: Preflight, *, flow_run_id: str | None = None, flow_run_url: str | None = None,
                 stop: StopFlag | None = None):
        self.checked, self.cfg, self.run_dir = checked, checked.cfg, checked.run_dir
        cfg, out = self.cfg, self.run_dir
        self.flow_run_id = flow_run_id
        store = ExperienceStore(open_run_store(cfg.storage, out), cfg.name, write_behind=cfg.storage.write_behind,
                                shards=cfg.explorer.shards)
        self.states = StateStore(store.objects, cfg.name, state_role(cfg, out))
        # AlreadyRunning while another attempt holds it: nothing written, no MLflow run made
        self.state, self.killed = claim(self.states, cfg.name, cfg.model_dump(mode="json"), flow_run_id)
        try:
            self.campaign = Campaign(checked, store=store, stop=stop)  # loads the models
            # one MLflow run per incarnation (a --restart makes the next), named after its first attempt
            self.tracker = Tracker(checked.tracking_uri, cfg.tracking.experiment, run_name(cfg, out),
                                   artifact_root=out / "mlartifacts", run_id=self.state.mlflow_run_id,
                                   attempt=len(self.state.attempts),
                                   tags={"campaign": cfg.name, "rftflow.campaign_label": checked.label,
                                         "rftflow.run_dir": str(out), "rftflow.mode": cfg.mode,
                                         "rftflow.version": VERSION,
                                         "prefect.flow_run_id": flow_run_id or "",
                                         "prefect.flow_run_url": flow_run_url or "",
                                         "mlflow.source.name": "rftflow.flows.campaign.rft_campaign",
                                         "mlflow.note.content": describe(cfg, flow_run_id, flow_run_url)})
        except BaseException as e:  # the claimed attempt ends here, in the state (no MLflow run yet)
            stopped = isinstance(e, KeyboardInterrupt)  # a second Ctrl-C while the models load
            self._end_state("interrupted" if stopped else "failed",
                            "stopped at once while loading" if stopped else f"{type(e).__name__}: {first_line(e)}")
            raise
        self.tracker.log_params(cfg.model_dump(mode="json"))
        self.attempt: int = self.tracker.attempt  # counted across restarts: flow runs and artifacts show it
        self.state.mlflow_run_id = self.tracker.run_id
        self.states.write(self.state)
        self.on_warmup_step: Callable[[int, dict[str, float]], None] | None = None  # progress display hook
        self.answers_shown: dict[int, list[str]] = {}  # round → its held-out answers' MLflow tables (this attempt's)
        self.last_reward: float | None = None
        self.started = time.perf_counter()
        self._committed_at = -math.inf  # when ``_tracked`` last wrote the metrics and the state
        self.rounds_started: float | None = None  # when this attempt's first round stage began
        self.rounds_ended: float | None = None  # when its latest round stage ended
        self.resumed_from: int | None = None
        self.promotion: str | None = None  # the promotion's decision, in one line
        self._lock = threading.RLock()  # async mode: two lanes record their stages at once
        self.stages = round_stages(cfg.mode)  # the stages of a round this process runs
        self.step_seconds = 0.0  # the latest step's own time, its tracking included (``_tracked``)
        if not self.campaign.has_trainer:  # an explorer alone redoes its newest committed round (idempotent)
            shards = self.campaign.store.usual_shards()
            self.resumed_from = max(0, shard_order(shards[-1])[0] - 1) if shards else None
            return
        try:
            self._restore_newest_usable()
        except NoUsableCheckpoint as e:
            self.end("failed", str(e))
            raise

    def _restore_newest_usable(self) -> None:
        """Continue from the newest committed checkpoint whose files match its manifest (even if the
        state did not record it before a crash). A corrupt one is reported in one line and set aside
        (``WeightStore.set_aside_checkpoint``, kept until ``buffer gc``), and the one before it is
        tried: the rounds after it are redone. ``NoUsableCheckpoint`` when there were checkpoints and
        none is whole."""
        store = self.campaign.weight_store
        committed = store.checkpoints()
        for manifest in reversed(committed):
            version = manifest["version"]
            try:
                with tempfile.TemporaryDirectory() as into:
                    self.resumed_from = self.campaign.restore(version, Path(into))
            except CorruptCheckpoint as e:
                aside = store.set_aside_checkpoint(version, str(e))
                log.warning("%s: set aside; resuming from the checkpoint before it (kept under %s until "
                            "`rftflow buffer gc`)", e, aside)
                continue
            self.state.checkpoint = store.checkpoint_prefix(version)
            self.state.checkpoint_round = self.state.rounds_done = self.resumed_from
            return
        if committed:
            raise NoUsableCheckpoint(f"campaign {self.cfg.name}: none of its {len(committed)} checkpoints in "
                                     f"{store.url} is whole (each set aside as corrupt); --restart starts it over")

    # where the campaign stands ---------------------------------------------------------------
    @property
    def fresh(self) -> bool:
        """No checkpoint yet: the campaign starts with prepare and the warm start."""
        return self.resumed_from is None

    @property
    def rounds_left(self) -> range:
        return range((self.resumed_from or 0) + 1, self.cfg.rounds + 1)

    @property
    def accuracy_before(self) -> float | None:
        return self.state.evals.get("0")

    @property
    def accuracy_last(self) -> float | None:
        """The newest held-out accuracy measured."""
        return self.state.evals[max(self.state.evals, key=int)] if self.state.evals else None

    @property
    def stop_requested(self) -> str | None:
        """Why this attempt was asked to stop (after its current stage): a signal, a cancel; None: go on."""
        return self.campaign.stop.reason

    # stages: each timed; metrics (MLflow, step = round) and state committed after a round's last stage
    def _tracked(self, step: StepKey, round_no: int, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run ``work``, time it, and record its metrics (text values, such as a decision, are
        returned but not logged) and the campaign's progress. A round's
        stage metrics and the state are committed together (one MLflow write, one state write)
        after its last stage, at most every ``COMMIT_SECONDS`` (rounds of a fraction of a second
        would otherwise spend a tenth of their time on it); any other step commits at once, so
        everything is written at each evaluation, checkpoint and the end. What a crash loses is
        after the newest checkpoint, which a resumed campaign redoes and logs again."""
        start = time.perf_counter()
        result = work()
        metrics = {k: float(v) for k, v in result.items() if not isinstance(v, str)}
        end = time.perf_counter()
        metrics[f"time/{step.value}_s"] = end - start
        if step in self.stages:  # the span of this attempt's rounds: first stage's start to latest stage's end
            self.rounds_started = start if self.rounds_started is None else self.rounds_started
            self.rounds_ended = end
        with self._lock:
            last_stage = step == self.stages[-1]
            commit = step not in self.stages or (last_stage and end - self._committed_at >= COMMIT_SECONDS)
            self.tracker.log_metrics(charted(metrics), step=round_no, defer=not commit)
            self.last_reward = metrics.get("reward/mean", self.last_reward)
            self.state.round, self.state.stage = round_no, step.value
            if last_stage:
                self.state.rounds_done = round_no
            self.state.weight_version = self.campaign.policy_version
            if commit:
                self.states.write(self.state)
                self._committed_at = end
        self.step_seconds = time.perf_counter() - start  # the work and its tracking: what a task run wraps
        return {**metrics, **{k: v for k, v in result.items() if isinstance(v, str)}}

    # what is left, and a step of it -----------------------------------------------------------
    def phases(self) -> Iterator[Phase]:
        """What is left of this attempt (``schedule.phases``)."""
        return phases(self.cfg, first_round=self.rounds_left.start, fresh=self.fresh)

    def steps(self) -> Iterator[Planned]:
        """What is left, in order: ``phases`` flattened."""
        for phase in self.phases():
            for lane in phase:
                yield from lane

    def do(self, planned: Planned) -> dict[str, Any]:
        """Step ``planned``: its row of the step table (``campaign.steps``) run, and tracked
        (``_tracked``) when the row says so."""
        spec, r = spec_of(planned.step), planned.round
        if not spec.tracked:
            return spec.work(self, r)
        return self._tracked(planned.step, r, lambda: spec.work(self, r))

    def round(self, round_no: int) -> dict[str, float]:
        """This process's stages of round ``round_no`` (``stages``), in order; their metrics."""
        return {k: v for step in self.stages for k, v in self.do(Planned(step, round_no)).items()}

    def run(self) -> dict[str, Any]:
        """Every step left, then the summary (in plain Python; the flow runs them as tasks): the
        lanes of a phase in threads, at once."""
        for phase in self.phases():
            if len(phase) == 1:
                for planned in phase[0]:
                    self.do(planned)
                continue
            with ThreadPoolExecutor(len(phase)) as pool:
                for done in [pool.submit(lambda lane=lane: [self.do(p) for p in lane]) for lane in phase]:
                    done.result()
        return self.finish()

    # the steps that the table (``campaign.steps``) runs through this attempt -------------------
    def evaluate(self, round_no: int) -> dict[str, float]:
        """Held-out accuracy at ``round_no`` (0 = before the rounds), kept in the state; a few of
        its answers (``eval.shown_answers`` per taskset) as MLflow tables, ``answers/round-NNNN-<kind>.json``
        (``evaluation.shown``)."""
        answers: list | None = [] if self.cfg.eval.shown_answers else None
        metrics = self.campaign.evaluate(answers=answers)
        self.state.evals[str(round_no)] = metrics["accuracy/held_out"]
        for kind, columns in answer_tables(answers or (), self.cfg.eval.shown_answers).items():
            path = f"answers/round-{round_no:04d}-{kind}.json"
            self.tracker.log_table(columns, path)
            self.answers_shown.setdefault(round_no, []).append(path)
        return metrics

    def checkpoint(self, round_no: int) -> dict[str, Any]:
        """Checkpoint after ``round_no``: all of it to the store (what a resume reads), and to the
        MLflow run (``checkpoints/vNNNNNN``) all but the optimizer states (``OPTIMIZER_FILES``,
        twice the weights under AdamW: the run keeps the model, the store the means to resume);
        then retention: the newest ``checkpoint.keep_last`` and, with ``keep_best``, the one with
        the best held-out accuracy stay; the others go from both places."""
        accuracy = self.state.evals.get(str(round_no))
        with tempfile.TemporaryDirectory() as out:
            manifest = self.campaign.checkpoint(round_no, Path(out), eval_accuracy=accuracy, created_at=now())
            for name in OPTIMIZER_FILES:
                Path(out, name).unlink(missing_ok=True)
            self.tracker.log_artifacts(out, _artifact_path(manifest["prefix"]))
        self.state.checkpoint, self.state.checkpoint_round = manifest["prefix"], round_no
        self.states.write(self.state)
        self._retire_checkpoints()
        return manifest

    def _retire_checkpoints(self) -> None:
        self.campaign.weight_store.delete_warm_starts()  # a checkpoint after the warm start supersedes its own
        manifests = self.campaign.weight_store.checkpoints()
        keep = {m["version"] for m in manifests[-self.cfg.checkpoint.keep_last:]}
        scored = [m for m in manifests if m.get("eval_accuracy") is not None]
        if self.cfg.checkpoint.keep_best and scored:
            keep.add(max(scored, key=lambda m: (m["eval_accuracy"], m["version"]))["version"])
        for m in manifests:
            if m["version"] not in keep:
                self.campaign.weight_store.delete_checkpoint(m["version"])
                self.tracker.delete_artifacts(_artifact_path(self.campaign.weight_store.checkpoint_prefix(m["version"])))

    # the end ---------------------------------------------------------------------------------
    def register(self, round_no: int) -> dict[str, str]:
        """The final model (a Hugging Face model directory) logged to the MLflow run and registered
        as a version of ``tracking.registered_model``, once per run; tagged with the campaign, its
        held-out accuracy and the Prefect flow run. With LoRA the version is the adapter (PEFT's
        files), naming its base by a ``models:/`` reference (``register_base``; tag ``base_model``)."""
        name = self.cfg.tracking.registered_model
        accuracy = self.state.evals.get(str(round_no))
        tags = {"campaign": self.cfg.name, "campaign_label": self.checked.label, "run_dir": str(self.run_dir),
                "eval_accuracy": f"{accuracy:.4f}" if accuracy is not None else "",
                "prefect.flow_run_id": self.flow_run_id or ""}
        trainer = self.campaign.trainer
        if trainer.lora:
            base, _ = load_model(self.cfg.model.path, allow_download=self.cfg.model.allow_download,
                                 dtype=self.cfg.model.dtype)
            base_uri = self.register_base(base)
            source = self._logged("model", functools.partial(adapters.save_adapter, trainer.unwrapped,
                                                             base=base_uri))
            tags |= {"base_model": base_uri, "adapter": "lora"}
        else:
            source = self._logged("model", trainer.unwrapped.save_pretrained)
        version = self.tracker.register(name, source, tags)
        if trainer.lora and self.cfg.tracking.register_merged:
            base.load_state_dict(trainer.policy_weights())  # the base becomes the merged policy
            self.tracker.register(f"{name}-merged", self._logged("merged_model", base.save_pretrained),
                                  {**tags, "adapter_version": f"models:/{name}/{version}"})
        self.state.model_version = version
        self.states.write(self.state)
        return {"model_name": name, "model_version": version, "model_uri": f"models:/{name}/{version}"}

    def register_base(self, model) -> str:
        """A LoRA campaign's base ``model`` as a version of ``<tracking.registered_model>-base``,
        once: a version with the same weights (its ``weights_sha256`` tag) is reused. Its ``models:/`` URI."""
        state = model.state_dict()
        digest = weights_digest(state, state)
        name = f"{self.cfg.tracking.registered_model}-base"
        version = self.tracker.version_tagged(name, "weights_sha256", digest)
        if version is None:
            version = self.tracker.register(name, self._logged("base_model", model.save_pretrained),
                                            {"weights_sha256": digest, "model_path": self.cfg.model.path})
        return f"models:/{name}/{version}"

    def _logged(self, artifact_path: str, save: Callable[[Path], None]) -> str:
        """A model directory — what ``save(dir)`` writes, and the tokenizer — as ``<run dir>/<artifact_path>``
        and the MLflow run's ``artifact_path``; its artifact URI."""
        out = self.run_dir / artifact_path
        shutil.rmtree(out, ignore_errors=True)
        save(out)
        (self.campaign.processor or self.campaign.tokenizer).save_pretrained(out)
        return self.tracker.log_artifacts(out, artifact_path)

    def promote(self, round_no: int) -> dict[str, Any]:
        """The registered version against the ``champion`` alias (``components.promotion``): the
        alias moves on a clear, significant win; the decision's line goes into the summary."""
        from rftflow.components.campaign.promotion import promote

        decision = promote(self.checked, self.state.model_version)
        self.promotion = decision.line()
        metrics = {"version/promoted": float(decision.promoted), "decision": self.promotion}
        if decision.p_value is not None:
            metrics["version/p_value"] = decision.p_value
        return metrics

    def validation_report(self, store_reachable: bool = True) -> tuple[Path, str]:
        """``<run dir>/validation/validation.md``, also logged to the MLflow run: (path, artifact URI).
        With the store down, the ingested files' reports (kept there) are left out."""
        path = self.run_dir / "validation" / "validation.md"
        path.parent.mkdir(exist_ok=True)
        path.write_text(validation_report(self.campaign.validation.with_ingested(
            self.campaign.store.ingest_reports() if store_reachable else []), self.cfg.name))
        return path, self.tracker.log_artifacts(path.parent, "validation")

    def finish(self, **extra: Any) -> dict[str, Any]:
        """The summary, with ``extra`` keys (an orchestrator's, say), also ``<run dir>/summary.json``;
        the campaign recorded finished."""
        before, after = self.accuracy_before, self.accuracy_last
        report, report_uri = self.validation_report()
        name = self.cfg.tracking.registered_model
        summary = {
            "campaign": self.cfg.name, "eval_accuracy_before": before, "eval_accuracy_after": after,
            "rounds": self.cfg.rounds, "reward_mean_last_round": self.last_reward, "wall_seconds": self.wall_seconds(),
            "rounds_wall_seconds": round(self.rounds_ended - self.rounds_started, 3) if self.rounds_started else None,
            "mlflow_tracking_uri": self.tracker.uri, "mlflow_run_id": self.tracker.run_id, "model_name": name,
            "model_version": self.state.model_version, "model_uri": f"models:/{name}/{self.state.model_version}",
            "store_url": self.campaign.store.url, "prefect_flow_run_id": self.flow_run_id or "",
            "run_dir": str(self.run_dir), "validation_report": str(report), "validation_report_mlflow": report_uri,
            "attempts": len(self.state.attempts), "resumed_from_round": self.resumed_from, "mode": self.cfg.mode,
            "promotion": self.promotion, "accuracy_by": self.campaign.reward_fn.accuracy_rule, **extra,
        }
        if self.cfg.mixture:
            summary["eval_accuracy_by_taskset"] = self.accuracy_by_taskset()
        if self.cfg.retention.after_campaign:
            summary["gc_deleted_objects"] = self.collect_garbage()
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        self.end("finished")
        return summary

    def accuracy_by_taskset(self) -> dict[str, dict[str, float | None]]:
        """A mixture's held-out accuracy per taskset (``accuracy/<part>/held_out`` in the MLflow run,
        all attempts): ``before`` the rounds (round 0) and ``after``, at the last evaluation."""
        by_part = {}
        for part in self.cfg.mixture:
            key = f"accuracy/{part.name}/held_out"
            seen = sorted((step, metrics[key]) for step, metrics in self.tracker.history.items() if key in metrics)
            by_part[part.name] = {"before": dict(seen).get(0), "after": seen[-1][1] if seen else None}
        return by_part

    def collect_garbage(self) -> int:
        """``retention.after_campaign``: what the finished campaign no longer needs leaves its store
        (``components.buffer.retention``); the number of objects deleted."""
        from rftflow.components.buffer.retention import apply, plan

        self.campaign.store.flush()
        deleted = apply(self.campaign.store, plan(self.campaign.store, self.cfg.model_dump(mode="json"), finished=True))
        log.info("buffer gc after the campaign: %d objects deleted from %s", deleted, self.campaign.store.url)
        return deleted

    def end(self, outcome: str, error: str | None = None, *, store_reachable: bool = True) -> None:
        """Record how this attempt ended (finished | failed | interrupted) in the MLflow run's status
        (FINISHED | FAILED | KILLED) and in the state (unless the store is the thing that is down:
        the state then says running, with this process gone, which a new attempt resumes)."""
        if self.campaign.trainer is not None:
            self.campaign.trainer.release()  # its other processes, if any, end too
        self.campaign.reward_fn.close()  # its sandbox pool, its worker processes
        self.tracker.finish({"finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}[outcome])
        if store_reachable:
            self._end_state(outcome, error)

    def _end_state(self, outcome: str, error: str | None) -> None:
        self.state.status = outcome
        self.state.attempt.ended_at, self.state.attempt.outcome, self.state.attempt.error = now(), outcome, error
        self.state.error = error
        self.states.write(self.state)

    def wall_seconds(self) -> float:
        return round(time.perf_counter() - self.started, 1)


def describe(cfg, flow_run_id: str | None, flow_run_url: str | None) -> str:
    """The MLflow run's description (markdown): what the campaign is, and its Prefect flow run."""
    flow_run = (f"[{flow_run_id}]({flow_run_url})" if flow_run_url else f"`{flow_run_id}`") if flow_run_id else "none"
    return (f"rftflow campaign **{cfg.name}** (mode {cfg.mode}): algorithm {cfg.algorithm.name}, {cfg.rounds} rounds of "
            f"{cfg.explorer.tasks_per_round} tasks × {cfg.explorer.repeat_times} responses on `{cfg.taskset.source}`, "
            f"model `{cfg.model.path}`. Prefect flow run: {flow_run}.")


def _artifact_path(prefix: str) -> str:
    """``<campaign>/checkpoints/vNNNNNN`` → ``checkpoints/vNNNNNN`` (the run's artifact path)."""
    return prefix.split("/", 1)[1]


def move_aside(checked: Preflight) -> str:
    """Before a restart: the campaign's objects moved to ``<campaign>.moved-<UTC time>/`` in its
    store, and its files in the run dir (summary, final model, validation report) to
    ``<run dir>/moved-<UTC time>/``. Nothing is deleted; the MLflow run stays where it is, tagged
    ``rftflow.moved_aside`` (and ended KILLED if it was left RUNNING; with the campaign's state lost
    from its store, every run of it from this run dir). Returns what moved."""
    from rftflow.components.campaign.state import StateStore, tracked_attempts
    from rftflow.components.buffer.store import open_store, parse_store_url, store_options

    cfg, run_dir = checked.cfg, checked.run_dir
    stamp = time.strftime("moved-%Y%m%d-%H%M%S", time.gmtime())
    scheme, location, _ = parse_store_url(checked.store_url)
    moved = []
    if scheme == "file":
        if (Path(location) / cfg.name).is_dir():
            (Path(location) / cfg.name).rename(Path(location) / f"{cfg.name}.{stamp}")
            moved.append(f"{checked.store_url}/{cfg.name} → {cfg.name}.{stamp}")
        store = None
    else:
        store = open_store(checked.store_url, **store_options(cfg.storage))
    previous = StateStore(store, cfg.name).read() if store is not None else None
    if store is not None:
        for key in store.list(f"{cfg.name}/"):
            store.put(f"{cfg.name}.{stamp}/{key.split('/', 1)[1]}", store.get(key))
            store.delete(key)
        moved.append(f"{checked.store_url}/{cfg.name} → {cfg.name}.{stamp}")
    for name in ("summary.json", "model", "validation", "store.json"):
        if (run_dir / name).exists():
            (run_dir / stamp).mkdir(exist_ok=True)
            (run_dir / name).rename(run_dir / stamp / name)
    if (run_dir / stamp).exists():
        moved.append(f"{run_dir}/{{summary.json, model, validation}} → {stamp}/")
    if previous is None and scheme == "file" and (Path(location) / f"{cfg.name}.{stamp}").is_dir():
        previous = StateStore(open_store(checked.store_url), f"{cfg.name}.{stamp}").read()
    # its MLflow run; with its state lost from the store, every run of it this run dir's tracking store holds
    runs = ([previous.mlflow_run_id] if previous.mlflow_run_id else []) if previous is not None else \
        tracked_attempts(checked.tracking_uri, cfg.tracking.experiment, run_name(cfg, run_dir))
    if runs:
        from mlflow import MlflowClient

        client = MlflowClient(checked.tracking_uri)
        for run_id in runs:
            client.set_tag(run_id, "rftflow.moved_aside", stamp)
            if client.get_run(run_id).info.status == "RUNNING":
                client.set_terminated(run_id, status="KILLED")
    return "; ".join(moved) or "nothing to move"
