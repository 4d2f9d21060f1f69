"""Evaluation estimators, as benchmarks report them: pass@1 over n samples, pass@k, maj@k.

Pure functions on counts and lists; `evaluate.py` feeds them.
"""

from __future__ import annotations

import math
from collections import Counter


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from n samples of which c are correct (Chen et al. 2021,
    arXiv:2107.03374, eq. 1): 1 - C(n - c, k) / C(n, k), the chance that k samples drawn without
    replacement from the n hold at least one correct one."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_vote(answers: list[str | None], correct: list[bool]) -> bool:
    """maj@k on one prompt's k samples: the most frequent extracted answer (ties to the one seen
    first; samples with no answer do not vote) is right when a sample that gave it was right."""
    voted = [a for a in answers if a is not None]
    if not voted:
        return False
    counts = Counter(voted)
    top = max(counts.values())
    winner = next(a for a in voted if counts[a] == top)
    return any(ok for a, ok in zip(answers, correct) if a == winner)


def summarize(rows: list[dict], ks: list[int], with_votes: bool) -> dict[str, float]:
    """Metrics over prompts. Each row has `scores` (n values, None where unscorable) and, for
    votes, `answers`. pass@1 is the mean score over scored samples (fractional scores count as
    they are); `pass@1_std` is the standard deviation, over the n sample positions, of each
    position's mean score. pass@k and maj@k count a sample correct when its score is 1, which
    means something only when every score is 0 or 1: when any is not (a graded reward, 0.5 or 2),
    neither is computed for any k (`binary_scores`), and pass@1 stays the mean score."""
    scored = [[s for s in r["scores"] if s is not None] for r in rows]
    used = [s for s in scored if s]
    n_max = max((len(r["scores"]) for r in rows), default=0)
    out: dict[str, float] = {
        "eval/accuracy": sum(sum(s) / len(s) for s in used) / max(len(used), 1),
        "eval/n": float(len(used)),
        "eval/unscorable": float(sum(len(r["scores"]) - len(s) for r, s in zip(rows, scored))),
    }
    out["eval/pass@1"] = out["eval/accuracy"]
    if n_max > 1:
        positions = []
        for j in range(n_max):
            column = [r["scores"][j] for r in rows if j < len(r["scores"]) and r["scores"][j] is not None]
            if column:
                positions.append(sum(column) / len(column))
        mean = sum(positions) / len(positions)
        out["eval/pass@1_std"] = math.sqrt(sum((p - mean) ** 2 for p in positions) / len(positions))
    for k in ks if binary_scores(rows) else ():
        per_row = [pass_at_k(len(s), sum(v == 1.0 for v in s), k) for s in scored if len(s) >= k]
        out[f"eval/pass@{k}"] = sum(per_row) / max(len(per_row), 1)
        if with_votes and k > 1:
            votes = [majority_vote(r["answers"][:k], [v == 1.0 for v in r["scores"][:k]])
                     for r in rows if all(v is not None for v in r["scores"][:k])]
            out[f"eval/maj@{k}"] = sum(votes) / max(len(votes), 1)
    return out


def binary_scores(rows: list[dict]) -> bool:
    """Whether every score is 0 or 1 (None, unscorable, is no score): correctness, which pass@k
    and maj@k count."""
    return all(v in (0.0, 1.0) for r in rows for v in r["scores"] if v is not None)
