"""Several engines as one (`Engines`, vllm_url=[...]): requests shared out, a failed engine left
out with its requests sent to another, weights loaded once into each, process 0 alone sending;
and the deadline of every call to a vLLM server, against a real HTTP server on loopback.

The engines here are small in-process objects that draw from each request's seed: they test how
`Engines` shares, retries and loads, not vLLM (tests/test_vllm.py runs the same on real servers).
"""

import http.server
import json
import threading
import time

import pytest

from grpo.sampling.engine import EngineError, Generated, Request
from grpo.sampling.engines import Engines


class SeededEngine:
    """Draws token (seed * 7 + version) % 50 for each request; fails when told to."""
    lora_rank, max_model_len = 0, 512

    def __init__(self, name: str, fail_generate: bool = False, fail_load: bool = False):
        self.name, self.fail_generate, self.fail_load = name, fail_generate, fail_load
        self.version, self.served, self.loads = -1, [], []

    def generate(self, requests):
        if self.fail_generate:
            raise EngineError(f"{self.name} is gone")
        self.served += [r.seed for r in requests]
        return [Generated(((r.seed * 7 + self.version) % 50,), (-1.0,), False) for r in requests]

    def load_weights(self, weights, version):
        if self.fail_load:
            raise EngineError(f"{self.name} took half of version {version}")
        self.loads.append(version)
        self.version = version

    def close(self):
        pass


def requests(n):
    return [Request(prompt_ids=(1, 2), max_tokens=4, seed=s, temperature=1.0) for s in range(n)]


def test_requests_are_shared_out_and_a_failed_engines_go_to_another_with_the_same_draws():
    alone = SeededEngine("a")
    want = alone.generate(requests(9))
    lines = []
    a, b, c = SeededEngine("a"), SeededEngine("b", fail_generate=True), SeededEngine("c")
    engines = Engines([a, b, c], log=lines.append)
    assert engines.generate(requests(9)) == want            # in request order, whoever drew them
    assert lines == ["b failed sampling 3 completions and is left out (2 of 3 left): b is gone"]
    assert sorted(a.served + c.served) == list(range(9)) and b.served == []
    a.served, c.served = [], []
    assert engines.generate(requests(9)) == want            # b is not asked again
    assert a.served == list(range(4)) and c.served == list(range(4, 9))
    a.fail_generate = c.fail_generate = True
    with pytest.raises(EngineError, match=r"^every engine has failed \(a, b, c\)"):
        engines.generate(requests(4))


def test_weights_go_to_every_engine_once_and_one_that_fails_to_load_is_never_asked_again():
    lines, met = [], []
    a, b = SeededEngine("a"), SeededEngine("b", fail_load=True)
    engines = Engines([a, b], log=lines.append, meet=lambda up: met.append("meet") or [up])
    engines.load_weights([], 3)
    assert a.loads == [3] and engines.version == 3 and met == ["meet", "meet"]
    assert lines == ["b failed loading weights (version 3) and is left out (1 of 2 left): b took half of version 3"]
    assert [g.token_ids for g in engines.generate(requests(2))] == [(3,), (10,)]   # a alone, version 3
    b.fail_load = False
    engines.load_weights([], 4)
    assert b.loads == []                                    # half a version earlier: never again
    # a process other than 0 sends nothing, and waits as often as process 0 does
    quiet = SeededEngine("q")
    other = Engines([quiet], sends=False, meet=lambda up: met.append("other") or [up])
    other.load_weights([], 5)
    assert quiet.loads == [] and other.version == 5 and met.count("other") == 2


def test_an_engine_one_process_left_out_is_left_out_by_every_process_from_that_version():
    """Two trainer processes (two threads here, meeting as all_gather_object does): process 0's
    load of b fails; process 1, which sends nothing, leaves b out at the same version and samples
    on a alone."""
    import threading
    board, gate = [None, None], threading.Barrier(2, timeout=10)

    def meet_as(rank):
        def meet(up):
            board[rank] = up
            gate.wait()
            everyones = list(board)
            gate.wait()
            return everyones
        return meet
    a0, b0 = SeededEngine("a"), SeededEngine("b", fail_load=True)
    a1, b1 = SeededEngine("a"), SeededEngine("b")
    said = []
    first = Engines([a0, b0], meet=meet_as(0), log=lambda line: None)
    second = Engines([a1, b1], sends=False, meet=meet_as(1), log=said.append)
    sending = threading.Thread(target=first.load_weights, args=([], 3))
    sending.start()
    second.load_weights([], 3)
    sending.join()
    assert said == ["b failed loading weights (version 3) and is left out (1 of 2 left): "
                    "another trainer process left it out"]
    assert first.up == [a0] and second.up == [a1]
    second.generate(requests(4))
    assert b1.served == [] and a1.served == [0, 1, 2, 3]


def test_one_engine_that_fails_to_load_stops_the_run_with_its_error():
    with pytest.raises(EngineError, match="took half of version 1"):
        Engines([SeededEngine("a", fail_load=True)]).load_weights([], 1)


class _Trickle(http.server.BaseHTTPRequestHandler):
    """/v1/models as vLLM answers it; /v1/completions one byte every half second, never done."""

    def do_GET(self):
        body = json.dumps({"data": [{"id": "tiny", "max_model_len": 64}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "100000")
        self.end_headers()
        try:
            for _ in range(200):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.5)
        except OSError:
            pass

    def log_message(self, *args):
        pass


def test_a_vllm_server_that_trickles_its_answer_is_stopped_at_the_calls_deadline():
    """The deadline covers the whole call: a socket timeout alone restarts at every byte, and
    this server sends one every half second for 100 s."""
    from grpo.sampling.vllm_server import VLLMServerEngine
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        engine = VLLMServerEngine(url, timeout_s=1.5)
        assert engine.max_model_len == 64
        started = time.monotonic()
        with pytest.raises(EngineError, match=rf"^the vLLM server at {url} did not answer a completion "
                                              r"request \(2 prompt tokens\) within 1.5 s"):
            engine.generate(requests(1))
        assert time.monotonic() - started < 3.0
        engine.close()
    finally:
        server.shutdown()


def test_a_process_that_does_not_send_the_shared_servers_keeps_no_versions():
    """Async with servers under torchrun: process 0 sends every version to the servers all
    processes share, so the other processes' engine clients keep no copy of any version (each
    would be a whole model, k + 1 of them); a client that loads its own engine keeps them."""
    import torch

    from grpo.pipeline.groups import clone_parameters, keeps_versions
    from grpo.sampling.engine import EngineSampler
    model = torch.nn.Linear(2, 2)

    def client(sends: bool):
        sampler = EngineSampler(Engines([SeededEngine("a")], sends=sends), None, max_new_tokens=4)
        return (model, sampler, True)
    assert keeps_versions(client(sends=True)) and not keeps_versions(client(sends=False))
    assert keeps_versions(None)                       # forked workers: each loads its own copy
    copies = clone_parameters(model)                  # on a CPU: plain copies where they are
    assert [c.data_ptr() for c in copies] != [p.data_ptr() for p in model.parameters()]
    assert all(torch.equal(c, p) for c, p in zip(copies, model.parameters()))


def test_weights_for_a_server_are_one_whole_file_cast_where_they_are_with_tied_weights_copied(tmp_path):
    """write_weights: every tensor in the file, cast to the server's dtype (bfloat16 values equal
    to the float32 ones rounded), a tied pair under both names, no partial file left; with no
    room, one EngineError naming the directory given and the MiB needed."""
    import torch
    from safetensors.torch import load_file
    from grpo.sampling.vllm_server import write_weights
    torch.manual_seed(0)
    embed = torch.randn(10, 4)
    weights = [("embed.weight", embed), ("head.weight", embed), ("norm.weight", torch.randn(4)),
               ("steps", torch.tensor([3]))]
    path = write_weights(weights, str(tmp_path), torch.bfloat16, "version 0's weights")
    got = load_file(path)
    assert sorted(got) == ["embed.weight", "head.weight", "norm.weight", "steps"]
    assert got["head.weight"].dtype == torch.bfloat16 and got["steps"].dtype == torch.int64
    assert torch.equal(got["head.weight"], embed.to(torch.bfloat16))
    assert torch.equal(got["embed.weight"], got["head.weight"]) and got["steps"].item() == 3
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]
    # float32 and no cast: the tied pair shares storage, so the second name gets a copy
    same = load_file(write_weights(weights, str(tmp_path), None, "version 1's weights"))
    assert torch.equal(same["head.weight"], embed) and torch.equal(same["embed.weight"], embed)
    import shutil
    from unittest import mock
    with mock.patch.object(shutil, "disk_usage", return_value=shutil._ntuple_diskusage(1, 1, 2**20)):
        with pytest.raises(EngineError, match=r"^vllm_weights_dir: version 2's weights need 1 MiB "
                                              r"in /where/given, which has 1 MiB free"):
            write_weights(weights, str(tmp_path), None, "version 2's weights", "/where/given")


def test_a_server_elsewhere_without_a_shared_weights_dir_is_named():
    """A server reads each weight version by path: one on another machine needs vllm_weights_dir
    on a shared file system (tests/test_nodes.py runs it on two machines). 192.0.2.7 is a
    documentation address, no machine's here."""
    from grpo.run.distributed import on_this_machine
    from grpo.sampling.vllm_server import unshared_weights
    assert on_this_machine("127.0.0.1") and on_this_machine("localhost") and on_this_machine(None)
    assert not on_this_machine("192.0.2.7")
    assert unshared_weights(["http://127.0.0.1:8000", "http://localhost:8001"], "") is None
    assert unshared_weights(["http://192.0.2.7:8000"], "/shared/weights") is None
    assert unshared_weights(["http://127.0.0.1:8000", "http://192.0.2.7:8000"], "").startswith(
        "config key 'vllm_weights_dir': the vLLM server at http://192.0.2.7:8000 runs on another machine")
