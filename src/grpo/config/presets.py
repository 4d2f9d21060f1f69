"""Presets: `algorithm=NAME` sets the keys a paper uses; explicit keys win over them."""

from __future__ import annotations

# The papers' settings; docs/algorithms.md gives the sources.
ALGORITHMS: dict[str, dict] = {
    "grpo": {"advantage": "group_norm", "loss_type": "clip", "aggregation": "sequence_mean",
             "epsilon": 0.2, "epsilon_high": 0.2, "beta": 0.04, "kl_estimator": "k3"},
    "dr_grpo": {"advantage": "group_mean", "loss_type": "clip", "aggregation": "constant",
                "epsilon": 0.2, "epsilon_high": 0.2, "beta": 0.0},
    "dapo": {"advantage": "group_norm", "loss_type": "clip", "aggregation": "token_mean",
             "epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.0, "dynamic_sampling": True,
             "overlong_buffer": 0.2, "overlong_penalty": 1.0},
    "gspo": {"advantage": "group_norm", "loss_type": "gspo", "aggregation": "sequence_mean",
             "epsilon": 3e-4, "epsilon_high": 4e-4, "beta": 0.0},
    "cispo": {"advantage": "group_norm", "loss_type": "cispo", "aggregation": "token_mean",
              "epsilon": 1.0, "epsilon_high": 0.28, "beta": 0.0},
    "rloo": {"advantage": "rloo", "loss_type": "clip", "aggregation": "sequence_sum",
             "epsilon": 0.2, "epsilon_high": 0.2, "beta": 0.05, "kl_estimator": "k1",
             "kl_in_reward": True},
    "sapo": {"advantage": "group_norm", "loss_type": "sapo", "aggregation": "sequence_mean",
             "sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05, "beta": 0.0},
    "gmpo": {"advantage": "group_norm", "loss_type": "gmpo", "aggregation": "sequence_mean",
             "epsilon": 0.4, "epsilon_high": 0.4, "beta": 0.0},
    "clip_cov": {"advantage": "group_norm", "loss_type": "clip_cov", "aggregation": "token_mean",
                 "clip_cov_fraction": 2e-4, "clip_cov_low": 1.0, "clip_cov_high": 5.0, "beta": 0.0},
    # num_iterations=2: KL-Cov's term |log pi_theta - log pi_old| is 0 at a batch's first update,
    # and acts from its second on, as in the paper's runs of several updates per rollout batch
    "kl_cov": {"advantage": "group_norm", "loss_type": "kl_cov", "aggregation": "token_mean",
               "kl_cov_fraction": 2e-3, "kl_cov_coef": 1.0, "beta": 0.0, "num_iterations": 2},
    "reinforce_pp": {"advantage": "reinforce_pp", "reinforce_pp_batch_norm": True, "loss_type": "clip",
                     "aggregation": "sequence_mean", "epsilon": 0.2, "epsilon_high": 0.2,
                     "beta": 0.001, "kl_estimator": "k1", "kl_in_reward": True},
    "reinforce_pp_baseline": {"advantage": "reinforce_pp_baseline", "reinforce_pp_batch_norm": True,
                              "loss_type": "clip", "aggregation": "sequence_mean", "epsilon": 0.2,
                              "epsilon_high": 0.2, "beta": 0.001, "kl_estimator": "k2",
                              "kl_in_reward": False},
    # on-policy distillation (teacher=MODEL): each token's advantage is the reverse KL's,
    # -(log pi - log teacher); one update per batch, a token mean, no KL to a reference
    "distill": {"distill": "alone", "loss_type": "clip", "aggregation": "token_mean",
                "epsilon": 0.2, "epsilon_high": 0.2, "beta": 0.0},
}
