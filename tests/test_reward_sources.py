"""Reward models and reward servers, each tested against something built here."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from grpo.config import build_config
from grpo.reward_sources import RewardModel, RewardServer
from grpo.rewards import RewardError


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
    """A reward server on 127.0.0.1: `plan` lists what each request gets (a status or 'ok'); a
    request over `limit` bytes gets 413."""

    def __init__(self, plan=None, delay=0.0, body=None, limit=None):
        self.requests, self.plan, self.delay, self.body = [], list(plan or []), delay, body
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                size = int(self.headers["Content-Length"])
                payload = json.loads(self.rfile.read(size))
                outer.requests.append(payload)
                status = outer.plan.pop(0) if outer.plan else "ok"
                time.sleep(outer.delay)
                if limit is not None and size > limit:      # 413 Payload Too Large, with a body
                    text = b"request entity too large (limit %d bytes)" % limit
                    self.send_response(413)
                    self.send_header("Content-Length", str(len(text)))
                    self.end_headers()
                    self.wfile.write(text)
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
    with pytest.raises(RewardError, match=r"reward server .*/score failed after 1 attempt\(s\): HTTP 400"):
        RewardServer(server.url, retries=3, backoff=0.01)(["p"], ["ab"])
    assert len(server.requests) == 1


@pytest.mark.parametrize("server", [{"delay": 1.0}], indirect=True)
def test_a_slow_server_times_out(server):
    with pytest.raises(RewardError, match=r"failed after 2 attempt\(s\): .*timed out"):
        RewardServer(server.url, timeout=0.2, retries=1, backoff=0.01)(["p"], ["ab"])


@pytest.mark.parametrize("server", [{"body": b"<html>oops</html>"}], indirect=True)
def test_an_answer_that_is_not_json(server):
    with pytest.raises(RewardError, match="answered with something that is not JSON"):
        RewardServer(server.url)(["p"], ["ab"])


def test_nobody_listening():
    s = Server()
    url = s.url
    s.close()
    with pytest.raises(RewardError, match=r"failed after 2 attempt\(s\)"):
        RewardServer(url, retries=1, backoff=0.01)(["p"], ["ab"])


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
    from grpo.reward_sources import RewardRefused
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
