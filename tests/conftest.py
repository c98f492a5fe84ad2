"""Shared fixtures: a private scratch folder and model cache, quiet service defaults, a Prefect test
API, an S3 server, the default campaign config and the overrides that make it small, and registries left as found."""

from __future__ import annotations

import atexit
import gc
import importlib
import importlib.util
import os
import resource
import shutil
import tempfile
from pathlib import Path

import pytest

if not os.environ.get("PYTEST_XDIST_WORKER"):  # the controlling process; workers inherit what it sets
    # Everything the tests and their processes put in the temp dir (a SIGKILLed campaign leaves its
    # temporary folders behind, a model cache holds converted checkpoints) lands in one folder that
    # goes when the run ends; pytest's own tmp_path folders stay in the system temp dir, and
    # `tmp_path_retention_policy` (pyproject) keeps only those of failed tests.
    _SCRATCH = tempfile.mkdtemp(prefix="rftflow-tests-")
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
    os.environ["TMPDIR"] = _SCRATCH
    tempfile.tempdir = None
    os.environ.setdefault("RFTFLOW_CACHE_DIR", os.path.join(_SCRATCH, "cache"))
    atexit.register(shutil.rmtree, _SCRATCH, True)
if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n 2 (pyproject): two workers share the 2 cores
    # one torch thread per worker and per process it starts: two processes at torch's default
    # threads each (every core) thrash, ~50x slower; builtin:tiny gains nothing from a second thread
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
import rftflow.flows  # noqa: E402,F401  (applies the quiet service defaults before Prefect is imported)

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "arith-mix.yaml"
# The default campaign cut to a few seconds: 300 tasks (10 held out), 2 rounds of 4 tasks × 4
# responses, 2 warm-start steps, 8 demonstrations a round, micro-batches of 16.
SMALL = ("rounds=2", "taskset.size=300", "taskset.eval_size=10", "trainer.warmup_steps=2",
         "trainer.micro_batch_size=16", "explorer.tasks_per_round=4", "explorer.repeat_times=4",
         "buffer.expert_per_round=8")


# The longest modules first, longest to shortest (`pytest --durations=0` summed per module, every module of a
# minute or more; the test-benchmarks module ~6 to 12 minutes on 2 cores): under `-n 2 --dist loadfile` (pyproject)
# a module runs on one worker, and one of these started last would leave the other worker idle at the end
LONGEST_FIRST = ("tests/test_benchmarks.py", "components/train/test_learning.py", "flows/test_trainer_processes.py",
                 "components/explore/test_server_engines.py",
                 "components/explore/test_server_vision.py", "flows/test_failures.py",
                 "components/train/test_data_parallel.py", "components/test_real_model.py",
                 "components/test_real_skill_configs.py",
                 "flows/test_monitoring.py", "flows/test_stops.py", "components/campaign/test_workflow_modes.py",
                 "flows/test_user_failures.py", "flows/test_kill_resume.py",
                 "components/explore/test_server_pool.py", "components/explore/test_sampling_as_trl.py",
                 "flows/test_interrupts.py", "flows/test_cli_user.py", "flows/test_deployments.py",
                 "flows/test_alerts.py", "flows/test_sharded_explorers.py", "tests/test_package.py",
                 "flows/test_promotion.py", "flows/test_attempts.py", "tests/test_walkthrough.py",
                 "flows/test_s3_outage.py", "components/verify/test_judge_and_reward_model.py",
                 "components/verify/test_laptop_examples.py")


# Parts the suite tests that a machine may lack; a run without one fails at its start, naming it,
# unless RFTFLOW_ALLOW_MISSING (comma-separated names; CI does not set it) lets their tests skip.
PARTS = ("vllm", "bwrap")
ALLOWED_MISSING = {name.strip() for name in os.environ.get("RFTFLOW_ALLOW_MISSING", "").split(",") if name.strip()}


def missing_parts() -> dict[str, str]:
    """Each part of ``PARTS`` that cannot run here: name → why, in one line."""
    from rftflow.components.verify.sandbox import Sandbox, SandboxUnavailable
    from rftflow.infra.vllm_server import vllm_problem

    missing = {}
    if problem := vllm_problem():
        missing["vllm"] = problem
    try:
        Sandbox().check()
    except SandboxUnavailable as e:
        missing["bwrap"] = str(e)
    return missing


def pytest_sessionstart(session):
    """Stop the run at its start when a part it tests cannot run and the run did not opt out of it:
    a broken build must fail CI, not turn its tests into skips."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # the controlling process checked
    unknown = ALLOWED_MISSING - set(PARTS)
    if unknown:
        pytest.exit(f"RFTFLOW_ALLOW_MISSING names {sorted(unknown)}; known parts: {', '.join(PARTS)}", returncode=4)
    refused = {name: why for name, why in missing_parts().items() if name not in ALLOWED_MISSING}
    if refused:
        pytest.exit("; ".join(f"{name}: {why}" for name, why in refused.items())
                    + f" (RFTFLOW_ALLOW_MISSING={','.join(refused)} lets the run go on without it)",
                    returncode=4)


def pytest_collection_modifyitems(config, items):
    """Run the modules of ``LONGEST_FIRST`` first, in that order; the rest as collected."""
    def rank(item) -> int:
        path = item.nodeid.split("::")[0]
        return next((i for i, m in enumerate(LONGEST_FIRST) if path.endswith(m)), len(LONGEST_FIRST))

    items.sort(key=rank)


def pytest_collection_finish(session):
    """Import the libraries the tests use with the cyclic collector off, then freeze them (as
    ``flows.cli.main`` does for a run): every full collection would walk their ~1M objects again
    (16 full collections cost each worker ~7 s of the not-slow tests before this)."""
    gc.disable()
    for name in ("great_expectations", "mlflow", "prefect", "transformers"):
        if importlib.util.find_spec(name) is not None:  # a GPU machine may hold the components' libraries only
            importlib.import_module(name)

    gc.freeze()
    gc.enable()
    global _cpu_mark
    _cpu_mark = _cpu_seconds()  # the tests' CPU counts from here


def _cpu_seconds() -> float:
    """User + system CPU of this process and of every process it has waited for (servers, campaigns)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_cpu_mark = 0.0  # this process's CPU-seconds at its last test report (or at the end of its collection)
_CPU_BY_MODULE: dict[str, float] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report carries the CPU-seconds spent since the last one (``cpu_s``), fixtures and the
    processes they waited for included. Wall time says little on 2 cores shared by two workers: a module's
    seconds depend on what the other worker runs beside it; CPU-seconds do not."""
    global _cpu_mark
    report = (yield).get_result()
    now = _cpu_seconds()
    report.user_properties.append(("cpu_s", now - _cpu_mark))
    _cpu_mark = now


def pytest_runtest_logreport(report):
    """Sum ``cpu_s`` by module (in the controlling process, from every worker's reports)."""
    module = report.nodeid.split("::")[0]
    _CPU_BY_MODULE[module] = _CPU_BY_MODULE.get(module, 0.0) + sum(v for k, v in report.user_properties if k == "cpu_s")


def pytest_terminal_summary(terminalreporter):
    """The modules' CPU-seconds, largest first (the ones to cut when the suite is too long)."""
    if not _CPU_BY_MODULE:
        return
    ranked = sorted(_CPU_BY_MODULE.items(), key=lambda kv: -kv[1])
    terminalreporter.write_sep("-", f"CPU-seconds by module: {sum(_CPU_BY_MODULE.values()):.0f} in all")
    for module, seconds in ranked[:15]:
        terminalreporter.write_line(f"{seconds:8.1f}  {module}")


def pytest_unconfigure(config):
    """Freeze the heap before this process exits: the interpreter's exit collections of it took 3–4 s."""
    gc.freeze()


@pytest.fixture(scope="session")
def default_config() -> Path:
    """configs/arith-mix.yaml, the campaign ``rftflow run`` runs by default."""
    return DEFAULT_CONFIG


@pytest.fixture(scope="session")
def small() -> tuple[str, ...]:
    """``--set`` overrides that make the default campaign small (see ``SMALL``); add your own after them."""
    return SMALL


@pytest.fixture(autouse=True)
def _registries_restored():
    """Advantages, losses and pipeline operators a test registers are gone after it."""
    from rftflow.components.algorithms.registry import _REGISTRIES
    from rftflow.components.data.pipelines import _OPERATORS

    saved = [(registry, dict(registry)) for registry in (*_REGISTRIES.values(), *_OPERATORS.values())]
    yield
    for registry, before in saved:
        registry.clear()
        registry.update(before)


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Torch's threads as the test found them: a campaign whose config sets ``threads`` (the SmolLM2
    configs: 2) sets them for the whole process, and this worker's next tests would run at that count
    beside the other worker on the same cores."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def prefect_api():
    """A real (temporary) Prefect API for the whole session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def tiny():
    """builtin:tiny, built once, loaded like any local model directory."""
    from rftflow.components.explore.models import load_model

    return load_model("builtin:tiny")


@pytest.fixture(scope="session")
def tiny_vlm():
    """builtin:tiny-vlm, built once: (model, tokenizer, processor), loaded like any Idefics3 directory."""
    from rftflow.components.explore.models import load_model, load_processor

    return (*load_model("builtin:tiny-vlm"), load_processor("builtin:tiny-vlm"))


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1 (a free port, own process) for the session, with fake
    credentials and ``AWS_ENDPOINT_URL`` pointing at it in ``os.environ`` (nothing reaches AWS)."""
    from tests.s3server import S3TestServer

    with S3TestServer() as server:
        yield server


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh, empty bucket on the session's S3 server."""
    return s3_server.new_bucket()
