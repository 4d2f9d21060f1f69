"""Run TRL's GRPOTrainer on a prompts file and print one JSON line of measured figures.

Run by `benchmarks/vs_trl.py` and `benchmarks/time_to_accuracy.py` with the Python of an
environment where TRL is installed; it does not import grpo. Prompts arrive as JSON lines
{"prompt": text, "answer": text}, already formatted exactly as grpo formats them, so both
libraries tokenize the same text. The reward is 1 when the completion, stripped, equals the answer
(`--reward exact`), or, for random models, the share of distinct characters in its first 200
(`--reward distinct`, gpu_check's), which varies, so advantages and updates are not 0.

    python trl_driver.py --model DIR --prompts FILE --steps 5 --max-new-tokens 16 [--save DIR]
    python trl_driver.py ... --bf16 --micro-batch 8 --gradient-checkpointing   # on a CUDA GPU

On a CUDA GPU it trains there (else on the CPU); `--bf16` is TrainingArguments' bf16=True (float32
weights, bfloat16 autocast). Besides the step times it reports each step's time inside
`generate` (the split), the peak GPU memory, and the settings TRL ran with.
"""

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time


def peak_rss_kb() -> float:
    """Peak resident memory in KiB (VmHWM: ru_maxrss would also count the launcher's, up to exec)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return float(line.split()[1])
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def force_lengths(model, tokenizer, lengths: list[int]) -> None:
    """Every `generate` call of `model` ends row r with EOS at its token lengths[r % len], and
    never earlier: a logits processor that leaves only EOS at that step and forbids it before."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    eos = tokenizer.eos_token_id

    class Forced(LogitsProcessor):
        def __init__(self, prompt_len: int):
            self.prompt_len = prompt_len

        def __call__(self, input_ids, scores):
            step = input_ids.shape[1] - self.prompt_len          # tokens generated so far
            want = torch.tensor([lengths[r % len(lengths)] for r in range(len(scores))],
                                device=scores.device)
            scores[:, eos] = float("-inf")
            end = want - 1 == step
            scores[end] = float("-inf")
            scores[end, eos] = 0.0
            return scores

    plain = model.generate

    def generate(*a, **kw):
        prompt_len = (kw.get("input_ids") if "input_ids" in kw else a[0]).shape[1]
        kw["logits_processor"] = LogitsProcessorList([Forced(prompt_len)])
        return plain(*a, **kw)
    model.generate = generate


def time_generate(model, spent: list[float]) -> None:
    """Each `generate` call of `model` adds its seconds (the device synchronized) to `spent`."""
    import torch
    plain = model.generate

    def generate(*a, **kw):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        started = time.perf_counter()
        try:
            return plain(*a, **kw)
        finally:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            spent.append(time.perf_counter() - started)
    model.generate = generate


def distinct(completions, **_):
    return [len(set(c[:200])) / 100 for c in completions]


def step_timer(steps: int):
    """A TrainerCallback that times each optimizer step (TRL's own logs time whole intervals)."""
    import torch
    from transformers import TrainerCallback
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self.started = [], 0.0

        def on_step_begin(self, *a, **k):
            sync()
            self.started = time.perf_counter()

        def on_step_end(self, *a, **k):
            sync()
            self.times.append(time.perf_counter() - self.started)
            print(f"trl step {len(self.times)}/{steps} {self.times[-1]:.2f}s", file=sys.stderr)
    return StepTimer()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--max-new-tokens", type=int, required=True)
    ap.add_argument("--prompts-per-step", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--save", default="", help="write the trained model here")
    ap.add_argument("--micro-batch", type=int, default=0,
                    help="completions per forward/backward (gradient accumulation over the rest); "
                         "0: all of a step's completions in one pass")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="bf16=True: bfloat16 autocast (CUDA)")
    ap.add_argument("--reward", choices=("exact", "distinct"), default="exact")
    ap.add_argument("--lengths", default="",
                    help="comma-separated completion lengths by row: row r of each generated batch "
                         "ends with EOS at token lengths[r % len] (EOS is never drawn earlier)")
    args = ap.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in open(args.prompts)]
    dataset = Dataset.from_list(rows)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)

    def exact_answer(completions, answer, **_):
        return [1.0 if c.strip() == a.strip() else 0.0 for c, a in zip(completions, answer)]

    if args.lengths:
        force_lengths(model, tokenizer, [int(x) for x in args.lengths.split(",")])
    cuda = torch.cuda.is_available()
    generating: list[float] = []
    time_generate(model, generating)
    timer = step_timer(args.steps)
    rows = args.prompts_per_step * args.group_size
    micro = args.micro_batch or rows
    if rows % micro:
        raise SystemExit(f"--micro-batch {micro} must divide the {rows} completions of a step")
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=micro,
            num_generations=args.group_size, steps_per_generation=rows // micro,
            gradient_accumulation_steps=rows // micro,
            num_iterations=1, max_completion_length=args.max_new_tokens, beta=args.beta,
            loss_type="grpo", scale_rewards="group", learning_rate=args.lr, lr_scheduler_type="constant",
            warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, temperature=1.0, top_p=1.0,
            use_cpu=not cuda, bf16=args.bf16, gradient_checkpointing=args.gradient_checkpointing,
            disable_dropout=True,
            logging_steps=1, report_to="none", save_strategy="no", seed=args.seed,
            dataloader_num_workers=0, log_completions=False)
        trainer = GRPOTrainer(model=model, reward_funcs=exact_answer if args.reward == "exact" else distinct,
                              args=config, train_dataset=dataset, processing_class=tokenizer,
                              callbacks=[timer])
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
        if args.save:
            trainer.model.save_pretrained(args.save)
            tokenizer.save_pretrained(args.save)
    timed = timer.times[1:] if len(timer.times) > 1 else timer.times
    # generate runs once per optimizer step here (steps_per_generation = gradient accumulation)
    pairs = list(zip(timer.times, generating))
    pairs = pairs[1:] if len(pairs) > 1 else pairs
    settings = {k: getattr(config, k) for k in (
        "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
        "num_generations", "num_iterations", "max_completion_length", "beta", "loss_type",
        "scale_rewards", "learning_rate", "temperature", "bf16", "gradient_checkpointing",
        "use_vllm", "use_liger_kernel") if hasattr(config, k)}
    lengths = [m["completions/mean_length"] for m in trainer.state.log_history
               if "completions/mean_length" in m]
    print(json.dumps({
        "sec_per_step": round(statistics.median(timed), 4), "step_times": [round(t, 4) for t in timer.times],
        "completion_len_mean": round(statistics.mean(lengths[1:] or lengths), 2) if lengths else None,
        "peak_rss_mb": round(peak_rss_kb() / 1024, 1),
        **({"peak_gpu_memory_mb": round(torch.cuda.max_memory_allocated() / 2 ** 20, 1)} if cuda else {}),
        "split_s": {"generate": round(statistics.median(g for _, g in pairs), 4),
                    "rest": round(statistics.median(t - g for t, g in pairs), 4)} if pairs else {},
        "generate_calls": len(generating),
        "settings": settings, "trl": __import__("trl").__version__,
        "transformers": __import__("transformers").__version__, "torch": torch.__version__,
        "train_s": round(sum(timer.times), 3), "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
