"""Reward models and reward servers, each tested against something built here."""

import json
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from grpo.config import ConfigError, build_config
from grpo.rewards.sources import RewardModel, RewardServer
from grpo.rewards import RewardError, faults, score


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForSequenceClassification
    from grpo.models import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         num_labels=1, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("rm")
    LlamaForSequenceClassification(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_reward_model_scores_each_text_as_alone(reward_model_dir):
    # Batched with padding, each score must equal the model's logit on that text by itself
    # (no padding): the pooled position is the last real token.
    rm = RewardModel(str(reward_model_dir), batch_size=2)
    prompts, completions = ["2+2=", "largest of 1 2:", "x"], ["4", "2", "a much longer answer"]
    batched = rm(prompts, completions)
    alone = []
    for p, c in zip(prompts, completions):
        enc = rm.tokenizer([p + c], return_tensors="pt", add_special_tokens=False)
        alone.append(rm.model(**enc).logits[0, 0].item())
    assert batched == pytest.approx(alone, abs=1e-5)
    assert len(set(round(x, 6) for x in batched)) == 3  # three different texts, three scores


def test_reward_model_needs_one_label(tmp_path, reward_model_dir):
    from transformers import AutoConfig, AutoModelForSequenceClassification
    config = AutoConfig.from_pretrained(reward_model_dir)
    config.num_labels = 2
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path)
    RewardModel(str(reward_model_dir)).tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="expected 1 output label, found 2"):
        RewardModel(str(tmp_path))


class Server:
    """A reward server on 127.0.0.1: `plan` lists what each request gets (a status, 'ok', or a
    misbehaviour of MISBEHAVIOURS by name); a request over `limit` bytes gets 413."""

    def __init__(self, plan=None, delay=0.0, body=None, limit=None):
        self.requests, self.plan, self.delay, self.body = [], list(plan or []), delay, body
        self.paths = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                size = int(self.headers["Content-Length"])
                payload = json.loads(self.rfile.read(size))
                outer.requests.append(payload)
                outer.paths.append(self.path)
                status = outer.plan.pop(0) if outer.plan else "ok"
                time.sleep(outer.delay)
                if limit is not None and size > limit:      # 413 Payload Too Large, with a body
                    text = b"request entity too large (limit %d bytes)" % limit
                    self.send_response(413)
                    self.send_header("Content-Length", str(len(text)))
                    self.end_headers()
                    self.wfile.write(text)
                    return
                if status in MISBEHAVIOURS:
                    MISBEHAVIOURS[status](self, payload)
                    return
                if status != "ok":
                    self.send_response(status)
                    self.end_headers()
                    return
                data = outer.body if outer.body is not None else json.dumps(
                    {"rewards": [float(len(c)) for c in payload["completions"]]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/score"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _answer(handler, status: int, data: bytes) -> None:
    handler.send_response(status)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def _trickle(handler, payload, every=0.5, limit_s=30.0):
    """An answer that never ends: one byte every `every` seconds, each well within any read
    timeout (a status line, then a header line that goes on and on)."""
    text = b"HTTP/1.1 200 OK\r\nX-Wait: " + b"." * int(limit_s / every)
    try:
        for i in range(len(text)):
            handler.wfile.write(text[i:i + 1])
            time.sleep(every)
    except OSError:         # the caller gave up and closed the connection
        pass


def _silent(handler, payload, limit_s=30.0):
    """The request is read, and nothing ever comes back (until the caller hangs up)."""
    handler.connection.settimeout(limit_s)
    try:
        handler.connection.recv(1)
    except OSError:
        pass


def _reset(handler, payload):
    """The connection is reset (RST) instead of answered."""
    handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    handler.connection.close()
    handler.close_connection = True


MISBEHAVIOURS = {
    "trickle": _trickle,
    "silent": _silent,
    "reset": _reset,
    "http_500": lambda h, p: _answer(h, 500, b"Traceback (most recent call last):\n  model not "
                                             b"loaded\nRuntimeError: CUDA out of memory"),
    "html": lambda h, p: _answer(h, 200, b"<html>\n<body>oops</body>\n</html>"),
    "null": lambda h, p: _answer(h, 200, b"null"),
    "no_list": lambda h, p: _answer(h, 200, json.dumps({"scores": [1.0] * len(p["completions"])}).encode()),
    "short": lambda h, p: _answer(h, 200, json.dumps({"rewards": [1.0]}).encode()),
}


@pytest.fixture
def server(request):
    s = Server(**getattr(request, "param", {}))
    yield s
    s.close()


def test_server_scores_and_sees_the_columns(server):
    out = RewardServer(server.url)(["p1", "p2"], ["abc", "z"], answer=["3", "1"])
    assert out == [3.0, 1.0]
    assert server.requests == [{"prompts": ["p1", "p2"], "completions": ["abc", "z"],
                                "columns": {"answer": ["3", "1"]}}]


@pytest.mark.parametrize("server", [{"plan": [503, 502]}], indirect=True)
def test_server_errors_are_retried(server):
    assert RewardServer(server.url, retries=2, backoff=0.01)(["p"], ["ab"]) == [2.0]
    assert len(server.requests) == 3


@pytest.mark.parametrize("server", [{"plan": [400]}], indirect=True)
def test_a_refused_request_is_not_retried(server):
    with pytest.raises(RewardError, match=r"reward server .*/score answered HTTP 400 Bad Request; "):
        RewardServer(server.url, retries=3, backoff=0.01)(["p"], ["ab"])
    assert len(server.requests) == 1


@pytest.mark.parametrize("server", [{"delay": 1.0}], indirect=True)
def test_a_slow_server_times_out(server):
    with pytest.raises(RewardError, match=r"did not answer within its deadline of 0.2 s"):
        RewardServer(server.url, timeout_s=0.2, retries=1, backoff=0.01)(["p"], ["ab"])


@pytest.mark.parametrize("server", [{"body": b"<html>oops</html>"}], indirect=True)
def test_an_answer_that_is_not_json(server):
    with pytest.raises(RewardError, match="answered HTTP 200 with something that is not JSON: "
                                          "<html>oops</html>"):
        RewardServer(server.url)(["p"], ["ab"])


def test_nobody_listening():
    s = Server()
    url = s.url
    s.close()
    with pytest.raises(RewardError, match=r"refused the connection \(is it running\?\) \(after 2 attempts\)"):
        RewardServer(url, retries=1, backoff=0.01)(["p"], ["ab"])


def test_the_environments_proxy_is_used_as_urllib_uses_it(server, monkeypatch):
    # The server stands in for a proxy: it is asked for the whole address.
    monkeypatch.setenv("http_proxy", server.url.removesuffix("/score"))
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert RewardServer("http://scorer.invalid:8000/score?v=2")(["p"], ["abc"]) == [3.0]
    assert server.paths == ["http://scorer.invalid:8000/score?v=2"]
    monkeypatch.setenv("no_proxy", "scorer.invalid")
    with pytest.raises(RewardError, match="scorer.invalid:8000/score.* could not be found"):
        RewardServer("http://scorer.invalid:8000/score", retries=0)(["p"], ["abc"])


@pytest.mark.parametrize("misbehaviour", ["trickle", "silent"])
def test_a_server_that_trickles_or_says_nothing_stops_at_one_deadline_for_the_whole_call(misbehaviour):
    # One byte every 0.5 s used to keep a call waiting for ever: urllib's timeout was per read, and
    # each byte came well within it. Now connecting, every read and every retry share one deadline.
    s = Server(plan=[misbehaviour] * 3)
    try:
        started = time.monotonic()
        with pytest.raises(RewardError) as raised:
            RewardServer(s.url, timeout_s=2.0, retries=2, backoff=0.01)(["p", "q"], ["ab", "c"])
        took = time.monotonic() - started
        assert 2.0 <= took < 2.6, took      # the deadline, and the last 0.5 s read at most after it
        message = str(raised.value)
        assert "\n" not in message and s.url in message and "deadline of 2 s" in message, message
        assert "reward_server_timeout_s" in message
        assert len(s.requests) == 1        # the deadline is the call's: no time is left to retry

        started = time.monotonic()
        with faults.counting() as counts:
            totals, per_fn = score([RewardServer(s.url, timeout_s=1.0)], [1.0], ["p", "q"], ["ab", "c"],
                                   {}, on_error="skip")
        assert time.monotonic() - started < 1.6
        assert totals == [None, None] and per_fn == {"reward_server": [None, None]}
        assert counts.metrics() == {"reward/reward_server/error/timeout": 2}
    finally:
        s.close()


@pytest.mark.parametrize("misbehaviour, cause, requests, says", [
    ("http_500", "http_500", 3, r"answered HTTP 500 Internal Server Error: Traceback \(most recent "
                                r"call last\): model not loaded RuntimeError: CUDA out of memory "
                                r"\(after 3 attempts\)"),
    ("reset", "reset", 3, r"reset the connection \(after 3 attempts\)"),
    ("html", "not_json", 1, r"answered HTTP 200 with something that is not JSON: <html> "
                            r"<body>oops</body> </html>;"),
    ("null", "no_rewards", 1, r"answered HTTP 200 with null; expected \{\"rewards\": \[one number "
                              r"per completion\]\};"),
    ("no_list", "no_rewards", 1, r"answered HTTP 200 with a JSON object without a 'rewards' list: "
                                 r"\{\"scores\": \[1.0, 1.0\]\}; expected"),
    ("short", "wrong_length", 1, r"answered HTTP 200 with 1 rewards for 2 completions: "
                                 r"\{\"rewards\": \[1.0\]\}; expected"),
])
def test_each_misbehaviour_of_a_server_is_one_line_or_with_skip_unscorable_and_counted(
        misbehaviour, cause, requests, says):
    # Each of these used to stop the run even with reward_on_error=skip; null was sent three times
    # and stopped it with an empty reason.
    s = Server(plan=[misbehaviour] * 6)
    try:
        server = RewardServer(s.url, retries=2, backoff=0.01)
        with pytest.raises(RewardError) as raised:
            score([server], [1.0], ["p", "q"], ["ab", "c"], {}, on_error="raise")
        message = str(raised.value)
        assert message.startswith(f"reward server {s.url} ") and "\n" not in message, message
        assert re.search(says, message), message
        assert message.endswith("fix the server, or set reward_on_error=skip to count such samples "
                                "as unscorable")
        assert len(s.requests) == requests

        with faults.counting() as counts:
            totals, per_fn = score([server, lambda p, c, **k: [1.0] * len(c)], [1.0, 1.0], ["p", "q"],
                                   ["ab", "c"], {}, on_error="skip")
        assert totals == [None, None] and per_fn["reward_server"] == [None, None]
        assert counts.metrics() == {f"reward/reward_server/error/{cause}": 2}
        assert len(s.requests) == 2 * requests
    finally:
        s.close()


def test_a_server_failing_with_skip_trains_on_with_the_samples_unscorable_and_counted(tmp_path):
    from grpo.train import train
    s = Server(plan=["http_500"] * 30)
    try:
        c = build_config({"rewards": [s.url], "reward_on_error": "skip", "steps": 1, "sft_steps": 0,
                          "eval_every": 0, "prompts_per_step": 2, "group_size": 2,
                          "output_dir": str(tmp_path)})
        m = train(c, log=lambda line: None, write_files=False).history[0]
        assert m["reward/unscorable"] == 4 and m["reward/reward_server/error/http_500"] == 4
    finally:
        s.close()


def test_the_deadline_is_a_config_key_and_the_command_says_it_in_one_line(tmp_path):
    s = Server(plan=["trickle"] * 3)
    try:
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "grpo", "train", f"rewards=[{s.url}]",
                               "reward_server_timeout_s=1.5", "steps=1", "sft_steps=0", "eval_every=0",
                               "prompts_per_step=2", "group_size=2", "threads=1",
                               f"output_dir={tmp_path / 'run'}"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr[-2000:]
        assert done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(f"grpo train: error: reward server {s.url} did not answer "
                                      "within its deadline of 1.5 s"), done.stderr
        assert time.monotonic() - started < 60
    finally:
        s.close()
    with pytest.raises(ConfigError, match="reward_server_timeout_s"):
        build_config({"reward_server_timeout_s": 0})


def test_server_and_model_from_config(server, reward_model_dir, tmp_path):
    from grpo.train import train
    c = build_config({"rewards": [server.url, f"model:{reward_model_dir}"], "steps": 1,
                      "sft_steps": 0, "eval_every": 0, "prompts_per_step": 2, "group_size": 2,
                      "output_dir": str(tmp_path)})
    m = train(c, log=lambda s: None, write_files=False).history[0]
    assert "reward/reward_server/mean" in m and "reward/reward_model/mean" in m
    assert len(server.requests) == 1 and len(server.requests[0]["completions"]) == 4


def test_a_413_sends_the_batch_in_halves_and_skip_leaves_out_only_the_refused_completion():
    # A 413 used to stop the run even with reward_on_error=skip. Each completion alone fits under
    # the limit but the four together do not; one completion is too large even alone.
    from grpo.rewards.sources import RewardRefused
    from grpo.rewards import score
    s = Server(limit=400)
    try:
        completions = ["a" * 150, "b" * 20, "c" * 150, "d" * 30]
        assert RewardServer(s.url, retries=0)(["p"] * 4, completions) == [150.0, 20.0, 150.0, 30.0]
        assert [len(r["completions"]) for r in s.requests] == [4, 2, 2]    # refused, then halves
        completions[2] = "x" * 1000
        with pytest.raises(RewardRefused, match=r"refused a completion \(1,0\d\d bytes of JSON\) with "
                                                r"HTTP 413 .*: request entity too large \(limit 400"):
            RewardServer(s.url, retries=0)(["p"] * 4, completions)
        totals, _ = score([RewardServer(s.url, retries=0)], [1.0], ["p"] * 4, completions, {},
                          on_error="skip")
        assert totals == [150.0, 20.0, None, 30.0]
        with pytest.raises(RewardError, match="refused a completion"):
            score([RewardServer(s.url, retries=0)], [1.0], ["p"] * 4, completions, {}, on_error="raise")
    finally:
        s.close()
