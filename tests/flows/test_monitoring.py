"""Monitoring at a glance, read back from a real ``prefect server start`` and ``mlflow server``
(both started by ``rftflow up``, as a user does): after ``up``, a campaign reports to them with no
export; its flow run's tags say where it is while it runs, which campaign and MLflow run it is, and
which model it registered and where; a link artifact opens the MLflow run's charts in the training
view; two campaigns of one name in two run dirs never share a name; one artifact card per kind; the
MLflow experiment is tagged for the training view with its runs table's columns, its headline
metric sections come first and no metric is one the config fixes; two campaigns of a team write to
one tracking server at once and sit side by side; and the alert automation calls a webhook when a
campaign fails (its store goes away mid-run)."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import urlsplit

import pytest

from tests.faultproxy import FaultProxy
from tests.flows.user import UserRun, clean, run_to_end, sets

pytestmark = pytest.mark.slow  # two servers and four campaigns

SMALL = ["taskset.size=300", "taskset.eval_size=10", "trainer.warmup_steps=2", "trainer.micro_batch_size=16",
         "explorer.tasks_per_round=4", "explorer.repeat_times=4", "buffer.expert_per_round=8",
         "promotion.min_accuracy=0", "name=watched"]


@pytest.fixture(scope="module")
def up(cli_env, tmp_path_factory):
    """``rftflow up`` over run dir A, on a PREFECT_HOME of its own; the campaigns' environment has
    no PREFECT_API_URL (they find the server themselves)."""
    from rftflow.infra.ports import free_port

    home = tmp_path_factory.mktemp("monitoring")
    env = {k: v for k, v in cli_env.items() if k != "PREFECT_API_URL"} | {"PREFECT_HOME": str(home / "prefect")}
    ports = {"prefect": free_port(), "mlflow": free_port()}
    code, out = run_to_end(["up", str(home / "a"), "--prefect-port", str(ports["prefect"]),
                            "--mlflow-port", str(ports["mlflow"])], env=env)
    assert code == 0, out
    yield {"env": env, "home": home, "prefect": f"http://127.0.0.1:{ports['prefect']}",
           "mlflow": f"http://127.0.0.1:{ports['mlflow']}", "out": out}
    run_to_end(["down", str(home / "a")], env=env)


def _api(up, path: str, body: dict | None = None, server: str = "prefect"):
    base = up[server] + ("/api" if server == "prefect" else "/api/2.0/mlflow")
    request = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST" if body is not None
                                     else "GET")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


ROUNDS, EVAL_EVERY = 6, 3  # the watched campaign: its rounds, and a held-out evaluation every EVAL_EVERY of them
EVALUATED = list(range(0, ROUNDS + 1, EVAL_EVERY))  # 0 (before) to the last


def _flow_runs(up, name_like: str) -> list[dict]:
    return _api(up, "/flow_runs/filter", {"flow_runs": {"name": {"like_": name_like}}})


@pytest.fixture(scope="module")
def watched(up):
    """A campaign in run dir A, its flow run's tags read every 0.2 s while it runs."""
    args = ["run", "--run-dir", str(up["home"] / "a"), "--no-progress",
            *sets(*SMALL, f"rounds={ROUNDS}", f"eval.every={EVAL_EVERY}")]
    run = UserRun(args, env=up["env"])
    seen: list[list[str]] = []
    while run.proc.poll() is None:
        seen += [r["tags"] for r in _flow_runs(up, "watched-%") if r["state_type"] == "RUNNING"]
        time.sleep(0.2)
    code, out = run.finish()
    assert code == 0, out[-3000:]
    clean(out)
    (flow_run,) = _flow_runs(up, "watched-%")
    return {"out": out, "seen": seen, "flow_run": flow_run,
            "summary": json.loads((up["home"] / "a" / "summary.json").read_text())}


def test_after_up_a_campaign_reports_to_its_servers_with_no_export(up, watched):
    assert "`rftflow run` on this PREFECT_HOME reports to this Prefect server" in up["out"]
    assert f"reporting to the Prefect server of `rftflow up`: {up['prefect']}" in watched["out"]
    assert watched["flow_run"]["state_type"] == "COMPLETED"


def test_the_flow_run_tags_say_where_it_is_while_it_runs_and_which_run_it_is(up, watched):
    rounds = {int(m.group(1)) for tags in watched["seen"] for t in tags
              if (m := re.fullmatch(rf"round (\d+)/{ROUNDS}", t))}
    assert rounds and min(rounds) < ROUNDS, watched["seen"][-3:]  # seen mid-campaign, not only at the end
    assert any(t.startswith("accuracy ") for tags in watched["seen"] for t in tags)
    summary, tags = watched["summary"], set(watched["flow_run"]["tags"])
    assert {f"mlflow {summary['mlflow_run_id']}", f"round {ROUNDS}/{ROUNDS}",
            f"reward {summary['reward_mean_last_round']:.3f}",
            f"model {summary['model_name']} v{summary['model_version']} (a/mlflow.db)"} <= tags, tags  # its registry
    assert any(t.startswith("campaign watched-") for t in tags)


def test_one_artifact_card_per_kind_and_a_link_to_the_mlflow_run_in_the_training_view(up, watched):
    artifacts = _api(up, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [watched["flow_run"]["id"]]}}})
    kinds = sorted(a["key"].split("-a1-", 1)[1] for a in artifacts)
    assert kinds == ["mlflow", "progress", "rounds", "summary", "warm-start"], [a["key"] for a in artifacts]
    (link,) = [a for a in artifacts if a["key"].endswith("-mlflow")]
    run_id = watched["summary"]["mlflow_run_id"]
    assert re.fullmatch(rf"\[MLflow run watched-[0-9a-f]{{6}}-a1 \(watched-[0-9a-f]{{6}}\)\]\({re.escape(up['mlflow'])}"
                        rf"/#/experiments/\d+/runs/{run_id}/model-metrics\?workflowType=machine_learning\)",
                        link["data"]), link["data"]  # the run's charts
    (table,) = [a for a in artifacts if a["key"].endswith("-rounds")]
    rows = json.loads(table["data"])
    assert [r["round"] for r in rows] == list(range(ROUNDS + 1))  # round 0 (before) to the last
    # each evaluated round links its answers' table in MLflow (eval.shown_answers: 8 held-out tasks)
    links = {r["round"]: r["answers"] for r in rows if r["answers"]}
    experiment = _api(up, f"/runs/get?run_id={run_id}", server="mlflow")["run"]["info"]["experiment_id"]
    assert links == {r: f"{up['mlflow']}/#/experiments/{experiment}/runs/{run_id}/artifacts/answers/round-{r:04d}-text.json"
                     for r in EVALUATED}, links
    last = f"answers/round-{ROUNDS:04d}-text.json"
    with urllib.request.urlopen(f"{up['mlflow']}/get-artifact?path={last}&run_uuid={run_id}",
                                timeout=30) as response:
        answers = json.loads(response.read())
    assert answers["columns"] == ["taskset", "task_id", "prompt", "answer", "reward"] and len(answers["data"]) == 8


def test_the_mlflow_experiment_opens_for_training_with_the_headline_charts_first_and_no_fixed_values(up, watched):
    from rftflow.components.tracking import NOT_CHARTED

    run = _api(up, f"/runs/get?run_id={watched['summary']['mlflow_run_id']}", server="mlflow")["run"]
    experiment = _api(up, f"/experiments/get?experiment_id={run['info']['experiment_id']}", server="mlflow")
    tags = {t["key"]: t["value"] for t in experiment["experiment"].get("tags", [])}
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    # the runs table's saved view (the summary's experiment link opens it): the key metrics and progress as columns
    columns = json.loads(tags["mlflow.sharedViewState.rftflow"])["selectedColumns"]
    assert columns[:5] == ["metrics.`accuracy/held_out`", "metrics.`reward/mean`", "metrics.`loss/total`",
                           "tags.`rftflow.progress`", "tags.`rftflow.eta`"], columns
    summary = _summary_card(up, watched)
    assert f"({up['mlflow']}/#/experiments/{run['info']['experiment_id']}/runs?viewStateShareKey=rftflow&" \
           "workflowType=machine_learning)" in summary, summary
    assert f"({up['mlflow']}/#/models/arith-tiny/versions/1?workflowType=machine_learning)" in summary, summary
    metrics = {m["key"] for m in run["data"]["metrics"]}
    assert not metrics & NOT_CHARTED and "sample/staleness_max" not in metrics  # fixed by the config here
    sections = sorted({m.split("/", 1)[0] for m in metrics})
    headline = [s for s in sections if s in ("accuracy", "kl", "loss", "reward")]
    assert sections[:len(headline)] == headline and headline[0] == "accuracy", sections  # MLflow sorts sections
    history = _api(up, f"/metrics/get-history?run_id={run['info']['run_id']}&metric_key=accuracy/held_out",
                   server="mlflow")["metrics"]
    assert sorted(m["step"] for m in history) == EVALUATED  # before and after on one chart, from step 0


def _summary_card(up, watched) -> str:
    artifacts = _api(up, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [watched["flow_run"]["id"]]}}})
    (card,) = [a for a in artifacts if a["key"].endswith("-summary")]
    return card["data"]


def test_two_campaigns_of_one_name_in_two_run_dirs_never_share_a_name(up, watched):
    code, out = run_to_end(["run", "--run-dir", str(up["home"] / "b"), "--no-progress", *sets(*SMALL, "rounds=2")],
                           env=up["env"])
    assert code == 0, out[-3000:]
    names = sorted(r["name"] for r in _flow_runs(up, "watched-%"))
    assert len(names) == 2 and names[0] != names[1] and all(n.endswith("-a1") for n in names)
    keys = {a["key"] for a in _api(up, "/artifacts/filter", {}) if a["key"] and a["key"].startswith("watched-")}
    assert len(keys) == 5 + 4  # A's five kinds, B's four (no MLflow server over B: no link)
    from mlflow import MlflowClient

    runs = [MlflowClient(f"sqlite:///{up['home'] / d / 'mlflow.db'}").get_run(
        json.loads((up["home"] / d / "summary.json").read_text())["mlflow_run_id"]).info.run_name for d in ("a", "b")]
    assert runs[0] != runs[1] and all(re.fullmatch(r"watched-[0-9a-f]{6}-a1", r) for r in runs), runs


def test_a_teams_campaigns_written_at_once_to_one_tracking_server_sit_side_by_side(up, watched):
    """The team view: campaigns name the team's MLflow server (``tracking.uri``; here the one ``up``
    runs), two of one name in two run dirs write to it at once; its experiment holds both, named
    apart, and the registered model's versions say which campaign made them."""
    from mlflow import MlflowClient

    runs = [UserRun(["run", "--run-dir", str(up["home"] / d), "--no-progress",
                     *sets(*SMALL, "name=team", "rounds=2", f"tracking.uri={up['mlflow']}",
                           "tracking.registered_model=team-tiny")], env=up["env"]) for d in ("c", "d")]
    for run in runs:
        code, out = run.finish()
        assert code == 0, out[-3000:]
        clean(out)
    summaries = [json.loads((up["home"] / d / "summary.json").read_text()) for d in ("c", "d")]
    client = MlflowClient(up["mlflow"], registry_uri=up["mlflow"])
    team = [client.get_run(s["mlflow_run_id"]) for s in summaries]
    assert len({r.info.experiment_id for r in team}) == 1  # one experiment, side by side
    labels = [r.data.tags["rftflow.campaign_label"] for r in team]
    assert labels[0] != labels[1] and [r.info.run_name for r in team] == [f"{label}-a1" for label in labels]
    assert [r.data.tags["rftflow.run_dir"] for r in team] == [str(up["home"] / d) for d in ("c", "d")]
    versions = {v.tags["campaign_label"]: v for v in client.search_model_versions("name='team-tiny'")}
    assert set(versions) == set(labels)  # two versions of one name, each saying whose it is
    assert {versions[label].run_id for label in labels} == {r.info.run_id for r in team}
    assert "rftflow.progress" in team[0].data.tags and "rftflow.eta" in team[0].data.tags  # runs-table columns
    (flow_run,) = [r for r in _flow_runs(up, "team-%") if r["id"] == summaries[0]["prefect_flow_run_id"]]
    host = urlsplit(up["mlflow"]).netloc
    assert f"model team-tiny v{summaries[0]['model_version']} ({host})" in flow_run["tags"], flow_run["tags"]


class _Receiver(BaseHTTPRequestHandler):
    calls: list = []

    def do_POST(self):  # noqa: N802
        self.calls.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode())
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_alert_automation_calls_a_webhook_when_a_campaign_fails(up, watched, s3_server, s3_bucket):
    from rftflow.infra.ports import free_port

    port = free_port()
    receiver = HTTPServer(("127.0.0.1", port), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        code, out = run_to_end(["alerts", f"http://127.0.0.1:{port}/hook", "--stall-minutes", "5"], env=up["env"])
        assert code == 0 and "rftflow: campaign failed or crashed: automation" in out, out
        assert f"127.0.0.1:{port}" not in out  # the webhook's URL may carry a token: never printed
        automations = {a["name"]: a for a in _api(up, "/automations/filter", {})}
        stalled = automations["rftflow: campaign stalled"]["trigger"]
        assert stalled["posture"] == "Proactive" and stalled["within"] == 300.0
        assert set(stalled["after"]) == {"rftflow.campaign.round"}
        # what the stall automation watches: the campaigns' round and end events
        events = _api(up, "/events/filter", {"filter": {"event": {"prefix": ["rftflow.campaign."]}}, "limit": 50})
        watched_events = [e["event"] for e in events["events"] if e["resource"]["prefect.resource.id"].startswith(
            "rftflow.campaign.watched-")]
        assert "rftflow.campaign.round" in watched_events and "rftflow.campaign.ended" in watched_events
        # a campaign whose store starts refusing connections mid-run fails once its outage budget is spent
        with FaultProxy(urlsplit(s3_server.endpoint_url).port) as proxy:
            run = UserRun(["run", "--run-dir", str(up["home"] / "failing"), "--no-progress",
                           *sets(*SMALL, "name=failing", "rounds=40", f"storage.url=s3://{s3_bucket}/c",
                                 "storage.addressing_style=path", f"storage.endpoint_url={proxy.endpoint_url}",
                                 "storage.outage_seconds=2")], env={**up["env"], **s3_server.env})
            run.wait_for("Task run 'buffer[r=1]' - Finished")
            proxy.refuse()
            code, out = run.finish()
        assert code == 1 and "error:" in out, out[-3000:]
        (flow_run,) = _flow_runs(up, "failing-%")
        assert flow_run["state_type"] == "FAILED"
        deadline = time.monotonic() + 120
        while not _Receiver.calls and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _Receiver.calls, "no webhook call within 120 s"
        call = json.loads(_Receiver.calls[0])
        assert call["alert"] == "failed or crashed" and call["event"] == "prefect.flow-run.Failed"
        assert call["name"].startswith("failing-")
    finally:
        receiver.shutdown()
