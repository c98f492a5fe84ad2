"""Start a vLLM OpenAI-compatible server (its CPU build, from its own virtualenv) on 127.0.0.1,
for the ``openai`` engine's tests and benchmarks: ``with vllm_server(model_dir) as url: ...``.

The virtualenv is ``$RFTFLOW_VLLM_VENV`` or ``.venv-vllm`` (built by ``infra/vllm_cpu_env.sh``).
The server runs with ``VLLM_SERVER_DEV_MODE=1`` so the engine can reload weights in place.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

VLLM_VENV = Path(os.environ.get("RFTFLOW_VLLM_VENV", Path(__file__).resolve().parents[1] / ".venv-vllm"))


def vllm_available() -> bool:
    return (VLLM_VENV / "bin" / "vllm").exists()  # installed by infra/vllm_cpu_env.sh


@contextmanager
def vllm_server(model_dir: str, *, served_model: str = "model", threads: int = 2, log: Path | None = None,
                startup_seconds: float = 300.0, eager: bool = True, lora_rank: int | None = None) -> Iterator[str]:
    """``vllm serve model_dir`` on a free port; yields its base URL; stopped on exit. ``eager``
    (``--enforce-eager``) skips vLLM's torch.compile (the slowest part of its start-up without a
    compile cache), the model run as the trainer runs it. ``lora_rank``: LoRA adapters up to that
    rank, loaded at run time (``/v1/load_lora_adapter``)."""
    import httpx

    from rftflow.flows.servers import free_port

    port = free_port()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": str(threads),
           "VLLM_LOGGING_LEVEL": "WARNING", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    lora = []
    if lora_rank is not None:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        lora = ["--enable-lora", "--max-lora-rank", str(lora_rank), "--max-loras", "1"]
    sink = log.open("w") if log else subprocess.DEVNULL
    # the api_server module, not the `vllm` CLI: vllm-cpu's CLI asks for the distribution "vllm"
    # (importlib.metadata), which the package installed as "vllm-cpu" does not provide
    proc = subprocess.Popen([str(VLLM_VENV / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
                             "--model", model_dir, "--host", "127.0.0.1", "--port",
                             str(port), "--served-model-name", served_model, "--dtype", "float32",
                             "--max-model-len", "256", "--seed", "0", *(["--enforce-eager"] if eager else []), *lora],
                             env=env, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + startup_seconds
        while True:
            if proc.poll() is not None:
                tail = log.read_text()[-2000:] if log else ""
                raise RuntimeError(f"vllm serve exited {proc.returncode}: {tail}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"vllm serve did not answer in {startup_seconds:.0f} s")
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
