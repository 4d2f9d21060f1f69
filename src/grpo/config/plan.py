"""The plan of a run: what the config decides about the algorithm, decided once, at start.

A GRPO step asks the same questions every time: is there a reference model, and when is it reset;
where does the KL act; what is pi_old; which off-policy correction applies; where do the groups
come from. Each is answered here, from the config, and nowhere else; the step reads the answers.

    reference     "none" (beta = 0), "copy" (a frozen copy of the policy), "adapter_off" (LoRA:
                  the policy with its adapter switched off, the base the cold start merged into)
    ref_reset_every, ref_update_rate
                  a new outer iteration every this many steps: reference <- policy (soft with a
                  rate < 1); 0: never (Algorithm 1 resets it per outer iteration; with one, never)
    kl_in         "none", "loss" (- beta KL in the objective), "reward" (- beta KL in the reward,
                  kl_in_reward: REINFORCE++ and the like)
    pi_old        "current" (mu = 1 and nothing reads it: the update's own log-probs, detached,
                  stand for it, the ratio is 1 and the gradient the same); "recomputed" (a pass
                  of the policy before the updates: mu > 1, a correction, a KL in the reward, a
                  covariance loss, or async_steps with proximal=decoupled, where it is pi_prox);
                  "behaviour" (async_steps with proximal=behaviour: the log-probs of the weights
                  that sampled)
    correction    (name, cap, lower threshold) of the off-policy correction, or None
    groups        where step t's groups come from: "inline" (the learner's sampler, from the
                  weights after step t-1), or with async_steps = k > 0, from the weights after
                  t-1-k: "workers" (rollout workers forked from the trainer, grpo's own sampler)
                  or "client" (an engine client, a thread of each trainer process: on vLLM in
                  this process or on servers, or grpo's own sampler with rollout_workers=0)
"""

from __future__ import annotations

from dataclasses import dataclass

# Their token selection reads log pi_old. algorithm/loss.py holds the same tuple, which this
# lower layer may not import; tests/test_plan.py holds the two equal.
COVARIANCE_LOSSES = ("clip_cov", "kl_cov")


@dataclass(frozen=True)
class Plan:
    reference: str
    ref_reset_every: int
    ref_update_rate: float
    kl_in: str
    pi_old: str
    correction: tuple[str, float, float] | None
    groups: str
    async_steps: int

    @property
    def first_update_on_policy(self) -> bool:
        """Whether the step's first update starts from pi_old itself (ratio 1): not where pi_old
        is the behaviour policy, which the trainer's weights have moved on from."""
        return self.pi_old != "behaviour"

    def reset_reference_before(self, step: int) -> bool:
        """A new outer iteration begins at `step` (reference <- policy before it)."""
        return (self.reference == "copy" and self.ref_reset_every > 0 and step > 1
                and (step - 1) % self.ref_reset_every == 0)

    def lines(self) -> list[str]:
        """The plan in words, one line a decision."""
        return [f"reference: {self.reference}"
                + (f", reset every {self.ref_reset_every} steps (rate {self.ref_update_rate:g})"
                   if self.ref_reset_every and self.reference == "copy" else ""),
                f"KL acts in: {self.kl_in}",
                f"pi_old: {self.pi_old}",
                f"off-policy correction: {'none' if self.correction is None else self.correction[0]}",
                f"groups: {self.groups}" + (f" (async_steps={self.async_steps})" if self.async_steps else "")]


def plan_of(c) -> Plan:
    """The plan of config `c` (a TrainConfig)."""
    loss, pipeline = c.loss, c.pipeline
    reference = "none" if loss.beta <= 0 else "adapter_off" if c.model.lora_r else "copy"
    kl_in = "none" if reference == "none" else "reward" if loss.kl_in_reward else "loss"
    correction = correction_of(c)
    if pipeline.async_steps and pipeline.proximal == "behaviour":
        pi_old = "behaviour"
    elif (c.optim.num_iterations > 1 or correction is not None or loss.kl_in_reward
          or loss.loss_type in COVARIANCE_LOSSES or pipeline.async_steps or c.model.teacher):
        pi_old = "recomputed"     # a teacher's advantage compares its pass with pi_old's, made alike
    else:
        pi_old = "current"
    return Plan(reference=reference, ref_reset_every=c.run.ref_reset_every,
                ref_update_rate=c.run.ref_update_rate, kl_in=kl_in, pi_old=pi_old,
                correction=correction, groups=groups_of(c), async_steps=pipeline.async_steps)


def groups_of(c) -> str:
    """Where the groups come from (the module docstring): "inline", "workers" or "client"."""
    if not c.pipeline.async_steps:
        return "inline"
    return "client" if c.sampling.sampler != "hf" or not c.pipeline.rollout_workers else "workers"


def correction_of(c) -> tuple[str, float, float] | None:
    """The off-policy correction, its cap and its lower threshold (0: the method's own):
    `correction`, `tis_cap` (correction=tis), or with async_steps and proximal=decoupled the plain
    ratio pi_prox / pi_behaviour (AReaL); None: none."""
    if c.loss.correction != "none":
        return c.loss.correction, c.loss.correction_cap, c.loss.correction_cap_low
    if c.loss.tis_cap > 0:
        return "tis", c.loss.tis_cap, 0.0
    if c.pipeline.async_steps and c.pipeline.proximal == "decoupled":
        return "is", c.loss.correction_cap, 0.0
    return None
