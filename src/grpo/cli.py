"""The `grpo` command: train, sft, eval, explain, bench, report.

    grpo train [CONFIG.yaml] [key=value ...]    GRPO (no arguments: the built-in demo)
    grpo train ... --print-config               print the resolved config (presets applied), run nothing
    torchrun --nproc-per-node N -m grpo train ...   the same run on N processes (distributed.py)
    grpo sft   [CONFIG.yaml] [key=value ...]    cold-start supervised tuning only
    grpo eval  [CONFIG.yaml] [key=value ...]    held-out accuracy of a model: greedy, or n samples
                                                for pass@1, pass@k, maj@k (eval_samples, eval_k)
    grpo bench [CONFIG.yaml] [key=value ...]    a few measured steps, one JSON line
    grpo explain [CONFIG.yaml] [key=value ...] [--prompt TEXT | --row N] [--json]
                                                the four steps on one prompt, every number shown
    grpo explain --overview                     the algorithm, presets, rewards and tasks
    grpo report RUN_DIR [RUN_DIR ...] [--out DIR]   HTML report with plots; several runs overlaid
"""

from __future__ import annotations

import json
import os
import sys

USAGE = __doc__.split("\n\n", 1)[1]


def _quiet_libraries() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def _split_args(args: list[str]) -> tuple[str | None, list[str]]:
    """An optional leading YAML path, then key=value overrides."""
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


def _config(args: list[str]):
    from grpo.config import load_config
    path, overrides = _split_args(args)
    return load_config(path, overrides)


def cmd_train(args: list[str]) -> None:
    from grpo.train import train
    config = _config(args)
    result = train(config)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"run directory: {result.run_dir}  (metrics.jsonl, curves.png, final/)")


def cmd_sft(args: list[str]) -> None:
    from grpo import build
    from grpo.checkpoint import save_model_dir
    from grpo.train import cold_start
    from pathlib import Path
    config = _config(args)
    if not config.run.sft_steps:
        raise build.ConfigError("config key 'sft_steps' is 0 (with dataset= unless set): nothing to "
                                "tune; set sft_steps=N")
    run_dir = Path(config.run.output_dir)
    data = build.load_data(config, check_golds_now=False)
    policy, tokenizer = build.load_model_and_tokenizer(config, run_dir)
    cold_start(config, policy, tokenizer, data, print)
    path = save_model_dir(policy, tokenizer, run_dir / "final")
    print(f"model directory: {path}")


def cmd_eval(args: list[str]) -> None:
    from pathlib import Path

    from grpo import build
    from grpo.evaluate import evaluate
    from grpo.progress import Progress, to_stderr
    from grpo.sampling import HFSampler
    config = _config(args)
    data = build.load_data(config, log=to_stderr)
    if not data.eval_rows:
        raise build.ConfigError("nothing to evaluate: set eval_dataset=FILE or use a built-in task")
    policy, tokenizer = build.load_model_and_tokenizer(config, None)
    build.fit_prompts(config, tokenizer, getattr(policy.config, "max_position_embeddings", None),
                      data, log=lambda line: print(line, file=sys.stderr))
    agent = build.agent_of(config)
    if agent is not None:     # tools or an environment: held-out episodes, as in training
        from grpo.episodes import EpisodeSampler
        sampler = EpisodeSampler(policy, tokenizer, limits=agent.limits, tools=agent.tools,
                                 call_format=build.call_format_of(config, tokenizer, agent),
                                 make_env=agent.make_env)
    else:
        sampler = HFSampler(policy, tokenizer, max_new_tokens=config.sampling.max_new_tokens)
    rows_file = Path(config.eval.eval_output or Path(config.run.output_dir) / "eval.jsonl")
    results: list[dict] = []
    with Progress("eval", len(data.eval_rows), to_stderr) as bar:
        evaluate(config, sampler, tokenizer, data, lambda m, step: results.append(m), step=0,
                 on_batch=lambda done, accuracy: bar.update(done, f"pass@1 {accuracy:.3f}"),
                 rows_file=rows_file)
    print(json.dumps({**results[0], "rows_file": str(rows_file)}))


def cmd_bench(args: list[str]) -> None:
    from grpo.bench import main
    main(_config(args))


def cmd_report(args: list[str]) -> None:
    from grpo.report import write_report
    out = None
    if "--out" in args:
        i = args.index("--out")
        if i + 1 >= len(args):
            raise SystemExit("usage: grpo report RUN_DIR [RUN_DIR ...] [--out DIR]")
        out, args = args[i + 1], args[:i] + args[i + 2:]
    if not args:
        raise SystemExit("usage: grpo report RUN_DIR [RUN_DIR ...] [--out DIR]")
    try:
        print(write_report(*args, out=out))
    except FileNotFoundError as e:
        raise SystemExit(f"grpo report: error: {e}") from None


def cmd_explain(args: list[str]) -> None:
    from grpo.explain import explain_group, overview, render
    if "--overview" in args:
        print(overview())
        return
    options = {}
    for flag in ("--prompt", "--answer", "--row"):
        if flag in args:
            i = args.index(flag)
            if i + 1 >= len(args):
                raise SystemExit(f"grpo explain: {flag} needs a value")
            options[flag[2:]] = args[i + 1]
            args = args[:i] + args[i + 2:]
    as_json = "--json" in args
    config = _config([a for a in args if a != "--json"])
    result = explain_group(config, prompt=options.get("prompt"), answer=options.get("answer"),
                           row=int(options.get("row", 0)))
    print(json.dumps(result) if as_json else render(result), end="" if not as_json else "\n")


COMMANDS = {"train": cmd_train, "sft": cmd_sft, "eval": cmd_eval, "bench": cmd_bench,
            "report": cmd_report, "explain": cmd_explain}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"grpo: unknown command '{command}'\n\n{USAGE}", file=sys.stderr)
        return 2
    if command != "report" and any(a in ("-h", "--help") for a in rest):
        from grpo.config import help_text
        print(f"usage: grpo {command} [CONFIG.yaml] [key=value ...]\n\nkeys (defaults are the demo's):\n")
        print(help_text())
        return 0
    if "--print-config" in rest:
        from grpo.config import ConfigError, to_yaml
        try:
            print(to_yaml(_config([a for a in rest if a != "--print-config"])), end="")
        except ConfigError as e:
            print(f"grpo {command}: error: {e}", file=sys.stderr)
            return 2
        return 0
    _quiet_libraries()
    from grpo.build import ConfigError
    from grpo.checkpoint import CheckpointError
    from grpo.data import DataError
    from grpo.resume import Stopped
    from grpo.rewards import RewardError
    from grpo.train import TrainingError
    try:
        COMMANDS[command](rest)
    except Stopped as e:
        print(f"grpo {command}: {e}", file=sys.stderr)
        return 128 + e.signum
    except (ConfigError, DataError, RewardError, TrainingError, CheckpointError) as e:
        print(f"grpo {command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"grpo {command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
