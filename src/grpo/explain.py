"""`grpo explain`: the algorithm in four steps, with what this installation offers at each."""

from __future__ import annotations

from grpo.advantages import ADVANTAGES
from grpo.config import ALGORITHMS
from grpo.loss import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from grpo.rewards import REWARDS
from grpo.tasks import TASKS


def _first_sentence(doc: str | None) -> str:
    text = " ".join((doc or "").split("\n\n")[0].split())
    return text.split(", else")[0].split("; ")[0]


def explain() -> str:
    rewards = "\n".join(f"      {name:20s} {_first_sentence(fn.__doc__)}" for name, fn in REWARDS.items())
    tasks = "\n".join(f"      {t.name:20s} {t.summary}" for t in TASKS.values())
    presets = "\n".join(f"      {name:10s} " + " ".join(f"{k}={v}" for k, v in keys.items())
                        for name, keys in ALGORITHMS.items())
    return f"""GRPO, one step (DeepSeekMath, arXiv:2402.03300, Algorithm 1):

  1. sample      G = group_size completions for each of prompts_per_step prompts   sampling.py
  2. score       each completion with the reward functions (weighted sum)          rewards/
{rewards}
  3. normalize   A = (r - mean(r)) / (std(r) + advantage_eps) within each group   advantages.py
      advantage=: {', '.join(ADVANTAGES)}
  4. update      num_iterations times: maximize
                 min(rho*A, clip(rho, 1-epsilon, 1+epsilon_high)*A) - beta*KL_k3(pi || pi_ref)
                 averaged over each completion's tokens, then over completions   loss.py, update.py
      loss_type=: {', '.join(POLICY_LOSSES)}    aggregation=: {', '.join(AGGREGATIONS)}
      kl_estimator=: {', '.join(KL_ESTIMATORS)}

  The reference model is reset to the policy every ref_reset_every steps (0: never).

Built-in tasks (task=NAME):
{tasks}

Presets (algorithm=NAME; explicit keys win; docs/algorithms.md gives the papers):
{presets}
"""
