"""Rewards that come from outside the process's own Python: a reward model, a reward server.

Both follow the reward contract, `fn(prompts, completions, **columns) -> list[float | None]`, so the
loop treats them like any other reward function. In a config: `rewards=[model:DIR]` for a
sequence-classification model directory, `rewards=[http://host:port/path]` for a server.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import torch

from grpo.rewards import RewardError


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
    (or a bare list). Retries `retries` times on a connection error, a timeout or a 5xx answer.

    A 413 (Payload Too Large) is answered by sending the batch again in two halves, down to one
    completion; a completion the server refuses alone raises `RewardRefused`, which
    `reward_on_error=skip` turns into that one sample being unscorable."""

    def __init__(self, url: str, timeout: float = 30.0, retries: int = 2, backoff: float = 0.5):
        self.url, self.timeout, self.retries, self.backoff = url, timeout, retries, backoff
        self.__name__ = "reward_server"

    def __call__(self, prompts: list[str], completions: list[str], **columns) -> list:
        try:
            return self._post(prompts, completions, columns)
        except _TooLarge as e:
            if len(completions) == 1:
                raise RewardRefused(f"reward server {self.url} refused a completion "
                                    f"({e.size:,} bytes of JSON) with {e}", [None]) from None
        half, values, refused = len(completions) // 2, [], None
        for part in (slice(0, half), slice(half, None)):
            try:
                values += self(prompts[part], completions[part],
                               **{k: v[part] for k, v in columns.items()})
            except RewardRefused as e:
                values += e.partial
                refused = refused or e
        if refused is not None:
            raise RewardRefused(str(refused), values)
        return values

    def _post(self, prompts: list[str], completions: list[str], columns: dict) -> list:
        body = json.dumps({"prompts": prompts, "completions": completions,
                           "columns": columns}, default=str).encode()
        answer, error, attempts = None, "", 0
        while answer is None and attempts <= self.retries:
            if attempts:
                time.sleep(self.backoff * attempts)
            attempts += 1
            request = urllib.request.Request(self.url, data=body,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read()
            except urllib.error.HTTPError as e:
                error = f"HTTP {e.code} {e.reason}{_body_start(e)}"
                if e.code == 413:
                    raise _TooLarge(error, len(body)) from None
                if e.code < 500:
                    break  # the server refused this request; asking again will not help
                continue
            except (urllib.error.URLError, TimeoutError, OSError) as e:
                error = str(getattr(e, "reason", e))
                continue
            try:
                answer = json.loads(raw)
            except json.JSONDecodeError:
                raise RewardError(f"reward server {self.url} answered with something that is not "
                                  "JSON") from None
        if answer is None:
            raise RewardError(f"reward server {self.url} failed after {attempts} attempt(s): {error}")
        rewards = answer.get("rewards") if isinstance(answer, dict) else answer
        if not isinstance(rewards, list):
            raise RewardError(f"reward server {self.url} answered without a 'rewards' list")
        return rewards


class RewardRefused(RewardError):
    """The source refused some samples for what they are (too large, say). `partial` holds the
    batch's rewards with None for those: reward_on_error=skip keeps it, so only the refused samples
    are unscorable."""

    def __init__(self, message: str, partial: list):
        super().__init__(message)
        self.partial = partial


class _TooLarge(Exception):
    def __init__(self, message: str, size: int):
        super().__init__(message)
        self.size = size


def _body_start(e: urllib.error.HTTPError, limit: int = 200) -> str:
    """': <the first `limit` characters of the error's body>', or '' when it has none."""
    try:
        text = e.read(limit + 1).decode("utf-8", "replace").strip()
    except Exception:  # noqa: BLE001 - the body is only a hint; a broken one is left out
        return ""
    return f": {text[:limit]}{'...' if len(text) > limit else ''}" if text else ""
