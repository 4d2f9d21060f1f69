"""Typed, frozen configuration: one dataclass per concern, flat plain-named keys.

Every key is unique across the sections, so a YAML file and `key=value` overrides stay flat:
`grpo train run.yaml group_size=16 lr=1e-5`. The defaults are the built-in demo: a tiny model, cold
start on the `largest` task's demonstrations, then GRPO. The string under each field is its help
text; `grpo train --help` reads it from here.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import math
import re
import textwrap
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from grpo.presets import ALGORITHMS


class ConfigError(ValueError):
    """A bad key or value; the message names the key and says what to do."""


@dataclass(frozen=True)
class ModelConfig:
    model: str = "tiny"
    """Hugging Face model directory or hub name; `tiny` builds a small model with no download."""
    chat_template: str = "auto"
    """`auto` wraps prompts in the tokenizer's chat template when it has one; `required` always
    does and stops with an error when the tokenizer has none; `none` never does. A Jinja template
    (text holding `{`), or the path of a file holding one (`chat.jinja`), replaces the tokenizer's
    own and is always used; it is saved with the tokenizer in `final/`."""
    dtype: str = "float32"
    """Parameter dtype: float32, bfloat16 or float16."""
    lora_r: int = 0
    """LoRA rank (needs peft: `pip install -e '.[lora]'` in a clone of grpo); 0 trains every weight. With LoRA the reference
    model is the policy at the start of GRPO with the adapter switched off, not a second copy: a
    cold start (`sft_steps`) trains the adapter, which is then merged into the base (and kept in
    OUTPUT_DIR/cold_start) under a fresh adapter that GRPO trains. `model=` a LoRA adapter
    directory loads it merged into its base; with lora_r a fresh adapter goes on top."""
    lora_alpha: float = 16.0
    """LoRA scaling numerator: the adapter's update is scaled by lora_alpha / lora_r."""
    lora_target_modules: list[str] = field(default_factory=lambda: [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    """Names of the linear layers that get an adapter."""
    lora_merge: bool = False
    """With LoRA, also write the merged model (base + adapter) to OUTPUT_DIR/final/merged. Not
    needed to evaluate or go on from a run: `model=OUTPUT_DIR/final` (the adapter, which records
    its base) loads the two merged."""
    train_vision: bool = False
    """A vision-language model's image encoder (vision tower) trains too; by default it is frozen
    and the reference model shares it. The projector and the language model train either way."""


@dataclass(frozen=True)
class DataConfig:
    task: str = "largest"
    """Built-in task (largest, addition, countdown, calculator, shapes) used when `dataset` is
    empty; brings its own reward (and calculator, an agent task, its tool)."""
    dataset: str = ""
    """A JSONL, Parquet or CSV file (or hub dataset name) of training prompts; overrides `task`."""
    dataset_config: str = ""
    """Configuration of a hub dataset or dataset directory (GSM8K's `main`); empty for none."""
    dataset_split: str = "train"
    """Split of `dataset` when it is a hub dataset or a dataset directory."""
    eval_dataset: str = ""
    """Held-out file or dataset for evaluation, read whenever it is set (with or without `dataset`;
    a missing file is an error); empty uses the task's held-out split, or none with `dataset`. A hub
    dataset or directory takes `dataset_config` and `eval_split`. eval/accuracy scores its rows
    with code_tests when that is the first reward, else math_accuracy (its golds checked at load);
    in a run on an environment's reward alone, with that reward."""
    eval_split: str = "test"
    """Split of `eval_dataset` when it is a hub dataset or a dataset directory."""
    prompt_column: str = ""
    """Dataset column that holds the prompt: text, or a list of {role, content} chat messages (put
    through the chat template). Empty: the one of prompt, problem, question, text, question_content
    and description the dataset has (two of the first three is an error that asks which)."""
    answer_column: str = "answer"
    """Dataset column with the reference answer, passed to reward functions as `answer` (a bare
    value, GSM8K's `#### n`, or a worked solution whose last \\boxed{} is the gold); when absent,
    MATH's `solution` is used."""
    tests_column: str = "tests"
    """Dataset column with a row's tests for code_tests, passed as `tests`. Without it, HumanEval's
    `test`, MBPP's `test_list`, APPS's `input_output` and CodeContests/LiveCodeBench test columns
    are read as they are (docs/guides/code-rewards.md)."""
    entry_point_column: str = "entry_point"
    """Dataset column with the function a HumanEval-style `check(candidate)` test is called with."""
    image_column: str = ""
    """Dataset column with each row's image or list of images (file paths relative to the dataset,
    `datasets`' Image feature, bytes); empty uses `images` or `image` when present. Needs a
    vision-language model (docs/guides/vision.md)."""
    system_prompt: str = ""
    """System message placed before each prompt when a chat template is used."""
    long_prompts: str = "error"
    """A prompt whose tokens plus max_new_tokens exceed the model's context: `error` stops at load
    naming the row and counting them all; `skip` leaves such rows out and counts them (said louder
    when that is most of them; held-out ones are logged as `eval/skipped_long_prompts`, never
    counted in `eval/rows`). Prompts are never truncated."""
    eval_size: int = 0
    """Held-out prompts scored at each evaluation, the first N of them; 0 scores every row of
    `eval_dataset`, and the first 200 of a built-in task's held-out split. A cut is said when the
    evaluation starts and logged as `eval/n` of `eval/rows`."""


@dataclass(frozen=True)
class AgentConfig:
    tools: list[str] = field(default_factory=list)
    """Tools the policy may call in multi-turn episodes: built-ins (calculator, python) or
    `module:function` (type hints and a docstring make its schema); empty uses the task's own."""
    environment: str = ""
    """A stateful environment per episode: a built-in (guess_number) or `module:Class` with
    reset(row) and step(text) (docs/guides/agents.md); its public methods are tools too."""
    tool_format: str = "plain"
    """How calls are written and parsed: `plain` (<call>NAME ARGS</call>, results in
    <result>..</result>) or `hermes` (<tool_call>{"name", "arguments"}</tool_call>, Qwen2.5 style;
    results go through the chat template as `tool` messages when it has that role)."""
    max_turns: int = 4
    """Model turns per episode (with tools or an environment)."""
    turn_tokens: int = 0
    """Tokens the model may write in one turn; 0 = max_new_tokens. A turn cut there is answered
    (its calls, else the environment) and the episode goes on."""
    episode_tokens: int = 0
    """Every token after the prompt, the model's and the tools' and environment's; 0 = max_turns x
    (turn_tokens + 64). An episode that reaches a limit is truncated."""
    tool_deadline_s: float = 5.0
    """Deadline of each tool call and environment reset/step; an overrun is answered with an error."""
    turn_rewards: bool = False
    """Advantages from the environment's per-turn rewards (DeepSeekMath 4.1.3 process supervision:
    each turn's normalized reward credited to the tokens before it), the reward functions' total
    added to the last turn (in a truncated episode, the cut turn: the environment gave it no reward
    of its own); false gives every token the episode's outcome advantage."""


@dataclass(frozen=True)
class EvalConfig:
    eval_samples: int = 1
    """n: completions per held-out prompt. 1 decodes greedily; more sample at eval_temperature and
    report pass@1 as the mean over the samples, with its spread."""
    eval_temperature: float = 1.0
    """Sampling temperature of the held-out completions when eval_samples > 1."""
    eval_k: list[int] = field(default_factory=list)
    """k values for pass@k (the unbiased estimator of Chen et al. 2021) and maj@k (majority vote
    over the first k samples' extracted answers); each at most eval_samples. Both count a
    completion right when its score is 1, so they are logged only when every score is 0 or 1; a
    graded reward (0.5, 2.0) gets pass@1, its mean, alone, and `grpo eval` says why."""
    eval_output: str = ""
    """`grpo eval` and `grpo score`: the per-row results as JSONL (or --out FILE); empty writes
    them beside what was evaluated: RUN_DIR/eval.jsonl for a run, NAME-eval.jsonl beside a model
    directory NAME (./NAME-eval.jsonl for a hub model), FILE-score.jsonl beside a scored FILE, or
    OUTPUT_DIR/eval.jsonl (score.jsonl) when output_dir is given. A file replaced is said. During
    training each evaluation writes OUTPUT_DIR/eval/step-N.jsonl."""
    eval_rewards: list[str] = field(default_factory=list)
    """Reward functions `eval/accuracy` scores held-out completions with, named as in `rewards`
    (built-ins, `module:function`, ...); pass@k and maj@k use the first (when its scores are 0
    or 1), and each one's mean is
    logged as `eval/reward/NAME/mean`. Empty: code_tests when it is the first reward, an
    environment's episode reward when it is the only one, math_accuracy for rows from a file, else
    the task's own reward."""


@dataclass(frozen=True)
class SamplingConfig:
    group_size: int = 8
    """G: completions sampled per prompt."""
    prompts_per_step: int = 16
    """B: prompts per step; a step samples B*G completions."""
    max_new_tokens: int = 8
    """Longest completion in tokens; longer ones are cut and counted in `completion/truncated_frac`.
    The run says at start when most of the data's reference answers (its `completion`,
    `canonical_solution` or `answer` column) are longer."""
    temperature: float = 1.0
    """Sampling temperature for the group (evaluation is greedy)."""
    top_p: float = 1.0
    """Nucleus sampling threshold for the group."""
    top_k: int = 0
    """Sample from the k most likely tokens only (0: all). The training log-probs cut the same
    tokens, as for `top_p`, so pi_old is the distribution that sampled; top_k=1 is greedy."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the most likely token's (0: none); cut
    after top_k and top_p, as transformers does, and in the training log-probs too."""
    repetition_penalty: float = 1.0
    """Penalize tokens already in the prompt or the completion so far: a positive logit is
    divided by it, a negative one multiplied (transformers' and vLLM's rule; 1: none, above 1:
    fewer repeats). The training log-probs penalize the same tokens at each position, so pi_old is
    the distribution that sampled. Evaluation measures the model's own distribution, unpenalized."""
    stop: list[str] = field(default_factory=list)
    """Strings that end a completion as EOS does. The completion keeps the stop string: it runs
    to the token that completes it, and its text, mask and log-probs hold those tokens (vLLM's
    include_stop_str_in_output=True)."""
    sampler: str = "hf"
    """Generation engine: `hf` (the model's own forward with a KV cache, any device) or `vllm`
    (GPUs; `pip install -e '.[vllm]'` in a clone of grpo), colocated in the training process."""
    vllm_gpu_memory_utilization: float = 0.3
    """sampler=vllm: the fraction of GPU memory the engine takes for its weights and KV cache."""
    vllm_sleep: bool = True
    """sampler=vllm: free the engine's memory during the policy update and wake it after."""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal and sample more prompts until the step is full."""
    max_sampling_rounds: int = 3
    """With dynamic_sampling, at most this many extra rounds of sampling per step."""


@dataclass(frozen=True)
class RewardConfig:
    rewards: list[str] = field(default_factory=list)
    """Reward functions: built-in names, `module:function`, `model:DIR` (a reward model) or an
    http(s) URL (a reward server). Empty: with `environment`, the environment's episode reward
    alone; else with `dataset`, math_accuracy; else the task's own reward. An environment's reward
    is always added; the run prints the rewards it uses and config.yaml lists them."""
    reward_weights: list[float] = field(default_factory=list)
    """One weight per reward function; empty weighs each 1.0. The reward is the weighted sum."""
    partial_credit: bool = False
    """code_tests: the fraction of tests passed, instead of 1 only when all pass."""
    code_timeout_s: float = 5.0
    """code_tests: wall-clock deadline per program (the CPU limit is the same, rounded up)."""
    code_workers: int = 2
    """code_tests: programs run in parallel."""
    unsafe_code_execution: bool = False
    """code_tests: run programs even where the sandbox cannot isolate them (docs/sandbox.md)."""
    unscorable: str = "any"
    """When a row is unscorable (left out of its group, advantage 0, counted in reward/unscorable):
    `any` when any reward function returns None for it; `all` only when every one does, and
    otherwise its reward is the weighted sum over the functions that scored it (None counted as
    missing, as TRL's nansum): for datasets that mix tasks, each function scoring its own rows."""
    reward_on_error: str = "raise"
    """When a reward function raises: `raise` stops naming it and the sample; `skip` marks the
    sample unscorable (left out of its group, counted in reward/unscorable). A reward server that
    fails a batch (timeout, HTTP error, an answer that is not rewards) stops the run naming the
    server and what it answered, or, with `skip`, leaves the batch unscorable, counted by cause in
    reward/<fn>/error/<cause>."""
    reward_server_timeout_s: float = 60.0
    """A reward server's deadline per call: connecting, sending, reading its whole answer and
    every retry (of a refused or reset connection, or a 5xx answer) end within it."""


@dataclass(frozen=True)
class LossConfig:
    beta: float = 0.04
    """KL penalty coefficient toward the reference model; 0 loads no reference model at all."""
    epsilon: float = 0.2
    """Lower clip range: rho is clipped below at 1 - epsilon. With loss_type=cispo it is 1.0 unless
    set explicitly: no lower bound on the IS weight, as in the CISPO paper."""
    epsilon_high: float = 0.0
    """Upper clip range: rho is clipped above at 1 + epsilon_high; 0 means equal to `epsilon`."""
    advantage_eps: float = 1e-4
    """eps in A = (r - mean) / (std + eps)."""
    advantage: str = "group_norm"
    """Advantage estimator: group_norm (GRPO), group_mean (Dr. GRPO), batch_norm, rloo,
    reinforce_pp (REINFORCE++: per-token return r - beta * sum of the later tokens' KL when
    kl_in_reward=true, normalized over the whole batch's tokens), reinforce_pp_baseline (the same
    from r - mean of the group)."""
    reinforce_pp_batch_norm: bool = True
    """reinforce_pp, reinforce_pp_baseline: normalize the advantages by the mean and std of every
    token of the batch, every process's (the paper's global normalization); false keeps them raw."""
    loss_type: str = "clip"
    """Policy loss: clip (GRPO/DAPO), dual_clip, gspo (sequence ratio; GSPO-token with per-token
    advantages), cispo (IS weight clipped above at 1 + epsilon_high, stop-gradient), sapo (a soft
    sigmoid gate in place of the clip; sapo_tau_pos, sapo_tau_neg), gmpo (geometric mean of the
    token terms; epsilon and epsilon_high are then its clip range in log space), clip_cov (rho * A,
    detached on a random clip_cov_fraction of the tokens whose covariance of log-prob and advantage
    is in [clip_cov_low, clip_cov_high]), kl_cov (rho * A, minus kl_cov_coef * |log rho| on the
    kl_cov_fraction of tokens of highest covariance). clip_cov and kl_cov use no clip range."""
    clip_cov_fraction: float = 2e-4
    """clip_cov: r, the share of the batch's tokens whose gradient is detached (the paper's 2e-4;
    floor(r * tokens) of them, so a batch of fewer than 1 / r tokens selects none)."""
    clip_cov_low: float = 1.0
    """clip_cov: the lowest covariance a token may have to be selected (the paper's 1)."""
    clip_cov_high: float = 5.0
    """clip_cov: the highest covariance a token may have to be selected (the paper's 5)."""
    kl_cov_fraction: float = 2e-3
    """kl_cov: k, the share of the batch's tokens of highest covariance that get the KL term (the
    paper's 2e-3 for 7B models, 2e-4 for 32B)."""
    kl_cov_coef: float = 1.0
    """kl_cov: the coefficient of |log pi_theta - log pi_old| on the selected tokens (the paper's 1)."""
    sapo_tau_pos: float = 1.0
    """sapo: the gate's temperature on tokens with a positive advantage (the paper's 1.0)."""
    sapo_tau_neg: float = 1.05
    """sapo: the gate's temperature on the others; larger fades their gradient faster (1.05)."""
    aggregation: str = "sequence_mean"
    """Token weighting: sequence_mean (GRPO), token_mean (DAPO), constant (Dr. GRPO), sequence_sum."""
    clip_c: float = 3.0
    """dual_clip: for negative advantages the objective is at least clip_c * A (clip_c > 1)."""
    kl_estimator: str = "k3"
    """KL(pi || pi_ref) estimator per token: k1, k2 or k3. k1 only with kl_in_reward=true (or
    beta=0): as a loss term its expected gradient is 0, so it is refused."""
    kl_in_reward: bool = False
    """Subtract beta * (sum of per-token KL) from each reward (PPO-RLHF) instead of a loss term."""
    mask_truncated: bool = False
    """DAPO overlong filtering: completions cut at max_new_tokens take no part in the loss."""
    overlong_buffer: float = 0.0
    """DAPO soft overlong punishment: a linear penalty over the last fraction of max_new_tokens (in
    multi-turn runs, of episode_tokens, counting every token after the prompt); 0 off."""
    overlong_penalty: float = 1.0
    """The penalty at max_new_tokens when overlong_buffer is on."""
    tis_cap: float = 0.0
    """Truncated importance sampling: weigh each token by min(pi_old / pi_sampler, cap); 0 off
    (the same as correction=tis with correction_cap=CAP)."""
    correction: str = "none"
    """Off-policy correction of the sampler's policy (pi_behaviour) against the trainer's (pi_old,
    or with async_steps and proximal=decoupled, pi_prox), a weight on each token's surrogate: none,
    is (the plain ratio), tis (truncated), token_mis or seq_mis (masked importance sampling: the
    token's or the sequence's ratio, 0 above the cap), icepop (the ratio, 0 outside [1/cap, cap]),
    geo_mask (a sequence whose geometric-mean ratio is outside [1/cap, cap] is masked); the lower
    end is correction_cap_low where that is set."""
    correction_cap: float = 2.0
    """The correction's threshold C (above 1)."""
    correction_cap_low: float = 0.0
    """The correction's lower threshold on the ratio, below 1: token_mis and seq_mis also mask a
    ratio below it, icepop and geo_mask keep [correction_cap_low, correction_cap] (verl's
    rollout_rs_threshold_lower; IcePop's band [0.5, 5] is correction=icepop correction_cap_low=0.5
    correction_cap=5). 0: each method's own, none for token_mis and seq_mis, 1 / correction_cap for
    icepop and geo_mask. is and tis weigh, they mask nothing, so they take none."""


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 5e-4
    """AdamW learning rate after warmup. The default is the demo's, for its tiny model trained
    from scratch; a pretrained model wants about 1e-6 (a run with this default on a model of over
    20M parameters says so at start), and a run whose entropy collapses says so in its progress
    line (docs/guides/troubleshooting.md)."""
    lr_schedule: str = "constant"
    """After warmup: `constant` or `cosine` (decays to 0 at the last step)."""
    warmup_steps: int = 0
    """Steps of linear learning-rate warmup from 0."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global norm; 0 turns clipping off."""
    num_iterations: int = 1
    """mu: policy updates per batch of rollouts, with the old log-probs held fixed."""
    max_skipped_updates: int = 3
    """Updates with a non-finite loss or gradient are skipped and counted; more than this many in a
    row stop the run with an error."""
    micro_batch_size: int = 256
    """Most completions per forward/backward pass; gradients accumulate to the same total."""
    mixed_precision: str = "no"
    """`bf16`: the trainer's forward and backward compute in bfloat16 (autocast) while weights,
    gradients and AdamW's moments stay float32 (`dtype=float32`); under `parallel=fsdp`,
    FSDP2's MixedPrecisionPolicy (bfloat16 parameters in compute, float32 gradient reduction).
    The output head's log-probs are float32 either way. `no`: compute in the weights' dtype.
    The recommended GPU setting is dtype=float32 mixed_precision=bf16 (docs/performance.md)."""
    gradient_checkpointing: bool = False
    """Activation checkpointing per decoder layer in the gradient passes: each layer keeps only its
    input and is recomputed in the backward (about a third more compute, activation memory of one
    layer instead of all). The gradient is the same (tested). For long completions."""
    micro_batch_tokens: int = 0
    """Most padded tokens (rows x longest prompt+completion) per forward/backward pass; 0 = about
    2^20 / hidden_size on a CPU (8,192 at hidden 128, 2,048 at 512), 2^22 / hidden_size on a GPU.
    Rows are sorted by length first, so ragged batches pad little. Larger passes waste less time
    per call; smaller ones need less memory. A row longer than the budget goes alone: one row per
    pass, whatever its length (with gradient_checkpointing for completions of many thousands of
    tokens; no pass holds a [tokens x tokens] or [tokens x vocabulary] tensor)."""


@dataclass(frozen=True)
class RunConfig:
    steps: int = 300
    """GRPO steps (each: sample, score, normalize, mu updates)."""
    sft_steps: int = 10
    """Cold-start supervised steps on the task's demonstrations (a dataset's `completion` column)
    before GRPO; 0 skips it. With `dataset` it is 0 unless set: the demo's 10 steps are for the
    built-in tasks."""
    sft_lr: float = 1e-3
    """Learning rate of the cold-start supervised steps."""
    sft_batch_size: int = 32
    """Examples per cold-start supervised step."""
    ref_reset_every: int = 0
    """Steps per outer iteration: the reference model is refreshed from the policy this often; 0 never."""
    ref_update_rate: float = 1.0
    """alpha of a reference refresh: ref <- alpha * policy + (1 - alpha) * ref; 1 is a hard reset."""
    eval_every: int = 20
    """Evaluate on held-out prompts every this many steps, and at step 0 and the end; 0 turns it off."""
    save_every: int = 50
    """Write a checkpoint (`checkpoints/step-N/`: model, optimizer, scheduler, data position,
    random states) this often and at the last step; 0 writes none but `final/` (and one on
    SIGTERM or Ctrl-C)."""
    keep_last: int = 2
    """Checkpoints kept: older ones are deleted once a newer one is written; 0 keeps all."""
    resume: str = ""
    """`auto` continues from the newest checkpoint in output_dir whose checksums verify (older ones
    if it does not); a `checkpoints/step-N` path continues from that one; empty starts afresh and
    refuses an output_dir that already holds a run."""
    seed: int = 0
    """Seed for data order, sampling and initialisation; the same seed gives the same numbers."""
    output_dir: str = "runs/demo"
    """Run directory for config, metrics, samples, TensorBoard events, checkpoints and plots."""
    push_to_hub: str = ""
    """A hub repo id (`user/name`): at the end of the run `final/` is uploaded to it (created
    private if it does not exist), with huggingface_hub's `upload_folder`. Needs a token (HF_TOKEN
    or `hf auth login`), checked at start; HF_ENDPOINT picks another hub."""
    algorithm: str = "grpo"
    """Preset that sets several keys at once (see `grpo explain --overview`); explicit keys win over it."""
    threads: int = 0
    """Torch CPU threads; 0 leaves torch's default."""
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Trackers: TensorBoard events are always written (OUTPUT_DIR/tb); add `wandb` and/or `mlflow`
    (installed separately) to log the same metrics there too."""
    log_every: int = 1
    """Print the progress line (step, reward, KL, accuracy, time left) every this many steps; on a
    terminal a live bar with the time left is drawn as well."""
    parallel: str = "ddp"
    """With several processes (torchrun): `ddp` keeps a whole model on every process and sums
    gradients; `fsdp` shards parameters, gradients and optimizer state with FSDP2 (fully_shard)."""


@dataclass(frozen=True)
class PipelineConfig:
    async_steps: int = 0
    """Asynchronous GRPO: rollout workers sample while the trainer updates, and the groups trained
    at step t are sampled from the weights after step t-1-k exactly (k = async_steps), with step t's
    draws, whatever the timing, so a run repeats and resumes bit for bit. 0: the synchronous loop."""
    rollout_workers: int = 1
    """With async_steps: rollout worker processes per trainer process, each sampling and scoring an
    equal share of every step's groups (N give what 1 gives); 0 samples in the trainer itself from
    the lagged weights (the same groups, without the overlap)."""
    proximal: str = "behaviour"
    """With async_steps, pi_old of the update: behaviour (the log-probs each token was drawn with,
    standard off-policy PPO) or decoupled (AReaL's objective: pi_prox, the trainer's weights before
    the update, with each token's clipped term weighted by pi_prox / pi_behaviour via correction)."""
    transfer_timeout_s: float = 1800.0
    """Longest wait for a step's groups once the trainer needs them, and for any one transfer
    between trainer and rollout worker, before the run stops with an error naming the peer, the
    step and the tensor. (A worker waits for the trainer's next weights as long as it lives.)"""
    trainer_threads: int = 0
    """With async_steps: torch threads of the trainer process; 0 shares the cores (`threads`, or
    all) evenly between the trainer and its rollout workers."""
    worker_threads: int = 0
    """With async_steps: torch threads of each rollout worker; 0 shares the cores evenly."""
    worker_restarts: int = 3
    """A rollout worker that dies is replaced and its groups re-sampled (the same draws and weight
    version); the run stops after this many replacements."""


SECTIONS = (ModelConfig, DataConfig, SamplingConfig, RewardConfig, LossConfig, OptimConfig, RunConfig,
            EvalConfig, AgentConfig, PipelineConfig)

# name -> keys it sets. Explicit keys from the file or command line override a preset.
@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)

    def flat(self) -> dict:
        """Every key and its value, as written in a YAML file."""
        sections = [getattr(self, s.name) for s in dataclasses.fields(self)]
        return {f.name: getattr(section, f.name)
                for section in sections for f in dataclasses.fields(section)}


def _section_of() -> dict[str, tuple[str, dataclasses.Field, type]]:
    """key -> (section attribute, field, section class)."""
    hints = {cls: typing.get_type_hints(cls) for cls in SECTIONS}
    out = {}
    for sfield in dataclasses.fields(TrainConfig):
        cls = sfield.default_factory
        for f in dataclasses.fields(cls):
            out[f.name] = (sfield.name, f, hints[cls][f.name])
    return out


KEYS = _section_of()


def field_docs() -> dict[str, str]:
    """key -> the docstring written under its field."""
    docs = {}
    for cls in SECTIONS:
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
        for node, nxt in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


# Names that users bring from TRL's GRPOConfig and transformers' TrainingArguments, and what each
# is here: the key that holds the same setting, or why no key does. They stay unknown keys (the
# config is strict); the error says the right name instead of the nearest spelling.
_PER_STEP = ("a step samples prompts_per_step prompts with group_size completions each, so set "
             "those two (micro_batch_size or micro_batch_tokens split the step's passes)")
FOREIGN_KEYS = {
    "learning_rate": "lr", "num_generations": "group_size", "max_completion_length": "max_new_tokens",
    "max_steps": "steps", "lr_scheduler_type": "lr_schedule", "logging_steps": "log_every",
    "save_steps": "save_every", "save_total_limit": "keep_last", "eval_steps": "eval_every",
    "model_name_or_path": "model", "dataset_name": "dataset", "dataset_train_split": "dataset_split",
    "dataset_test_split": "eval_split", "reward_funcs": "rewards", "torch_dtype": "dtype",
    "mask_truncated_completions": "mask_truncated", "ref_model_sync_steps": "ref_reset_every",
    "ref_model_mixup_alpha": "ref_update_rate", "epsilon_low": "epsilon", "target_modules":
    "lora_target_modules",
    "num_train_epochs": "has no equivalent here: steps counts GRPO steps of prompts_per_step "
                        "prompts each (an epoch of the dataset is its rows / prompts_per_step steps)",
    "per_device_train_batch_size": f"has no single equivalent here: {_PER_STEP}",
    "gradient_accumulation_steps": f"has no equivalent here: {_PER_STEP}, and a step's gradients "
                                   "are summed over its passes before its one optimizer step",
    "generation_batch_size": f"has no equivalent here: {_PER_STEP}",
    "per_device_eval_batch_size": "has no equivalent here: evaluation batches itself; eval_size "
                                  "sets how many held-out prompts are scored",
    "max_prompt_length": "has no equivalent here: prompts are never truncated; long_prompts=skip "
                         "leaves out those that do not fit the model's context",
    "warmup_ratio": "has no equivalent here: warmup_steps counts steps",
    "use_vllm": "has no equivalent here: set sampler=vllm",
    "bf16": "has no equivalent here: set mixed_precision=bf16 (or dtype=bfloat16)",
    "use_peft": "has no equivalent here: set lora_r=N (N > 0 trains a LoRA adapter)",
    "scale_rewards": "has no equivalent here: advantage=group_norm scales by the group's std, "
                     "group_mean (Dr. GRPO) does not",
    "sync_ref_model": "has no equivalent here: ref_reset_every=N refreshes the reference every N "
                      "steps (ref_update_rate sets how far)",
    "vllm_importance_sampling_cap": "tis_cap",
    "importance_sampling_level": "has no equivalent here: loss_type=gspo takes the sequence's ratio",
    # verl's names (the last part of its nested keys), and the few that only a path makes clear
    "kl_coef": "beta", "kl_loss_coef": "beta", "use_kl_in_reward": "kl_in_reward",
    "kl_loss_type": "kl_estimator", "clip_ratio": "epsilon", "clip_ratio_low": "epsilon",
    "clip_ratio_high": "epsilon_high", "clip_ratio_c": "clip_c", "ppo_epochs": "num_iterations",
    "loss_agg_mode": "aggregation", "adv_estimator": "advantage", "grad_clip": "max_grad_norm",
    "lr_warmup_steps": "warmup_steps", "total_training_steps": "steps", "train_batch_size":
    "prompts_per_step", "ppo_micro_batch_size_per_gpu": "micro_batch_size", "max_response_length":
    "max_new_tokens", "gpu_memory_utilization": "vllm_gpu_memory_utilization", "lora_rank": "lora_r",
    "train_files": "dataset", "val_files": "eval_dataset", "prompt_key": "prompt_column",
    "save_freq": "save_every", "test_freq": "eval_every", "default_local_dir": "output_dir",
    "rollout_is_threshold": "correction_cap", "rollout_rs_threshold": "correction_cap",
    "rollout_rs_threshold_lower": "correction_cap_low", "model.path": "model", "model.name": "model",
    "rollout.n": "group_size",
    "total_epochs": "has no equivalent here: steps counts GRPO steps of prompts_per_step prompts each",
    "ppo_mini_batch_size": f"has no equivalent here: {_PER_STEP}, and num_iterations sets the "
                           "updates per batch",
    "use_kl_loss": "has no equivalent here: beta > 0 is a KL loss term, kl_in_reward=true puts the "
                   "KL in the reward instead",
    "entropy_coeff": "has no equivalent here: there is no entropy bonus (the entropy is logged)",
}


def _ours(path: str) -> str | None:
    """Our key for a name, dotted or not, as another tool nests it: `actor.optim.lr` -> `lr`,
    `actor_rollout_ref.rollout.n` -> `group_size`; None when no key holds it."""
    parts = path.split(".")
    for i in range(len(parts)):                     # the longest known ending wins
        name = ".".join(parts[i:])
        if name in KEYS:
            return name
        if FOREIGN_KEYS.get(name) in KEYS:
            return FOREIGN_KEYS[name]
    return None


def _explain_unknown(key: str) -> str:
    """What an unknown key most likely meant: a key's other name, a section, or the nearest key,
    the nearest among our keys and the names other tools give them."""
    if "." in key:
        ours = _ours(key)
        return (f"the config is flat: write '{ours}'" if ours else
                f"the config is flat, and no key here holds '{key.rsplit('.', 1)[1]}'")
    if key in FOREIGN_KEYS:
        known = FOREIGN_KEYS[key]
        return f"it is called '{known}' here" if known in KEYS else f"it {known}"
    sections = {cls.__name__.removesuffix("Config").lower(): cls for cls in SECTIONS}
    if key in sections and key not in KEYS:
        names = [f.name for f in dataclasses.fields(sections[key])]
        return (f"it is a section name, not a key: keys are flat, so write {key}'s keys "
                f"({', '.join(names)}) at the top level, as `{names[0]}: ...`")
    def nearest(names):
        found = difflib.get_close_matches(key, names, n=1, cutoff=0.0)
        return found[0], difflib.SequenceMatcher(None, key, found[0]).ratio()
    near, score = nearest(list(KEYS))
    aliases = [name for name, known in FOREIGN_KEYS.items() if known in KEYS and "." not in name]
    alias, alias_score = nearest(aliases)
    if alias_score > score:                         # learnig_rate: learning_rate, which is lr
        return f"the nearest valid key is '{FOREIGN_KEYS[alias]}' ('{alias}' is called " \
               f"'{FOREIGN_KEYS[alias]}' here)"
    return f"the nearest valid key is '{near}'"


def nested_section_error(key: str, value: dict) -> ConfigError:
    """A mapping under a key (verl's `actor_rollout_ref:`, `model: {path: ...}`): the config is
    flat; the error names our key for each name inside it that has one."""
    def leaves(mapping, prefix=""):
        for name, inner in mapping.items():
            if isinstance(inner, dict) and inner:
                yield from leaves(inner, f"{prefix}{name}.")
            else:
                yield f"{prefix}{name}"
    said = []
    for path in leaves(value):
        ours = _ours(f"{key}.{path}")
        said.append(f"'{path}' as '{ours}'" if ours else f"'{path}' is not a key here")
    more = f", and {len(said) - 12} more" if len(said) > 12 else ""
    return ConfigError(f"config key '{key}' holds a nested section, and the config is flat: write "
                       f"each key at the top level: {', '.join(said[:12])}{more} "
                       "(`grpo train --help` lists them all)")


def unknown_keys_error(keys: list[str]) -> ConfigError:
    """One error for every unknown key, each with what it most likely meant."""
    if len(keys) == 1:
        what = _explain_unknown(keys[0])
        sep = "; " if what.startswith("the nearest") else ": "
        return ConfigError(f"unknown config key '{keys[0]}'{sep}{what} "
                           "(`grpo train --help` lists them all)")
    parts = "; ".join(f"'{k}': {_explain_unknown(k)}" for k in keys)
    return ConfigError(f"{len(keys)} unknown config keys: {parts}. `grpo train --help` lists them all")


def _coerce(key: str, value, hint):
    """Check `value` against the field's type; the error names the key and the expected type."""
    def bad(expected: str):
        return ConfigError(f"config key '{key}' expects {expected}, got {value!r}")

    if hint is bool:
        if isinstance(value, bool):
            return value
        raise bad("true or false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise bad("an integer")
    if hint is float:
        if isinstance(value, str):  # YAML reads 1e-5 as a string
            try:
                value = float(value)
            except ValueError:
                raise bad("a number") from None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        raise bad("a finite number")
    if hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise bad("a string")
    if typing.get_origin(hint) is list:
        (inner,) = typing.get_args(hint)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value] if value != "" else []
        if not isinstance(value, list):
            raise bad("a list such as [a,b]")
        return [_coerce(key, v, inner) for v in value]
    raise TypeError(f"unsupported config type {hint} for {key}")  # a bug in this module


def parse_overrides(args: list[str]) -> dict:
    """`key=value` strings -> {key: value}, values read as YAML scalars or flow lists."""
    out = {}
    for arg in args:
        key, sep, raw = arg.partition("=")
        if not sep or not key:
            raise ConfigError(f"expected key=value, got '{arg}'")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


class _Twice(Exception):
    def __init__(self, key, first: int, again: int):
        self.key, self.first, self.again = key, first, again


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if isinstance(key, typing.Hashable) and key in seen:
                    raise _Twice(key, seen[key], line)
                if isinstance(key, typing.Hashable):
                    seen[key] = line
        return super().construct_mapping(node, deep)


def load_yaml(path: str | Path) -> dict:
    """A flat YAML mapping of keys; errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.load(path.read_text(), Loader=_StrictLoader) or {}
    except _Twice as e:
        raise ConfigError(f"{path}:{e.again}: config key '{e.key}' is given twice (lines {e.first} "
                          f"and {e.again}); keep one") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of key: value")
    return data


def build_config(values: dict | None = None) -> TrainConfig:
    """Defaults, then the `algorithm` preset, then `values`; every key and type is checked."""
    values = dict(values or {})
    for key, value in values.items():
        if isinstance(value, dict):
            raise nested_section_error(key, value)
    unknown = [key for key in values if key not in KEYS]
    if unknown:
        raise unknown_keys_error(unknown)
    algorithm = values.get("algorithm", RunConfig.algorithm)
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"config key 'algorithm': unknown preset {algorithm!r}; "
                          f"choose one of {sorted(ALGORITHMS)}")
    merged = {**ALGORITHMS[algorithm], **values}
    merged.update(implied_keys(merged, explicit=set(values)))
    per_section: dict[str, dict] = {}
    for key, value in merged.items():
        section, _, hint = KEYS[key]
        per_section.setdefault(section, {})[key] = _coerce(key, value, hint)
    config = TrainConfig(**{s.name: s.default_factory(**per_section.get(s.name, {}))
                            for s in dataclasses.fields(TrainConfig)})
    validate(config)
    return config


VISION_DEMO = {"sft_steps": 20, "steps": 400, "max_new_tokens": 3}


def implied_keys(merged: dict, explicit: set[str]) -> dict:
    """Values that a choice implies for keys the user did not set (presets do not count as set).

    loss_type=cispo: the CISPO paper (MiniMax-M1, arXiv:2506.13585) clips the IS weight above only,
    so unless `epsilon` is set explicitly it becomes 1.0, a lower bound of 1 - 1 = 0 that no ratio
    falls below: the weight is min(ratio, 1 + epsilon_high). An `epsilon_high` of 0 ("equal to
    epsilon") is resolved first, so the upper bound stays where it was.

    dataset=FILE: `sft_steps` becomes 0. The demo's cold start imitates a built-in task's
    demonstrations at the demo's `sft_lr`; a user's data has its own (a `completion` column, or
    none), and a cold start on it is asked for with sft_steps=N.

    task=shapes (the vision demo): the settings of the run the README shows, for keys not set:
    `sft_steps` 20 (the answer format, not yet the counting), `steps` 400, `max_new_tokens` 3.
    """
    out = {}
    if merged.get("dataset") and "sft_steps" not in explicit:
        out["sft_steps"] = 0
    if merged.get("task") == "shapes" and not merged.get("dataset"):
        out.update({k: v for k, v in VISION_DEMO.items() if k not in explicit})
    if merged.get("loss_type") == "cispo" and "epsilon" not in explicit:
        epsilon = merged.get("epsilon", LossConfig.epsilon)
        if not merged.get("epsilon_high", LossConfig.epsilon_high):
            out["epsilon_high"] = epsilon
        out["epsilon"] = 1.0
    return out


@dataclass(frozen=True)
class Bound:
    """The values a numeric key may take: from `low` to `high` (None: no limit above), each end
    included unless `open_low` / `open_high`; `why` follows the error. A list key's every element."""
    low: float
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    why: str = ""

    def holds(self, value) -> bool:
        above = value > self.low if self.open_low else value >= self.low
        below = self.high is None or (value < self.high if self.open_high else value <= self.high)
        return above and below

    def describe(self) -> str:
        def num(x) -> str:
            return str(int(x)) if float(x).is_integer() else f"{x:g}"
        if self.high is None:
            if self.open_low:
                return f"above {num(self.low)}"
            return "0 or more" if self.low == 0 else f"at least {num(self.low)}"
        return (f"in {'(' if self.open_low else '['}{num(self.low)}, {num(self.high)}"
                f"{')' if self.open_high else ']'}")


_COUNT, _AT_LEAST_1, _ABOVE_0 = Bound(0), Bound(1), Bound(0, open_low=True)
_SHARE = Bound(0, 1, why="a share of the batch's tokens")

def sampler_own_keys(sampling) -> list[str]:
    """The sampling keys set away from their defaults that only grpo's own single-turn sampler
    applies (to the sampled and the trained distribution alike); `sampling` is a flat config dict
    or a SamplingConfig."""
    get = sampling.get if isinstance(sampling, dict) else lambda k: getattr(sampling, k)
    return [k for k, off in (("top_k", 0), ("min_p", 0.0), ("repetition_penalty", 1.0), ("stop", []))
            if get(k) != off]


# key -> the range its values must lie in, checked before any other rule; every int and float key
# has an entry here or in UNBOUNDED (a test walks them).
BOUNDS: dict[str, Bound] = {
    "lora_r": _COUNT,
    "lora_alpha": Bound(0, open_low=True, why="the adapter's update is scaled by lora_alpha / lora_r"),
    "eval_size": _COUNT,
    "group_size": Bound(2, why="advantages compare completions of the same prompt, so one has "
                              "nothing to compare with"),
    "prompts_per_step": _AT_LEAST_1,
    "max_new_tokens": _AT_LEAST_1,
    "temperature": Bound(0, open_low=True, why="the logits are divided by it (evaluation is already "
                                                "greedy)"),
    "top_p": Bound(0, 1, open_low=True, why="the probability mass sampled from"),
    "top_k": Bound(0, why="the number of most likely tokens sampled from (0: all)"),
    "min_p": Bound(0, 1, open_high=True, why="a fraction of the most likely token's probability"),
    "repetition_penalty": Bound(0, open_low=True, why="positive logits are divided by it"),
    "vllm_gpu_memory_utilization": Bound(0, 1, open_low=True, open_high=True,
                                         why="a fraction of the GPU's memory"),
    "max_sampling_rounds": _COUNT,
    "code_timeout_s": _ABOVE_0,
    "code_workers": _AT_LEAST_1,
    "reward_server_timeout_s": _ABOVE_0,
    "beta": _COUNT,
    "epsilon": Bound(0, 1, why="rho is clipped below at 1 - epsilon, and no ratio is below 0"),
    "epsilon_high": _COUNT,
    "advantage_eps": Bound(0, why="0 divides by the std alone (a group whose rewards are all "
                                  "equal gets 0 whatever eps)"),
    "clip_cov_fraction": _SHARE,
    "kl_cov_fraction": _SHARE,
    "kl_cov_coef": _COUNT,
    "sapo_tau_pos": Bound(0, open_low=True, why="a gate temperature"),
    "sapo_tau_neg": Bound(0, open_low=True, why="a gate temperature"),
    "clip_c": Bound(1, open_low=True, why="dual_clip bounds a negative advantage's objective below "
                                           "at clip_c * A, beyond the clip at 1 + epsilon_high"),
    "overlong_buffer": Bound(0, 1, open_high=True, why="a fraction of max_new_tokens"),
    "overlong_penalty": _COUNT,
    "tis_cap": _COUNT,
    "correction_cap": Bound(1, open_low=True, why="the correction's upper threshold on the ratio"),
    "correction_cap_low": Bound(0, 1, open_high=True, why="the correction's lower threshold on "
                                                          "the ratio (0: the method's own)"),
    "lr": _COUNT,
    "warmup_steps": _COUNT,
    "weight_decay": _COUNT,
    "max_grad_norm": _COUNT,
    "num_iterations": _AT_LEAST_1,
    "max_skipped_updates": _COUNT,
    "micro_batch_size": _AT_LEAST_1,
    "micro_batch_tokens": _COUNT,
    "steps": _COUNT,
    "sft_steps": _COUNT,
    "sft_lr": _COUNT,
    "sft_batch_size": _AT_LEAST_1,
    "ref_reset_every": _COUNT,
    "ref_update_rate": Bound(0, 1, open_low=True, why="the share of the policy in a reference refresh"),
    "eval_every": _COUNT,
    "save_every": _COUNT,
    "keep_last": _COUNT,
    "seed": Bound(-2**63, 2**64 - 1, why="torch's seeds are 64 bits"),
    "threads": _COUNT,
    "log_every": _AT_LEAST_1,
    "eval_samples": _AT_LEAST_1,
    "eval_temperature": Bound(0, open_low=True, why="the logits are divided by it"),
    "eval_k": _AT_LEAST_1,
    "max_turns": _AT_LEAST_1,
    "turn_tokens": _COUNT,
    "episode_tokens": _COUNT,
    "tool_deadline_s": _ABOVE_0,
    "async_steps": _COUNT,
    "rollout_workers": _COUNT,
    "transfer_timeout_s": _ABOVE_0,
    "trainer_threads": _COUNT,
    "worker_threads": _COUNT,
    "worker_restarts": _COUNT,
}

# numeric keys with no range of their own, and why
UNBOUNDED: dict[str, str] = {
    "clip_cov_low": "a covariance, of either sign; clip_cov_low <= clip_cov_high is checked",
    "clip_cov_high": "a covariance, of either sign; clip_cov_low <= clip_cov_high is checked",
    "reward_weights": "a weight may be negative (a penalty) or 0 (a reward logged, not trained on)",
}


def validate(config: TrainConfig) -> None:
    """Range checks that types alone do not catch."""
    c = config.flat()
    for key, bound in BOUNDS.items():
        for value in c[key] if isinstance(c[key], list) else [c[key]]:
            if not bound.holds(value):
                why = f": {bound.why}" if bound.why else ""
                raise ConfigError(f"config key '{key}' must be {bound.describe()}, got {value}{why}")
    if c["mixed_precision"] not in ("no", "bf16"):
        raise ConfigError(f"config key 'mixed_precision' must be no or bf16, got {c['mixed_precision']!r}")
    if c["mixed_precision"] != "no" and c["dtype"] != "float32":
        raise ConfigError("config key 'mixed_precision': bf16 keeps float32 master weights, so it needs "
                          f"dtype=float32, got dtype={c['dtype']}; use one or the other")
    if c["tool_format"] not in ("plain", "hermes"):
        raise ConfigError(f"config key 'tool_format' must be plain or hermes, got {c['tool_format']!r}")
    bad_k = [k for k in c["eval_k"] if not 1 <= k <= c["eval_samples"]]
    if bad_k:
        raise ConfigError(f"config key 'eval_k': {bad_k} out of range; each k must be from 1 to "
                          f"eval_samples ({c['eval_samples']}): raise eval_samples=N")
    if c["lr_schedule"] not in ("constant", "cosine"):
        raise ConfigError(f"config key 'lr_schedule' must be constant or cosine, got {c['lr_schedule']!r}")
    if c["chat_template"] not in ("auto", "required", "none") and "{" not in c["chat_template"] \
            and not Path(c["chat_template"]).is_file():
        raise ConfigError(f"config key 'chat_template' must be auto, required or none, a Jinja "
                          f"template or the path of a file holding one; {c['chat_template']!r} is "
                          "none of these (no such file)")
    if c["push_to_hub"] and not re.fullmatch(r"[\w.-]+/[\w.-]+", c["push_to_hub"]):
        raise ConfigError(f"config key 'push_to_hub' must be a hub repo id, user/name, got "
                          f"{c['push_to_hub']!r}")
    if "" in c["stop"]:
        raise ConfigError("config key 'stop': an empty stop string would end every completion at "
                          "its first token; remove it")
    cut = sampler_own_keys(c)
    if cut and c["sampler"] != "hf":
        raise ConfigError(f"config key{'s' if len(cut) > 1 else ''} {', '.join(cut)}: grpo's own "
                          "sampler (sampler=hf) applies them to the sampled and the trained "
                          f"distribution alike; sampler={c['sampler']} does not yet. Use sampler=hf, "
                          "or leave them unset")
    if cut and (c["tools"] or c["environment"]):
        raise ConfigError(f"config key{'s' if len(cut) > 1 else ''} {', '.join(cut)}: single-turn "
                          "sampling applies them; multi-turn episodes (tools, environment) do not "
                          "yet. Leave them unset for an agent run")
    if c["long_prompts"] not in ("error", "skip"):
        raise ConfigError(f"config key 'long_prompts' must be error or skip, got {c['long_prompts']!r}")
    if c["dtype"] not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"config key 'dtype' must be float32, bfloat16 or float16, got {c['dtype']!r}")
    if c["kl_estimator"] == "k1" and c["beta"] > 0 and not c["kl_in_reward"]:
        # d k1 / d theta = grad log pi, whose expectation under pi is 0: the term does nothing
        raise ConfigError("config key 'kl_estimator': k1 as a loss term (beta > 0 with "
                          "kl_in_reward=false) has an expected gradient of exactly 0, so it would "
                          "not regularize at all; set kl_in_reward=true to put k1 in the reward "
                          "(PPO-RLHF, RLOO), or kl_estimator=k2 or kl_estimator=k3 for a loss term")
    if c["clip_cov_low"] > c["clip_cov_high"]:
        raise ConfigError(f"config keys 'clip_cov_low' ({c['clip_cov_low']}) and 'clip_cov_high' "
                          f"({c['clip_cov_high']}) bound the covariance of the tokens clip_cov may "
                          "select: the low bound must not be above the high one")
    if c["advantage"] in ("reinforce_pp", "reinforce_pp_baseline") and c["turn_rewards"]:
        raise ConfigError(f"config key 'advantage': {c['advantage']} builds each token's return from "
                          "the outcome and the KL of the later tokens; with turn_rewards=true the "
                          "turns' rewards give per-token advantages of their own. Use one or the other")
    if (c["loss_type"] == "gmpo" and c["advantage"] in ("reinforce_pp", "reinforce_pp_baseline")
            and c["kl_in_reward"] and c["beta"] > 0):
        raise ConfigError(f"config key 'loss_type': gmpo takes one advantage per completion, and "
                          f"advantage={c['advantage']} with kl_in_reward=true gives each token its own "
                          "(the KL of the tokens after it); set kl_in_reward=false, or another loss_type")
    if c["correction"] not in ("none", "is", "tis", "token_mis", "seq_mis", "icepop", "geo_mask"):
        raise ConfigError(f"config key 'correction' must be none, is, tis, token_mis, seq_mis, icepop "
                          f"or geo_mask, got {c['correction']!r}")
    if c["correction_cap_low"] > 0 and (c["correction"] in ("none", "is", "tis")):
        raise ConfigError(f"config key 'correction_cap_low' masks ratios below it, and "
                          f"correction={c['correction']} masks none: choose token_mis, seq_mis, "
                          "icepop or geo_mask, or correction_cap_low=0")
    if c["tis_cap"] > 0 and c["correction"] not in ("none", "tis"):
        raise ConfigError(f"config keys 'tis_cap' and 'correction' ({c['correction']}) both choose a "
                          "correction; keep one (tis_cap=C is correction=tis correction_cap=C)")
    if c["proximal"] not in ("behaviour", "decoupled"):
        raise ConfigError(f"config key 'proximal' must be behaviour or decoupled, got {c['proximal']!r}")
    if c["async_steps"] and c["proximal"] == "behaviour" and c["correction"] != "none":
        raise ConfigError(f"config key 'correction' ({c['correction']}) weighs pi_prox / pi_behaviour, "
                          "and with proximal=behaviour pi_old is the behaviour policy itself: set "
                          "proximal=decoupled to correct, or correction=none")
    if c["async_steps"] and c["tis_cap"] > 0 and c["proximal"] == "behaviour":
        raise ConfigError("config key 'tis_cap' weighs pi_prox / pi_behaviour, and with async_steps and "
                          "proximal=behaviour pi_old is the behaviour policy itself: set "
                          "proximal=decoupled with correction=tis, or tis_cap=0")
    if c["sampler"] not in ("hf", "vllm"):
        raise ConfigError(f"config key 'sampler' must be hf or vllm, got {c['sampler']!r}")
    if c["parallel"] not in ("ddp", "fsdp"):
        raise ConfigError(f"config key 'parallel' must be ddp or fsdp, got {c['parallel']!r}")
    if c["unscorable"] not in ("any", "all"):
        raise ConfigError(f"config key 'unscorable' must be any or all, got {c['unscorable']!r}: "
                          "any (a row is unscorable when any reward function returns None for it) "
                          "or all (only when every one does)")
    if c["reward_on_error"] not in ("raise", "skip"):
        raise ConfigError(f"config key 'reward_on_error' must be raise or skip, got {c['reward_on_error']!r}")
    if c["reward_weights"] and len(c["reward_weights"]) != len(c["rewards"]):
        raise ConfigError(f"config key 'reward_weights' has {len(c['reward_weights'])} weights for "
                          f"{len(c['rewards'])} reward functions in 'rewards'; give one per function")


def load_config(path: str | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """A YAML file (optional) plus `key=value` overrides, the latter winning."""
    values = load_yaml(path) if path else {}
    values.update(parse_overrides(overrides or []))
    return build_config(values)


def _as_yaml(value) -> str:
    """A default as it would be written in a YAML file or on the command line."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def help_text(keys=None, choices: dict[str, list[str]] | None = None) -> str:
    """Every key (or those in `keys`) with its default and meaning, grouped by section; `choices`
    adds a line under a key naming what it takes (the built-in tasks, from their table)."""
    docs = field_docs()
    lines = []
    for cls in SECTIONS:
        fields = [f for f in dataclasses.fields(cls) if keys is None or f.name in keys]
        if fields:
            lines.append(f"{cls.__name__.removesuffix('Config').lower()}:")
        defaults = cls()
        for f in fields:
            default = getattr(defaults, f.name)
            lines.append(f"  {f.name}={_as_yaml(default)}")
            lines.append(textwrap.fill(docs.get(f.name, ""), 96, initial_indent="      ",
                                       subsequent_indent="      "))
            if f.name in (choices or {}):
                lines.append(textwrap.fill(", ".join(choices[f.name]), 96,
                                           initial_indent=f"      {f.name}s: ", subsequent_indent="        "))
    return "\n".join(lines)


def reference_markdown() -> str:
    """docs/config.md: every key, its type, default and meaning, from the dataclasses' docstrings.
    Regenerate with `python -m grpo.config > docs/config.md`; a test checks the file is current."""
    docs = field_docs()
    hints = {cls: typing.get_type_hints(cls) for cls in SECTIONS}
    lines = ["# Configuration reference", "",
             "Generated from the docstrings of `src/grpo/config.py` by `python -m grpo.config > "
             "docs/config.md`; do not edit by hand. Keys are flat: in a YAML file `key: value`, on "
             "the command line `key=value`. `algorithm=NAME` presets set several keys at once; "
             "explicit keys win.", ""]
    for cls in SECTIONS:
        lines += [f"## {cls.__name__.removesuffix('Config').lower()}", "", "| key | type | default | meaning |",
                  "|---|---|---|---|"]
        defaults = cls()
        for f in dataclasses.fields(cls):
            hint = hints[cls][f.name]
            kind = getattr(hint, "__name__", str(hint)).replace("typing.", "")
            if typing.get_origin(hint) is list:
                kind = f"list[{typing.get_args(hint)[0].__name__}]"
            default = _as_yaml(getattr(defaults, f.name))
            if not docs.get(f.name):
                raise ValueError(f"config key '{f.name}' ({cls.__name__}) has no docstring; write "
                                 "one under the field, then regenerate docs/config.md")
            meaning = docs[f.name].replace("|", "\\|")
            lines.append(f"| `{f.name}` | {kind} | `{default}` | {meaning} |")
        lines.append("")
    return "\n".join(lines)


def to_yaml(config: TrainConfig) -> str:
    return yaml.safe_dump(config.flat(), sort_keys=False)


if __name__ == "__main__":
    print(reference_markdown())


__all__ = ["TrainConfig", "ConfigError", "load_config", "build_config", "help_text", "to_yaml",
           "ALGORITHMS", "KEYS"]
