"""infra/k8s/base-job-template.json, checked offline as a Kubernetes work pool and its worker check
it: the server's validation of a base job template, the variables as a JSON schema with valid
defaults, every field of prefect-kubernetes' default template kept, and the worker's own job
configuration built from it for the trainer deployment (2 GPUs, ``accelerate launch``)."""

import asyncio
import copy
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

TEMPLATE = Path(__file__).resolve().parents[1] / "infra" / "k8s" / "base-job-template.json"
PREFECT_YAML = Path(__file__).resolve().parents[1] / "prefect.yaml"
kubernetes_worker = pytest.importorskip("prefect_kubernetes.worker")


@pytest.fixture(scope="module")
def template() -> dict:
    return json.loads(TEMPLATE.read_text())


def test_the_server_accepts_it_and_its_variables_are_a_schema_whose_defaults_validate(template):
    from prefect.server.schemas.actions import validate_base_job_template

    validate_base_job_template(copy.deepcopy(template))  # every placeholder is a declared variable
    jsonschema.Draft202012Validator.check_schema(template["variables"])
    defaults = {k: p["default"] for k, p in template["variables"]["properties"].items() if "default" in p}
    jsonschema.validate(defaults, template["variables"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**defaults, "gpus": -1}, template["variables"])


def test_it_keeps_every_field_of_prefect_kubernetes_default_template(template):
    default = kubernetes_worker.KubernetesWorker.get_default_base_job_template()
    assert set(default["job_configuration"]) <= set(template["job_configuration"])
    assert set(default["variables"]["properties"]) <= set(template["variables"]["properties"])


def test_the_worker_builds_the_trainer_deployments_job_from_it(template):
    trainer = next(d for d in yaml.safe_load(PREFECT_YAML.read_text())["deployments"] if d["name"] == "arith-mix-trainer")
    command = trainer["work_pool"]["job_variables"]["command"]
    values = {"command": command, "image": "registry.example/rftflow:1", "gpus": 2, "namespace": "rft",
              "node_selector": {"gpu": "h100"}, "env": {"MLFLOW_TRACKING_URI": "http://mlflow:5000"}}
    # no block or variable references in it: the API client is never called (offline)
    config = asyncio.run(kubernetes_worker.KubernetesWorkerJobConfiguration.from_template_and_values(
        template, values, client=object()))
    pod = config.job_manifest["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example/rftflow:1" and container["args"] == command
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert pod["nodeSelector"] == {"gpu": "h100"} and pod["volumes"][0]["emptyDir"]["medium"] == "Memory"
    assert config.job_manifest["metadata"]["namespace"] == "rft" and config.job_manifest["kind"] == "Job"
    assert config.env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert config.env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"  # the template's own default kept
