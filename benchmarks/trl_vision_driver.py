"""Run TRL's GRPOTrainer on a vision-language model and image prompts; print one JSON line.

Run by `benchmarks/vision_step.py` with the Python of an environment where TRL is installed; it
does not import grpo. Rows arrive as JSON lines {"text", "image" (a PNG path), "answer"}; each
becomes one user message of an image part and the text, as grpo renders it. The reward is 1 when
the completion, stripped, equals the answer.

    python trl_vision_driver.py --model DIR --rows FILE --steps 5 --max-new-tokens 16
"""

import argparse
import json
import statistics
import sys
import tempfile
import time

from trl_driver import peak_rss_kb, step_timer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--max-new-tokens", type=int, required=True)
    ap.add_argument("--prompts-per-step", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()

    import torch
    from datasets import Dataset
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import GRPOConfig, GRPOTrainer

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in open(args.rows)]
    dataset = Dataset.from_list([{
        "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": r["text"]}]}],
        "image": Image.open(r["image"]).convert("RGB"), "answer": r["answer"]} for r in rows])
    processor = AutoProcessor.from_pretrained(args.model)
    model = AutoModelForImageTextToText.from_pretrained(args.model, dtype=torch.float32)
    model.model.vision_tower.requires_grad_(False)          # as grpo's default: the tower is frozen

    def exact_answer(completions, answer, **_):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return [1.0 if t.strip() == a.strip() else 0.0 for t, a in zip(texts, answer)]

    timer = step_timer(args.steps)
    n = args.prompts_per_step * args.group_size
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=n,
            num_generations=args.group_size, num_iterations=1, max_completion_length=args.max_new_tokens,
            beta=0.04, loss_type="grpo", learning_rate=5e-4, lr_scheduler_type="constant",
            warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, temperature=1.0, top_p=1.0,
            use_cpu=True, bf16=False, disable_dropout=True, logging_steps=1, report_to="none",
            save_strategy="no", seed=0, dataloader_num_workers=0, log_completions=False)
        trainer = GRPOTrainer(model=model, reward_funcs=exact_answer, args=config, train_dataset=dataset,
                              processing_class=processor, callbacks=[timer])
        trainer.train()
    timed = timer.times[1:] if len(timer.times) > 1 else timer.times
    print(json.dumps({"sec_per_step": round(statistics.median(timed), 4),
                      "step_times": [round(t, 4) for t in timer.times],
                      "peak_rss_mb": round(peak_rss_kb() / 1024, 1), "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
