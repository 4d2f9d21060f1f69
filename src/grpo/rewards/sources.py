"""Rewards that come from outside the process's own Python: a reward model, a reward server.

Both follow the reward contract, `fn(prompts, completions, **columns) -> list[float | None]`, so the
loop treats them like any other reward function. In a config: `rewards=[model:DIR]` for a
sequence-classification model directory, `rewards=[http://host:port/path]` for a server.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import socket
import time
import urllib.parse
import urllib.request

import torch

from grpo.rewards import RewardError, Unscored


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


def post(url: str, body: bytes, deadline: float) -> tuple[int, str, bytes]:
    """POST `body` (JSON) to `url`: (status, reason, the answer's body), every step within
    `deadline` (time.monotonic(); TimeoutError past it), so a server that answers nothing or
    trickles its answer ends the call there. The environment's proxy (http_proxy, https_proxy,
    no_proxy) is used as urllib would; a name lookup keeps the system resolver's own timeouts."""
    parts = urllib.parse.urlsplit(url)
    https = parts.scheme == "https"
    kind = http.client.HTTPSConnection if https else http.client.HTTPConnection
    target, headers = parts.path or "/", {"Content-Type": "application/json"}
    if parts.query:
        target += f"?{parts.query}"
    proxy = _proxy(parts)
    if proxy is None:
        connection = kind(parts.hostname, parts.port, timeout=_left(deadline))
    else:
        connection = kind(proxy.hostname, proxy.port, timeout=_left(deadline))
        auth = _proxy_auth(proxy)
        if https:        # a tunnel through the proxy (CONNECT), then TLS with the server
            connection.set_tunnel(parts.hostname, parts.port, headers=auth)
        else:            # the proxy is asked for the whole address
            target = url
            headers.update(auth)
    connection.connect()           # the socket's timeout bounds the connect (and TLS handshake)
    sock = connection.sock
    try:
        connection.sock = _DeadlineSocket(sock, deadline)
        connection.request("POST", target, body=body, headers=headers)
        response = connection.getresponse()
        chunks = []
        while chunk := response.read(1 << 16):   # each read re-armed with the time left
            chunks.append(chunk)
        return response.status, response.reason, b"".join(chunks)
    finally:
        connection.close()
        sock.close()


def _left(deadline: float) -> float:
    """Seconds until `deadline`; TimeoutError when none are left."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline has passed")
    return left


class _DeadlineSocket:
    """A connected socket whose every send and receive waits at most until `deadline` (a plain
    socket timeout restarts at each receive, and http.client reads the status line, each header
    line and the body through many)."""

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline = sock, deadline

    def sendall(self, data) -> None:
        self.sock.settimeout(_left(self.deadline))
        self.sock.sendall(data)

    def recv_into(self, buffer, nbytes: int = 0) -> int:
        self.sock.settimeout(_left(self.deadline))
        return self.sock.recv_into(buffer, nbytes)

    def makefile(self, mode: str = "rb", buffering: int | None = None):
        return io.BufferedReader(_Reader(self))

    def close(self) -> None:
        """Nothing: http.client closes its connection while the answer is still being read; the
        socket is closed once the exchange is over."""

    def __getattr__(self, name):
        return getattr(self.sock, name)


class _Reader(io.RawIOBase):
    def __init__(self, sock: _DeadlineSocket):
        self.sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self.sock.recv_into(buffer)


def _proxy(parts: urllib.parse.SplitResult) -> urllib.parse.SplitResult | None:
    """The proxy the environment names for this address, as urllib.request.urlopen picks it."""
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.netloc):
        return None
    return urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")


def _proxy_auth(proxy: urllib.parse.SplitResult) -> dict[str, str]:
    if not proxy.username:
        return {}
    user = urllib.parse.unquote(proxy.username) + ":" + urllib.parse.unquote(proxy.password or "")
    return {"Proxy-Authorization": "Basic " + base64.b64encode(user.encode()).decode()}


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
