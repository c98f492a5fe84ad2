"""Start vLLM OpenAI-compatible servers (its CPU build, from its own virtualenv) on 127.0.0.1, for
the ``openai`` engine's tests, benchmarks and a pool of rollout replicas:
``with vllm_server(model_dir) as url: ...``, ``with vllm_servers(model_dir, 2) as servers: ...``, or
from a shell (prints the URLs for ``explorer.base_url``; Ctrl-C stops them all)::

    python -m rftflow.infra.vllm_server builtin:tiny --replicas 2 --threads 1 --served-model tiny

The virtualenv is ``$RFTFLOW_VLLM_VENV`` or ``.venv-vllm`` (built by ``infra/vllm_cpu_env.sh``).
Servers run with ``VLLM_SERVER_DEV_MODE=1`` so the engine can reload weights in place. Each server
is a process group of its own (the API server and its engine process), stopped as a group.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

VLLM_VENV = Path(os.environ.get("RFTFLOW_VLLM_VENV", Path(__file__).resolve().parents[1] / ".venv-vllm"))


def vllm_available() -> bool:
    """Whether the CPU virtualenv ``VLLM_VENV`` imports vllm (see ``vllm_problem``)."""
    return vllm_problem() is None


@functools.cache
def vllm_problem() -> str | None:
    """Why the CPU virtualenv cannot run vLLM, in one line (None: ``import vllm`` works in its python).
    Checked once per process, and once per state of its site-packages: a stamp in the virtualenv
    records the folder's and vllm's modification times of the last import that worked."""
    python = VLLM_VENV / "bin" / "python"
    if not python.exists():
        return f"no vLLM CPU virtualenv at {VLLM_VENV} (infra/vllm_cpu_env.sh builds it)"
    marks = [p for site in sorted((VLLM_VENV / "lib").glob("python3*/site-packages")) for p in (site, site / "vllm")]
    state = "".join(f"{p} {p.stat().st_mtime_ns}\n" for p in marks if p.exists())
    stamp = VLLM_VENV / ".rftflow-import-ok"
    if state and stamp.is_file() and stamp.read_text() == state:
        return None
    with tempfile.TemporaryDirectory() as tmp:  # importing vllm makes torch's compile cache folder in TMPDIR
        try:
            done = subprocess.run([str(python), "-c", "import vllm"], env={**os.environ, "TMPDIR": tmp},
                                  capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"the vLLM CPU virtualenv at {VLLM_VENV} does not run python: {e}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return f"the vLLM CPU virtualenv at {VLLM_VENV} does not import vllm ({last}): rebuild it with " \
               "infra/vllm_cpu_env.sh"
    try:
        stamp.write_text(state)
    except OSError:  # a read-only virtualenv: checked again next time
        pass
    return None


def in_process_python(env: dict) -> tuple[list[str], dict]:
    """The interpreter (a command to put a script and its arguments after) and environment for a
    process that runs vLLM inside it (the ``vllm`` engine, TRL's colocated vLLM): this one where vLLM
    is installed (a GPU machine), else the CPU virtualenv's python with this environment's packages
    (rftflow's dependencies) after its own, so vLLM runs with the versions it was installed with.
    The engine runs in that process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no engine process beside it)."""
    import importlib.util
    import sysconfig

    env = {**env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "WARNING", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1"}
    if importlib.util.find_spec("vllm") is not None:
        return [sys.executable], env
    if not vllm_available():
        raise RuntimeError(f"vLLM is not installed here (pip install vllm, on a GPU machine) and {vllm_problem()}")
    # this environment's site-packages after the virtualenv's own, its .pth files run (rftflow's editable
    # install among them, which maps rftflow.components to the checkout's components/, ...)
    after = ("import runpy, site, sys; site.addsitedir(sys.argv.pop(1)); sys.argv.pop(0); "
             "runpy.run_path(sys.argv[0], run_name='__main__')")
    return ([str(VLLM_VENV / "bin" / "python"), "-c", after, sysconfig.get_paths()["purelib"]],
            {**env, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"})


@dataclass
class Server:
    """A started server: its URL and process (the leader of its own process group)."""

    url: str
    port: int
    proc: subprocess.Popen

    def kill(self) -> None:
        """SIGKILL to the server's whole group (API server and engine process), as a crash would."""
        _signal_group(self.proc, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        """SIGTERM to the group, SIGKILL after 20 s. vLLM kills its engine at once; its web server then
        waits for every open connection to close, and a request the pool abandoned on a server that
        hung keeps its connection open until the client's timeout (600 s by default), with nothing
        left to answer it."""
        if self.proc.poll() is None:
            _signal_group(self.proc, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        _signal_group(self.proc, signal.SIGKILL)  # an engine process left behind by its API server


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def start_server(model_dir: str, *, served_model: str = "model", threads: int = 2, log: Path | None = None,
                 startup_seconds: float = 300.0, eager: bool = True, lora_rank: int | None = None,
                 port: int | None = None, cores: str | None = None, in_process: bool = False) -> Server:
    """``vllm serve model_dir`` on ``port`` (a free one if None), answering ``/health``. ``eager``
    (``--enforce-eager``) skips vLLM's torch.compile (the slowest part of its start-up without a
    compile cache), the model run as the trainer runs it. ``lora_rank``: LoRA adapters up to that
    rank, loaded at run time (``/v1/load_lora_adapter``). ``cores``: the CPU ids the whole server is
    bound to (e.g. ``"1"`` or ``"2-3"``), so servers side by side do not share cores; a bound server
    runs ``in_process``. ``in_process``: the model runs inside the engine process (vLLM's ``uni``
    executor, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, threads not bound by vLLM) rather than in a worker
    process of its own, whose engine process would busy-wait on it (vLLM's shared-memory queue spins
    for a second after each read) and take a core from the work beside it. Neither: vLLM's own
    placement (an engine and a worker process, threads bound by vLLM). The server
    takes a request's chat template (``--trust-request-chat-template``): the ``openai`` engine sends
    its prompts with images in one that renders them as the engine encoded them; it listens on
    127.0.0.1 only. Its log-probs are of the distribution it samples from (``--logprobs-mode
    processed_logprobs``: after the temperature and the ``logit_bias`` that keeps a vision model's
    image placeholder unsampled), as the hf engine records them."""
    import httpx

    from rftflow.infra.ports import free_port

    port = port or free_port()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": str(threads),
           "VLLM_LOGGING_LEVEL": "WARNING", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    affinity = None
    if in_process or cores is not None:
        env |= {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if cores is not None:
        first, _, last = cores.partition("-")
        cpus = set(range(int(first), int(last or first) + 1))
        affinity = lambda: os.sched_setaffinity(0, cpus)  # noqa: E731 — inherited by the server's children
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
                             "--max-model-len", "256", "--seed", "0", "--trust-request-chat-template",
                             "--logprobs-mode", "processed_logprobs",
                             *(["--enforce-eager"] if eager else []), *lora],
                             env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                             preexec_fn=affinity)
    server = Server(f"http://127.0.0.1:{port}", port, proc)
    try:
        deadline = time.time() + startup_seconds
        while True:
            if proc.poll() is not None:
                tail = log.read_text()[-2000:] if log else ""
                raise RuntimeError(f"vllm serve exited {proc.returncode}: {tail}")
            try:
                if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"vllm serve did not answer in {startup_seconds:.0f} s")
            time.sleep(1)
    except BaseException:
        server.stop()
        raise


@contextmanager
def vllm_server(model_dir: str, **options) -> Iterator[str]:
    """One server (``start_server``'s ``options``); yields its base URL; stopped on exit."""
    server = start_server(model_dir, **options)
    try:
        yield server.url
    finally:
        server.stop()


@contextmanager
def vllm_servers(model_dir: str, replicas: int, *, threads: int = 1, log_dir: Path | None = None,
                 **options) -> Iterator[list[Server]]:
    """``replicas`` servers side by side, started one after another, replica i bound to its own
    ``threads`` cores (i·threads … on this machine's CPUs, wrapping around); stopped on exit."""
    cpus = os.cpu_count() or 1
    with ExitStack() as stack:
        servers = []
        for i in range(replicas):
            first = (i * threads) % cpus
            cores = str(first) if threads == 1 else f"{first}-{min(cpus - 1, first + threads - 1)}"
            log = log_dir / f"server-{i}.log" if log_dir else None
            server = start_server(model_dir, threads=threads, cores=cores, log=log, **options)
            stack.callback(server.stop)
            servers.append(server)
        yield servers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rftflow.infra.vllm_server",
                                     description="Start N vLLM servers of one model (a rollout pool) until Ctrl-C.")
    parser.add_argument("model", help="a model directory, a GGUF file, or builtin:tiny")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per server (each on its own cores)")
    parser.add_argument("--served-model", default="model")
    parser.add_argument("--lora-rank", type=int, default=None, help="load LoRA adapters up to this rank at run time")
    args = parser.parse_args(argv)
    if not vllm_available():
        print(f"error: {vllm_problem()}", file=sys.stderr)
        return 2
    from rftflow.components.explore.models import resolve_model_path

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        with vllm_servers(resolve_model_path(args.model), args.replicas, threads=args.threads,
                          served_model=args.served_model, lora_rank=args.lora_rank) as servers:
            urls = [s.url for s in servers]
            print(f"{len(urls)} server(s) of {args.served_model!r} up; use them with\n"
                  f"  --set 'explorer.base_url=[{', '.join(urls)}]' --set explorer.served_model={args.served_model}",
                  flush=True)
            while not stop and all(s.proc.poll() is None for s in servers):
                time.sleep(1)
            dead = [s.url for s in servers if s.proc.poll() is not None]
            if dead:
                print(f"error: server(s) exited: {', '.join(dead)}", file=sys.stderr)
                return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
