"""Make the screenshots of docs/operations/monitoring.md, each checked by the text a user reads on
it: ``rftflow up`` over a fresh run dir, campaigns reporting to it, then headless Chromium on the
pages a user opens (the page's text after its scripts ran, then its picture). A page that lacks
what the docs show, or shows what they say it does not, fails the script: exit 1, one line a page.

    python docs/screenshots.py     # writes docs/operations/img/*.png (needs Debian's chromium)

Checked: the flow run during the warm start (its step and ETA), the flow runs after a
``--restart`` (two attempts, two names), the MLflow link of the summary (the training view, not
GenAI's; the accuracy, loss and reward charts first), the experiment's runs table (the key metrics
and progress as columns), the model version, the ``rftflow promote`` flow run (its tags, the link
it printed answering) and two campaigns of a team side by side on one tracking server.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "operations" / "img"
CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]
GENAI = ("Judges", "Prompts & versions", "AI Gateway")  # the GenAI view's sidebar
FAILED: list[str] = []


def page_text(url: str, profile: Path, wait_ms: int) -> str:
    """The page's visible text once its scripts ran (``--dump-dom``), tags removed."""
    dom = subprocess.run([*CHROMIUM, f"--user-data-dir={profile}", f"--virtual-time-budget={wait_ms}",
                          "--window-size=1440,1000", "--dump-dom", url], capture_output=True, text=True,
                         timeout=300).stdout
    text = re.sub(r"<[^>]+>", " ", re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S))
    return html.unescape(re.sub(r"\s+", " ", text))


def shoot(url: str, name: str, profile: Path, *, says: tuple[str, ...] = (), never: tuple[str, ...] = (),
          order: tuple[str, ...] = (), height: int = 1000, wait_ms: int = 30000) -> str:
    """Check the page (``says`` each, ``never`` none, ``order`` in that order), then save its
    picture as ``name``; its text."""
    text = page_text(url, profile, wait_ms)
    missing = [s for s in says if s not in text] + [f"not {s}" for s in never if s in text]
    places = [text.find(s) for s in order]
    if -1 in places or places != sorted(places):
        missing.append(f"in the order {order} (at {places})")
    if missing:
        FAILED.append(f"{name}: {url}: " + "; ".join(missing))
    subprocess.run([*CHROMIUM, f"--user-data-dir={profile}", f"--screenshot={OUT / name}",
                    f"--window-size=1440,{height}", f"--virtual-time-budget={wait_ms}", url],
                   check=True, capture_output=True, timeout=300)
    print(f"{OUT / name}  ←  {url}" + ("  (CHECK FAILED)" if missing else ""))
    return text


def api(url: str, body: dict | None = None):
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST" if body else "GET")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def flow_runs(ui: str, like: str) -> list[dict]:
    return api(f"{ui}/api/flow_runs/filter", {"flow_runs": {"name": {"like_": like}}, "sort": "START_TIME_ASC"})


def main() -> None:
    from rftflow.infra.ports import free_port

    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rftflow-shots-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "MLFLOW_TRACKING"))}
    env |= {"PREFECT_HOME": str(work / "prefect"), "PYTHONUNBUFFERED": "1"}
    prefect, mlflow = free_port(), free_port()
    rftflow = [sys.executable, "-m", "rftflow.flows.cli"]
    run_dir, profile = work / "runs" / "arith-mix", work / "chromium"
    ui, ml = f"http://127.0.0.1:{prefect}", f"http://127.0.0.1:{mlflow}"
    subprocess.run([*rftflow, "up", str(run_dir), "--prefect-port", str(prefect), "--mlflow-port", str(mlflow)],
                   env=env, check=True)
    campaign = [*rftflow, "run", "--run-dir", str(run_dir), "--no-progress"]
    # small enough for a loaded 2-core machine: 2000 tasks (40 held out), a warm start of 80 steps
    small = ["taskset.size=2000", "taskset.eval_size=40", "promotion.min_accuracy=0"]
    config = [*small, "rounds=3", "trainer.warmup_steps=80", "trainer.warmup_until=0.95",
              "trainer.warmup_check_every=40", "eval.every=1"]
    try:
        first = subprocess.Popen([*campaign, *(f"--set={s}" for s in config)], env=env, stdout=subprocess.DEVNULL)
        tags: list[str] = []
        while first.poll() is None and not (any(t.startswith("eta ") for t in tags) and any(
                re.fullmatch(r"warm start [2-7]\d/80", t) for t in tags)):
            time.sleep(1)
            tags = [t for run in flow_runs(ui, "arith-mix-%") for t in run["tags"]]
        (flow_run,) = flow_runs(ui, "arith-mix-%")
        shoot(f"{ui}/runs/flow-run/{flow_run['id']}", "prefect-warm-start.png", profile,
              says=("warm start ", "/80", "sft loss", "eta ≤", "(warm start)", "-a1"))
        assert first.wait() == 0, "the first campaign failed"
        summary = json.loads((run_dir / "summary.json").read_text())
        shoot(f"{ui}/runs/flow-run/{flow_run['id']}", "prefect-flow-run.png", profile,
              says=("round 3/3", f"model arith-tiny v{summary['model_version']}", "campaign arith-mix-"))
        shoot(f"{ui}/artifacts", "prefect-artifacts.png", profile, height=700, says=("-a1-warm-start", "-a1-summary"))
        (table,) = [card for card in api(f"{ui}/api/artifacts/filter", {"artifacts": {"flow_run_id": {
            "any_": [flow_run["id"]]}}}) if (card["key"] or "").endswith("-a1-rounds")]
        shoot(f"{ui}/artifacts/artifact/{table['id']}", "prefect-rounds.png", profile, height=1100)
        cards = api(f"{ui}/api/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run["id"]]}}})
        (markdown,) = [card for card in cards if (card["key"] or "").endswith("-a1-summary")]
        links = re.findall(r"\]\((http[^)]+)\)", markdown["data"])  # the run, its experiment, its model version
        run_link, experiment_link, model_link = links
        shoot(run_link, "mlflow-model-metrics.png", profile, height=1400, wait_ms=90000,
              says=("Model metrics", "Model registry"), never=GENAI, order=("accuracy (", "loss (", "reward ("))
        shoot(model_link, "mlflow-model-version.png", profile, never=GENAI,
              says=(f"Version {summary['model_version']}", "campaign_label", "promotion.decision"))

        again = [*(f"--set={s}" for s in small), "--set=rounds=1", "--set=trainer.warmup_steps=20"]
        subprocess.run([*campaign, "--restart", *again], env=env, check=True, stdout=subprocess.DEVNULL)
        names = [run["name"] for run in flow_runs(ui, "arith-mix-%")]
        assert len(names) == 2 and names[0].endswith("-a1") and names[1].endswith("-a2"), names
        shoot(f"{ui}/runs", "prefect-attempts.png", profile, says=tuple(names))

        promoted = subprocess.run([*rftflow, "promote", "--run-dir", str(run_dir), "--version=1", *again], env=env,
                                  capture_output=True, text=True, check=True)
        (link,) = re.findall(r"^flow run: (http\S+)$", promoted.stderr, re.M) or [f"no link in: {promoted.stderr}"]
        shoot(link, "prefect-promote.png", profile,
              says=("campaign arith-mix-", "model arith-tiny (", "challenger v1", "champion v"))

        team = [subprocess.Popen([*rftflow, "run", "--run-dir", str(work / "runs" / person), "--no-progress",
                                  f"--set=name={person}-mix", *again, f"--set=tracking.uri={ml}"],
                                 env=env, stdout=subprocess.DEVNULL) for person in ("alice", "bob")]
        assert [p.wait() for p in team] == [0, 0], "a team campaign failed"
        shoot(experiment_link, "mlflow-experiment.png", profile, never=GENAI,
              says=("accuracy/held_out", "reward/mean", "rftflow.progress", "alice-mix-", "bob-mix-"))
    finally:
        subprocess.run([*rftflow, "down", str(run_dir)], env=env, check=False)
        time.sleep(1)
    if FAILED:
        print("\n".join(["pages that do not say what the docs show:", *FAILED]), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
