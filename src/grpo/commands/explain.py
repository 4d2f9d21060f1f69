"""`grpo explain`: the four steps of GRPO, shown on one prompt as they happen.

    grpo explain [CONFIG.yaml] [key=value ...] [--prompt TEXT [--answer A] | --row N] [--json]
    grpo explain --overview           the algorithm, rewards, tasks and presets, as text

For one prompt (the dataset's row N, numbered from 1 as in the file, or a built-in task's N-th
training row; default 1; or `--prompt`) and the configured model (after its cold start, if
`sft_steps`): the G sampled completions, each reward with its
components, the group's mean and standard deviation, each advantage; then the `num_iterations`
updates, each with the per-token ratio pi/pi_old, which tokens the clip acted on and on which side,
the per-token KL to the reference, and the loss; and finally how each completion's log-probability
moved. The same numbers come as JSON with `--json`; they are computed by training's own step
(step.grpo_step, watched by a Recorder), not by a copy of it.

With no `model` given, the model is the demo's tiny one after a cold start a little longer than
the demo's (DEMO: sft_steps, sft_lr), so that its group has rewards of 1 and of 0 to tell apart,
and with num_iterations=4, so that the ratio moves away from 1 and the clip acts; keys the user
gives win. The random model the demo starts from scores 0 everywhere (advantages 0, ratios 1),
and a group like that teaches nothing.
"""

from __future__ import annotations

import dataclasses
import math
import re
import textwrap

import torch

from grpo import assembly
from grpo.algorithm.advantages import ADVANTAGES
from grpo.config import ALGORITHMS, TrainConfig, load_config, load_yaml, parse_overrides
from grpo.data import columns_of
from grpo.algorithm.loss import (AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, aggregation_weights, surrogate,
                                 token_kl)
from grpo.pipeline.inline import score_rollout
from grpo.rewards import REWARDS, faults
from grpo.data.tasks import TASKS
from grpo.step import Observer, Taken, grpo_step, loss_settings
from grpo.update import logprobs_of


def _first_sentence(doc: str | None) -> str:
    """The docstring's first sentence, whole: up to the first full stop that a capital follows."""
    text = " ".join((doc or "").split("\n\n")[0].split())
    return re.split(r"(?<=\.) (?=[A-Z])", text, maxsplit=1)[0]


def overview() -> str:
    rewards = "\n".join(textwrap.fill(_first_sentence(fn.__doc__), 100, initial_indent=f"      {name:20s} ",
                                       subsequent_indent=" " * 27) for name, fn in REWARDS.items())
    tasks = "\n".join(f"      {t.name:20s} {t.summary}" for t in TASKS.values())
    presets = "\n".join(f"      {name:10s} " + " ".join(f"{k}={v}" for k, v in keys.items())
                        for name, keys in ALGORITHMS.items())
    return f"""GRPO, one step (DeepSeekMath, arXiv:2402.03300, Algorithm 1):

  1. sample      G = group_size completions for each of prompts_per_step prompts   sampling/
  2. score       each completion with the reward functions (weighted sum)          rewards/
{rewards}
  3. normalize   A = (r - mean(r)) / (std(r) + advantage_eps) within each group   algorithm/advantages.py
      advantage=: {', '.join(ADVANTAGES)}
  4. update      num_iterations times: maximize
                 min(rho*A, clip(rho, 1-epsilon, 1+epsilon_high)*A) - beta*KL_k3(pi || pi_ref)
                 averaged over each completion's tokens, then over completions   algorithm/loss.py, update.py
      loss_type=: {', '.join(POLICY_LOSSES)}    aggregation=: {', '.join(AGGREGATIONS)}
      kl_estimator=: {', '.join(KL_ESTIMATORS)}

  The reference model is reset to the policy every ref_reset_every steps (0: never).
  `grpo explain` (without --overview) runs these four steps on one prompt and shows every number.

Built-in tasks (task=NAME):
{tasks}
      reasoning_gym:NAME   reasoning-gym's ~100 generators, scored by their own score_answer
                           (task_args={{...}} for their knobs; pip install -e '.[tasks]'; docs/tasks.md)

Presets (algorithm=NAME; explicit keys win; docs/algorithms.md gives the papers):
{presets}
"""


# The keys `grpo explain` sets when no model is given (each only where the user did not set it):
# 20 supervised steps at 3e-3 take the tiny model from noise to answering about half of the
# largest task's prompts right when sampled at temperature 1 (the demo's 10 at 1e-3 leave most
# samples malformed); 4 updates on the group at the default lr move the ratio past the clip.
DEMO = {"sft_steps": 20, "sft_lr": 3e-3, "num_iterations": 4}


def config_for(path: str | None, overrides: list[str]) -> tuple[TrainConfig, list[str]]:
    """The config `grpo explain` runs (DEMO's keys where no model is given) and a note that says
    which keys it set and why, for the output."""
    given = set(load_yaml(path) if path else {}) | set(parse_overrides(overrides))
    config = load_config(path, overrides)
    if "model" in given:
        return config, []
    demo = {k: v for k, v in DEMO.items() if k not in given}
    if not demo:
        return config, []
    config = load_config(path, [f"{k}={v}" for k, v in demo.items()] + list(overrides))
    note = ("No model given: the demo's tiny model (random, so every reward would be 0), with "
            + " ".join(f"{k}={v}" for k, v in demo.items())
            + " set here: a cold start on the demonstrations (the task's, or a dataset's "
            "`completion` column), so the group's rewards differ, and several updates on one "
            "batch, so the ratio moves and the clip acts. "
            "model=DIR explains your own model.")
    return config, [note]


def pick_row(c: TrainConfig, data: assembly.Data, number: int) -> dict:
    """Row `number` of the data, counted from 1: of the dataset file as it is written (error
    messages count the same way), or of a built-in task's training rows."""
    if c.data.dataset:
        found = [r for r in data.train_rows if r.get("_row") == number - 1]
        last = max(r.get("_row", 0) for r in data.train_rows) + 1
        where = c.data.dataset
    else:
        found = data.train_rows[number - 1:number] if number >= 1 else []
        last, where = len(data.train_rows), f"task {c.data.task}"
    if not found:
        raise assembly.ConfigError(f"--row {number}: rows are numbered from 1, as in the file; "
                                f"{where} has rows 1..{last}")
    return {k: v for k, v in found[0].items() if k != "_row"}


def explain_group(c: TrainConfig, *, prompt: str | None = None, answer: str | None = None,
                  row: int = 1, log=lambda line: None) -> dict:
    """Sample, score, normalize and update on one prompt (`row` of the data, counted from 1 as
    in the file, or `prompt`); every intermediate number, as a dict. The step is training's own
    (step.grpo_step), watched by a Recorder."""
    loaded = assembly.assemble_command("explain", c, log=log)
    data, policy, tok = loaded.data, loaded.policy, loaded.tokenizer
    rows = [{"prompt": prompt, "answer": answer}] if prompt is not None else [pick_row(c, data, row)]
    notes = []
    if c.run.sft_steps and data.demonstrations:
        assembly.cold_start(c, policy, tok, data, log)
        if hasattr(policy, "peft_config"):   # LoRA: the cold start merged in, as in a run
            policy = assembly.with_fresh_adapter(c, policy.merge_and_unload())
    elif c.run.sft_steps:
        notes.append(f"sft_steps={c.run.sft_steps}, but no cold start: the data has no "
                     "demonstrations (a dataset's `completion` column), so the model is as loaded")
    if c.pipeline.async_steps:
        notes.append(f"async_steps={c.pipeline.async_steps}: in a run, step t trains on groups a "
                     f"rollout worker sampled from the weights after step t-1-{c.pipeline.async_steps} "
                     "(docs/guides/async.md); this one step samples with the weights it updates, so "
                     "pi_old is the policy that sampled, as at step 1")
    # every update is shown, a non-finite one too (stepped: False): none stops the explanation
    c = dataclasses.replace(c, optim=dataclasses.replace(c.optim, max_skipped_updates=c.optim.num_iterations))
    learner = assembly.make_learner(c, policy, tok, data.agent)
    recorder = Recorder(c, learner.policy, learner.plan)
    rollout, _ = grpo_step(c, learner, OneGroup(c, learner, tok, data, rows), data.agent, recorder)
    mb, mb_tokens = c.optim.micro_batch_size, c.optim.micro_batch_tokens
    after = logprobs_of(learner.policy, rollout, mb, mb_tokens)
    rollout.old_logprobs = recorder.old
    weights = aggregation_weights(c.loss.aggregation, rollout.tokens_in_loss, c.sampling.max_new_tokens)   # the update's
    scored = rollout.rewards[~torch.isnan(rollout.rewards)]
    out = _as_dict(c, rollout, tok, scored, recorder.iterations, after, weights)
    out["notes"] = notes
    out["row"] = None if prompt is not None else row
    out["source"] = "--prompt" if prompt is not None else (c.data.dataset or f"task {c.data.task}")
    return out


class OneGroup:
    """The group source of `grpo explain`: one prompt's G completions, sampled by the learner's
    engine with draws from the seed, and scored as training scores them."""
    colocated = True

    def __init__(self, c: TrainConfig, learner, tokenizer, data: assembly.Data, rows: list[dict]):
        self.c, self.learner, self.tokenizer, self.data, self.rows = c, learner, tokenizer, data, rows

    def take(self, step: int) -> Taken:
        G, T = self.c.sampling.group_size, self.learner.sampler.max_new_tokens
        draws = torch.Generator().manual_seed(self.c.run.seed)
        with faults.counting() as counts:
            rollout = self.learner.sampler.sample(assembly.prompt_texts(self.c, self.tokenizer, self.rows,
                                                                     self.data.agent),
                                                  G, uniforms=torch.rand(G, T, generator=draws),
                                                  rows=self.rows)
            rollout.columns = columns_of(self.rows, G)
            score_rollout(self.c, rollout, self.data)
        return Taken(rollout, {}, 0.0, 0.0, counts.metrics())

    def send_weights(self, step: int, policy) -> None:
        return None


class Recorder(Observer):
    """Every number of the step's stages that explain shows: pi_old (computed here where the step
    needs none: with mu = 1 and no correction its updates take their own log-probs, detached),
    and for each update the log-probs before it, the ratio, the clipped tokens and the KL."""

    def __init__(self, c: TrainConfig, policy, plan):
        self.c, self.policy, self.plan = c, policy, plan
        self.old: torch.Tensor | None = None
        self.iterations: list[dict] = []
        self.pending: dict = {}

    def _logprobs(self, rollout):
        return logprobs_of(self.policy, rollout, self.c.optim.micro_batch_size, self.c.optim.micro_batch_tokens)

    def fixed(self, rollout) -> None:
        self.old = rollout.old_logprobs if rollout.old_logprobs is not None else self._logprobs(rollout)

    def before_update(self, iteration: int, rollout, selected) -> None:
        now = self._logprobs(rollout)
        mask = rollout.tokens_in_loss
        adv = rollout.advantages if rollout.advantages.dim() == 2 else rollout.advantages.unsqueeze(-1)
        sur = surrogate(now, self.old, adv, mask, loss_settings(self.c, self.plan), selected)
        kl = (token_kl(now, rollout.ref_logprobs, mask, self.c.loss.kl_estimator)
              if rollout.ref_logprobs is not None else torch.zeros_like(now))
        self.pending = {"logp": now, "ratio": torch.exp(now - self.old), "clipped_low": sur.clipped_low,
                        "clipped_high": sur.clipped_high, "kl_tokens": kl}

    def after_update(self, iteration: int, stats: dict, stepped: bool) -> None:
        self.iterations.append({**self.pending, "loss": stats["loss"], "grad_norm": stats["grad_norm"],
                                "stepped": stepped, "clip_frac": stats["clip/frac"], "kl": stats["kl"]})


def _as_dict(c, rollout, tok, scored, iterations, after, weights) -> dict:
    mask = rollout.tokens_in_loss.bool()
    completions = []
    for i in range(len(rollout)):
        n = int(rollout.real_mask[i].sum())
        ids = rollout.completion_ids[i, :n].tolist()
        reward = rollout.rewards[i].item()
        completions.append({
            "text": rollout.completions[i],
            "tokens": tok.convert_ids_to_tokens(ids),
            "rewards": {name: values[i] for name, values in rollout.rewards_per_fn.items()},
            "reward": None if math.isnan(reward) else reward,
            # per-token advantages (REINFORCE++): the mean over the completion's counted tokens
            "advantage": (rollout.advantages[i].item() if rollout.advantages.dim() == 1 else
                          (rollout.advantages[i] * mask[i]).sum().item() / max(int(mask[i].sum()), 1)),
            "truncated": bool(rollout.truncated[i]),
            "old_logprobs": rollout.old_logprobs[i, :n].tolist(),
            "ref_logprobs": None if rollout.ref_logprobs is None else rollout.ref_logprobs[i, :n].tolist(),
            "teacher_logprobs": (None if rollout.teacher_logprobs is None
                                 else rollout.teacher_logprobs[i, :n].tolist()),
            "token_advantages": (rollout.advantages[i, :n].tolist() if rollout.advantages.dim() == 2
                                 else None),
            "in_loss": mask[i, :n].tolist(),
            "weights": weights[i, :n].tolist(),
            "logprob_before": float((rollout.old_logprobs[i] * mask[i]).sum()),
            "logprob_after": float((after[i] * mask[i]).sum()),
            "by_policy": rollout.completion_mask[i, :n].bool().tolist(),
        })
        if rollout.episodes:      # the turns: which characters the policy and the tools wrote
            e = rollout.episodes
            completions[-1].update(turns=e.turns[i], tool_calls=e.tool_calls[i],
                                   tool_failures=e.tool_failures[i], spans=e.spans[i])
        completions[-1]["logprob_change"] = completions[-1]["logprob_after"] - completions[-1]["logprob_before"]
    out_iterations = []
    for k, it in enumerate(iterations, 1):
        per = []
        for i in range(len(rollout)):
            n = int(rollout.real_mask[i].sum())
            per.append({"logprobs": it["logp"][i, :n].tolist(), "ratio": it["ratio"][i, :n].tolist(),
                        "clipped": ["low" if lo else "high" if hi else "" for lo, hi in
                                    zip(it["clipped_low"][i, :n].tolist(), it["clipped_high"][i, :n].tolist())],
                        "kl": it["kl_tokens"][i, :n].tolist()})
        out_iterations.append({"iteration": k, "loss": it["loss"], "grad_norm": it["grad_norm"],
                               "stepped": it["stepped"], "clip_frac": it["clip_frac"], "kl": it["kl"],
                               "completions": per})
    return {
        "prompt": rollout.prompts[0], "model": c.model.model, "group_size": len(rollout),
        "advantage": c.loss.advantage, "advantage_eps": c.loss.advantage_eps,
        "loss_type": c.loss.loss_type, "aggregation": c.loss.aggregation, "beta": c.loss.beta,
        "distill": c.loss.distill, "distill_coef": c.loss.distill_coef,
        "kl_estimator": c.loss.kl_estimator, "epsilon": c.loss.epsilon,
        "epsilon_high": c.loss.epsilon_high or c.loss.epsilon, "max_new_tokens": c.sampling.max_new_tokens,
        "group_mean": scored.mean().item() if scored.numel() else None,
        "group_std": scored.std().item() if scored.numel() > 1 else 0.0,
        "completions": completions, "iterations": out_iterations,
    }


# each advantage estimator in one line (advantages.py has the definitions)
_FORMULAS = {
    "group_norm": "A = (r - mean) / (std + eps)",
    "group_mean": "A = r - mean",
    "batch_norm": "A = (r - mean) / (std of the step + eps)",
    "rloo": "A = r - mean of the others",
    "reinforce_pp": "A_t = r - beta * (KL of tokens t..end), then over the batch's tokens (A - mean) / (std + eps)",
    "reinforce_pp_baseline": "A_t = r - mean, then over the batch's tokens (A - mean) / (std + eps)",
}


def render(result: dict) -> str:
    """The explanation as rich terminal tables (plain text when not a terminal)."""
    from io import StringIO
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    buffer = StringIO()
    console = Console(file=buffer, width=120, force_terminal=False)
    for note in result.get("notes", []):
        console.print(note, style="dim", markup=False)
    where = f"row {result['row']} of {result['source']}; " if result.get("row") else ""
    console.print("[bold]Prompt[/bold] " + escape(f"({where}model {result['model']}): "
                                                   f"{result['prompt']!r}"))
    console.print(f"[bold]1. sample[/bold]  G = {result['group_size']} completions   "
                  f"[bold]2. score[/bold]   [bold]3. normalize[/bold]  group mean "
                  f"{_fmt(result['group_mean'])}, std {_fmt(result['group_std'])}, "
                  f"{_FORMULAS.get(result['advantage'], 'A')}  ({result['advantage']}, "
                  f"eps {result['advantage_eps']:g})")
    table = Table(show_lines=False)
    for col in ("#", "completion", "reward", "components", "advantage", "log p before", "after", "moved"):
        table.add_column(col, overflow="fold")
    for i, comp in enumerate(result["completions"]):
        parts = ", ".join(f"{k} {_fmt(v)}" for k, v in comp["rewards"].items())
        table.add_row(str(i), _transcript(comp) + (" (cut)" if comp["truncated"] else ""),
                      _fmt(comp["reward"]), parts, f"{comp['advantage']:+.3f}",
                      f"{comp['logprob_before']:.3f}", f"{comp['logprob_after']:.3f}",
                      f"{comp['logprob_change']:+.3f}")
    console.print(table)
    if result["completions"] and result["completions"][0].get("teacher_logprobs") is not None:
        _teacher_table(console, result, Table, Text)
    if all(abs(comp["advantage"]) == 0 for comp in result["completions"]):
        console.print("Every reward in the group is equal, so every advantage is 0: the update can only "
                      "follow the KL term. Try another --row, a larger group_size or a cold start.")
    for it in result["iterations"]:
        console.print(f"[bold]4. update {it['iteration']}/{len(result['iterations'])}[/bold]  loss "
                      f"{it['loss']:+.5f}  grad norm {it['grad_norm']:.4f}  clipped "
                      f"{it['clip_frac']:.1%} of tokens  KL {it['kl']:.5f}  ({result['loss_type']}, "
                      f"epsilon {result['epsilon']:g}/{result['epsilon_high']:g}, beta {result['beta']:g})")
        tokens = Table(show_header=True)
        tokens.add_column("#")
        tokens.add_column("token: ratio pi/pi_old \\[clipped side] KL", overflow="fold")
        for i, (comp, per) in enumerate(zip(result["completions"], it["completions"])):
            line, answer = Text(), []
            for tok, r, side, kl, mine in zip(comp["tokens"], per["ratio"], per["clipped"], per["kl"],
                                              comp["by_policy"]):
                if not mine:            # a tool's or the environment's token: no numbers
                    answer.append(tok)
                    continue
                if answer:
                    line.append(f"[tool/env: {len(answer)} tokens]  ", style="dim")
                    answer = []
                line.append(f"{tok!r}:{r:.3f}", style="bold red" if side else None)
                line.append(f"[{side}]" if side else "")
                line.append(f" kl {kl:.4f}  ")
            tokens.add_row(str(i), line)
        console.print(tokens)
    if len(result["iterations"]) == 1:
        console.print("With num_iterations=1 every ratio is 1 (the policy is the one that sampled), so "
                      "nothing is clipped; set num_iterations=4 to watch the clip act.")
    return buffer.getvalue()


def _teacher_table(console, result: dict, Table, Text) -> None:
    """Distillation: each token's log-prob under the policy and the teacher, and the advantage
    the token gets (the GRPO advantage, plus or in place of -(log pi - log teacher))."""
    console.print(f"[bold]3b. teacher[/bold]  token advantage = {result.get('distill_coef', 1):g} * "
                  f"-(log pi - log teacher)" + (" + A" if result.get("distill") == "add" else
                                               " (distill=alone: the rewards are only logged)"))
    tokens = Table(show_header=True)
    tokens.add_column("#")
    tokens.add_column("token: log pi / log teacher -> advantage", overflow="fold")
    for i, comp in enumerate(result["completions"]):
        line = Text()
        for tok, mine, old, teacher, adv in zip(comp["tokens"], comp["in_loss"], comp["old_logprobs"],
                                                comp["teacher_logprobs"], comp["token_advantages"]):
            if mine:
                line.append(f"{tok!r}: {old:.3f} / {teacher:.3f} -> {adv:+.3f}  ")
        tokens.add_row(str(i), line)
    console.print(tokens)


def _transcript(comp: dict) -> str:
    """The completion's text; in an episode, what tools and the environment wrote is shown
    between [tool/env: ...] marks, and the turns and calls are counted."""
    if "spans" not in comp:
        return repr(comp["text"])
    text = "".join(comp["text"][a:b] if who == "policy" else f"[tool/env: {comp['text'][a:b]}]"
                   for a, b, who in comp["spans"])
    failed = f", {comp['tool_failures']} failed" if comp["tool_failures"] else ""
    return f"{text!r}  ({comp['turns']} turns, {comp['tool_calls']} tool calls{failed})"


def _fmt(value) -> str:
    return "None" if value is None else f"{value:.3f}"
