"""Rewards that come from outside the process's own Python: a reward model, a reward server.

Both follow the reward contract, `fn(prompts, completions, **columns) -> list[float | None]`, so the
loop treats them like any other reward function. In a config: `rewards=[model:DIR]` for a
sequence-classification model directory, `rewards=[http://host:port/path]` for a server.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.parse

import torch

from grpo.rewards.contract import RewardError, Unscored
from grpo.run.http import post


class RewardModel:
    """A Hugging Face sequence-classification model with one output: its logit is the reward.

    The text scored is the prompt followed by the completion, batched `batch_size` at a time, on
    `device` (the policy's, or its own).
    """

    def __init__(self, path: str, device: str = "cpu", batch_size: int = 16):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "right"
        self.model = AutoModelForSequenceClassification.from_pretrained(path).to(device).eval()
        if self.model.config.num_labels != 1:
            raise ValueError(f"reward model {path}: expected 1 output label, found "
                             f"{self.model.config.num_labels}")
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.device, self.batch_size = device, batch_size
        self.__name__ = "reward_model"

    @torch.no_grad()
    def __call__(self, prompts: list[str], completions: list[str], **columns) -> list[float]:
        scores: list[float] = []
        for i in range(0, len(completions), self.batch_size):
            texts = [p + c for p, c in zip(prompts[i:i + self.batch_size],
                                           completions[i:i + self.batch_size])]
            enc = self.tokenizer(texts, return_tensors="pt", padding=True,
                                 add_special_tokens=False).to(self.device)
            scores += self.model(**enc).logits[:, 0].float().cpu().tolist()
        return scores


class RewardServer:
    """POSTs {"prompts", "completions", "columns"} as JSON to `url`; reads back {"rewards": [...]}
    (or a bare list), one value per completion.

    Each call has one deadline, `timeout_s` seconds from its start (`reward_server_timeout_s`):
    connecting, sending, every read of the answer and every retry fall within it, so a server that
    answers nothing, or trickles its answer a byte at a time, ends the call at the deadline. Within
    it, a refused, reset or closed connection and a 5xx answer are tried again, at most `retries`
    times, after pauses of `backoff`, 2 `backoff`, ... seconds. A failure raises `ServerFailed`
    naming the server and what it did, with a cause (`timeout`, `http_500`, `not_json`, ...) that
    reward_on_error=skip counts while the batch's samples become unscorable.

    A 413 (Payload Too Large) is answered by sending the batch again in two halves, down to one
    completion; a completion the server refuses alone raises `RewardRefused`, which
    `reward_on_error=skip` turns into that one sample being unscorable."""

    def __init__(self, url: str, timeout_s: float = 60.0, retries: int = 2, backoff: float = 0.5):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RewardError(f"reward server {url!r}: not an http(s)://host[:port]/path address")
        self.url, self.timeout_s, self.retries, self.backoff = url, timeout_s, retries, backoff
        self._parts = parts
        self.__name__ = "reward_server"

    def __call__(self, prompts: list[str], completions: list[str], **columns) -> list:
        return self._score(prompts, completions, columns, time.monotonic() + self.timeout_s)

    def _score(self, prompts: list[str], completions: list[str], columns: dict,
               deadline: float) -> list:
        try:
            return self._post(prompts, completions, columns, deadline)
        except _TooLarge as e:
            if len(completions) == 1:
                raise RewardRefused(f"reward server {self.url} refused a completion "
                                    f"({e.size:,} bytes of JSON) with {e}", "http_413",
                                    [None]) from None
        half, values, refused, unscored = len(completions) // 2, [], None, 0
        for part in (slice(0, half), slice(half, None)):
            try:
                values += self._score(prompts[part], completions[part],
                                      {k: v[part] for k, v in columns.items()}, deadline)
            except RewardRefused as e:
                values += e.partial
                refused, unscored = refused or e, unscored + e.unscored
        if refused is not None:
            raise RewardRefused(str(refused), "http_413", values, unscored)
        return values

    def _post(self, prompts: list[str], completions: list[str], columns: dict,
              deadline: float) -> list:
        body = json.dumps({"prompts": prompts, "completions": completions,
                           "columns": columns}, default=str).encode()
        attempts, what = 0, ""
        while True:
            attempts += 1
            try:
                status, reason, raw = self._exchange(body, deadline)
            except TimeoutError:
                before = f"; before it, the server {what}" if what else ""
                raise self._failed(f"did not answer within its deadline of {self.timeout_s:g} s "
                                   "(reward_server_timeout_s: one deadline for the call, its "
                                   f"reads and its retries){before}", "timeout", attempts,
                                   "raise reward_server_timeout_s if the server is only slow, or "
                                   "set reward_on_error=skip") from None
            except (OSError, http.client.HTTPException) as e:
                cause, what = _connection_failure(e)
            else:
                if status == 413:
                    raise _TooLarge(f"HTTP 413 {reason}{_start(raw)}", len(body))
                if status < 300:
                    return self._rewards(status, raw, len(completions))
                cause, what = f"http_{status}", f"answered HTTP {status} {reason}{_start(raw)}"
                if status < 500:   # the server refused this request; asking again will not help
                    raise self._failed(what, cause, attempts)
            pause = self.backoff * attempts
            if attempts > self.retries:
                raise self._failed(what, cause, attempts)
            if time.monotonic() + pause >= deadline:
                raise self._failed(f"{what} (after {attempts} attempts, with no time left for "
                                   f"another within the deadline of {self.timeout_s:g} s, "
                                   "reward_server_timeout_s)", cause, 1)
            time.sleep(pause)

    def _exchange(self, body: bytes, deadline: float) -> tuple[int, str, bytes]:
        """One request (`post`)."""
        return post(self.url, body, deadline)

    def _rewards(self, status: int, raw: bytes, n: int) -> list:
        """The rewards of a 2xx answer, or ServerFailed saying what the answer was instead. An
        answer that is not rewards is not asked for again: the server would give it again."""
        expected = 'expected {"rewards": [one number per completion]}'
        try:
            answer = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            got = f"something that is not JSON{_start(raw)}" if raw.strip() else "an empty body"
            raise self._failed(f"answered HTTP {status} with {got}", "not_json", 1) from None
        rewards = answer.get("rewards") if isinstance(answer, dict) else answer
        if not isinstance(rewards, list):
            got = (f"a JSON object without a 'rewards' list{_start(raw)}" if isinstance(answer, dict)
                   else _start(raw)[2:])
            raise self._failed(f"answered HTTP {status} with {got}; {expected}", "no_rewards", 1)
        if len(rewards) != n:
            raise self._failed(f"answered HTTP {status} with {len(rewards)} rewards for {n} "
                               f"completions{_start(raw)}; {expected}", "wrong_length", 1)
        return rewards

    def _failed(self, what: str, cause: str, attempts: int, advice: str = "") -> "ServerFailed":
        tries = f" (after {attempts} attempts)" if attempts > 1 else ""
        advice = advice or "fix the server, or set reward_on_error=skip to count such samples as unscorable"
        return ServerFailed(f"reward server {self.url} {what}{tries}; {advice}", cause)


class ServerFailed(Unscored):
    """A reward server did not score a batch; `cause` says how (`timeout`, `http_503`, ...)."""


class RewardRefused(Unscored):
    """The source refused some samples for what they are (too large, say). `partial` holds the
    batch's rewards with None for those: reward_on_error=skip keeps it, so only the refused samples
    are unscorable."""


class _TooLarge(Exception):
    def __init__(self, message: str, size: int):
        super().__init__(message)
        self.size = size


def _connection_failure(e: Exception) -> tuple[str, str]:
    """(cause, what the server did) for a failed exchange."""
    if isinstance(e, ConnectionRefusedError):
        return "refused", "refused the connection (is it running?)"
    if isinstance(e, (ConnectionResetError, BrokenPipeError)):
        return "reset", "reset the connection"
    if isinstance(e, (http.client.RemoteDisconnected, http.client.IncompleteRead)):
        return "closed", "closed the connection before its answer was complete"
    if isinstance(e, http.client.HTTPException):
        return "not_http", f"answered with something that is not HTTP ({type(e).__name__})"
    if isinstance(e, socket.gaierror):
        return "unknown_host", f"could not be found ({e.strerror or e})"
    return "connection", f"could not be reached ({type(e).__name__}: {e})"


def _start(raw: bytes, limit: int = 200) -> str:
    """': <the first `limit` characters of a body, on one line>', or '' when it is empty."""
    text = " ".join(raw[:limit * 4].decode("utf-8", "replace").split())
    return f": {text[:limit]}{'...' if len(text) > limit else ''}" if text else ""
