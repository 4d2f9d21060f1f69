"""The `grpo` command: train, sft, eval, score, explain, bench, report.

    grpo train [CONFIG.yaml] [key=value ...]    GRPO (no arguments: the built-in demo)
    grpo train ... --print-config               print the resolved config (presets applied), run nothing
    torchrun --nproc-per-node N -m grpo train ...   the same run on N processes (run/distributed.py)
    grpo sft   [CONFIG.yaml] [key=value ...]    cold-start supervised tuning only
    grpo eval  [CONFIG.yaml | RUN_DIR] [key=value ...] [--out FILE]
                                                held-out accuracy of a model, or of a run's weights
                                                with its settings: greedy, or n samples for pass@1,
                                                pass@k, maj@k (eval_samples, eval_k)
    grpo score dataset=FILE [key=value ...] [--completions COLUMN]
                                                score given completions with the reward functions:
                                                per-row results and pass@k, no model
    grpo launch [CONFIG.yaml] [key=value ...] [--nproc-per-node N]
                                                a vLLM server, the run on it, the server stopped
    grpo launch ... --nodes A,B --server-nodes C,D  print the command for each machine of a run
                                                across machines (servers on C, D; trainer on A, B)
    grpo bench [CONFIG.yaml] [key=value ...]    a few measured steps, one JSON line
    grpo explain [CONFIG.yaml] [key=value ...] [--prompt TEXT | --row N] [--json]
                                                the four steps on one prompt, every number shown
    grpo explain --overview                     the algorithm, presets, rewards and tasks
    grpo report RUN_DIR [RUN_DIR ...] [--out DIR]   HTML report with plots; several runs overlaid
    grpo COMMAND --help                         the command's own options and the keys it reads

Exit status, the same for every command: 0 done; 2 an error in what was given (the command line,
a config key, a file, a dataset row, a reward function, a checkpoint), said in one line on stderr;
128 + N stopped by signal N (130 Ctrl-C, 143 SIGTERM), after keeping what can be kept (a GRPO
step or a cold-start step is finished and saved first); 1 only for a bug, with its traceback.
"""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

from grpo.run.progress import to_stderr
from grpo.run.tracking import strict_json

USAGE = __doc__.split("\n\n", 1)[1]


class UsageError(ValueError):
    """A command line that cannot be read: an unknown option, a missing value."""


class Terminated(Exception):
    """SIGTERM outside the loops that stop cleanly on it (those raise resume.Stopped instead)."""


def _quiet_libraries() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")   # "Generating train split"
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
    path, overrides = _checked_args(args)
    return load_config(path, overrides)


def _checked_args(args: list[str]) -> tuple[str | None, list[str]]:
    """`_split_args`, with a stray word after the config file named."""
    path, overrides = _split_args(args)
    for arg in overrides:
        if "=" not in arg:
            raise UsageError(f"expected key=value, got {arg!r}" + (
                f" (only the first argument may be a config file; {path!r} was taken as one)"
                if path else ""))
    return path, overrides


# ---------------------------------------------------------------- commands

def cmd_train(args: list[str], options: dict) -> None:
    from grpo.train import train
    config = _config(args)
    result = train(config)
    if int(os.environ.get("RANK", "0")) == 0:
        kept = [name for name in ("report.html", "metrics.jsonl", "curves.png", "final/")
                 if (result.run_dir / name).exists()]
        print(f"run directory: {result.run_dir}  ({', '.join(kept)})")


def cmd_launch(args: list[str], options: dict) -> None:
    from grpo.commands.launch import launch
    numbers = {}
    for flag, least in (("nproc-per-node", 1), ("port", 1), ("servers", 1)):
        value = options.get(flag)
        if value is not None and (not value.isdigit() or int(value) < least):
            raise UsageError(f"--{flag} takes a whole number of at least {least}, got {value!r}")
        numbers[flag] = int(value) if value is not None else None
    path, overrides = _checked_args(args)
    if options.get("nodes") or options.get("server-nodes"):   # print each machine's command
        from grpo.commands.nodes import launch_on_nodes
        return launch_on_nodes(path, overrides, options, numbers)
    code = launch(path, overrides, nproc=numbers["nproc-per-node"] or 1, port=numbers["port"],
                  say=to_stderr, servers=numbers["servers"] or 1)
    if code:
        sys.exit(code)


def cmd_sft(args: list[str], options: dict) -> None:
    from pathlib import Path
    from grpo import assembly
    from grpo.run.checkpoint import run_lock, save_model_dir
    config = _config(args)
    if not config.run.sft_steps:
        raise assembly.ConfigError("config key 'sft_steps' is 0 (with dataset= unless set): nothing to "
                                   "tune; set sft_steps=N")
    run_dir = Path(config.run.output_dir)
    with run_lock(run_dir):   # as grpo train: one run writes a directory at a time
        loaded = assembly.assemble_command("sft", config, run_dir=run_dir)
        assembly.cold_start(config, loaded.policy, loaded.tokenizer, loaded.data, print, save_to=run_dir)
        path = save_model_dir(loaded.policy, loaded.tokenizer, run_dir / "final")
    print(f"model directory: {path}")


def cmd_eval(args: list[str], options: dict) -> None:
    from grpo.assembly import assemble_evaluation, eval_setup, results_file
    from grpo.evaluate import evaluate_held_out, say_replacing
    said: list[str] = []                 # shown once the model loads: an error is one line alone
    setup = eval_setup(*_checked_args(args), log=said.append)   # a run: its weights and settings
    config = setup.config
    run = assemble_evaluation(config, said.append, to_stderr)
    for line in said:
        to_stderr(line)
    rows_file = results_file(setup, options.get("out"))
    say_replacing(rows_file)
    metrics, _ = evaluate_held_out(config, run.sampler, run.loaded.tokenizer, run.loaded.data,
                                   to_stderr, rows_file)
    print(strict_json({**metrics, "model": config.model.model, "rows_file": str(rows_file)}))


def cmd_score(args: list[str], options: dict) -> None:
    from grpo.commands.score import score_file
    print(strict_json(score_file(args, options.get("completions"), options.get("out"))))


def cmd_bench(args: list[str], options: dict) -> None:
    from grpo.commands.bench import main
    main(_config(args))


def cmd_report(args: list[str], options: dict) -> None:
    from grpo.run.report import write_report
    if not args:
        raise UsageError("give at least one RUN_DIR (a directory with metrics.jsonl)")
    strays = [a for a in args if "=" in a]
    if strays:
        raise UsageError(f"{strays[0]!r}: grpo report takes run directories, not config keys")
    try:
        print(write_report(*args, out=options.get("out")))
    except FileNotFoundError as e:
        from grpo.config import ConfigError
        raise ConfigError(str(e)) from None


def cmd_explain(args: list[str], options: dict) -> None:
    from grpo.commands.explain import config_for, explain_group, overview, render
    if "overview" in options:
        print(overview())
        return
    if "answer" in options and "prompt" not in options:
        raise UsageError("--answer goes with --prompt (a row of the data brings its own answer)")
    if "row" in options and "prompt" in options:
        raise UsageError("give --row N or --prompt TEXT, not both")
    row = 1
    if "row" in options:
        try:
            row = int(options["row"])
        except ValueError:
            raise UsageError(f"--row expects a row number (from 1, as in the file), got "
                             f"{options['row']!r}") from None
    config, notes = config_for(*_checked_args(args))
    result = explain_group(config, prompt=options.get("prompt"), answer=options.get("answer"),
                           row=row, log=to_stderr)
    result["notes"] = notes + result.get("notes", [])
    print(strict_json(result, note=False) if "json" in options else render(result),
          end="\n" if "json" in options else "")


# ---------------------------------------------------------------- each command's options and keys

ALL = None   # every key of a section


@dataclass(frozen=True)
class Command:
    run: Callable[[list[str], dict], None]
    usage: str
    summary: str
    flags: dict[str, tuple[str | None, str]] = field(default_factory=dict)   # --flag: (VALUE, help)
    keys: dict[str, set[str] | None] | None = None   # section: the keys it reads (ALL); None: no keys


PRINT_CONFIG = {"--print-config": (None, "print the resolved config (presets applied) and stop")}
EVERY_KEY = {s: ALL for s in ("model", "data", "sampling", "reward", "loss", "optim", "run", "eval",
                              "agent", "pipeline")}
PROMPT_DATA = {"task", "dataset", "dataset_config", "dataset_split", "prompt_column", "answer_column",
               "tests_column", "entry_point_column", "system_prompt", "long_prompts"}

COMMANDS: dict[str, Command] = {
    "train": Command(cmd_train, "grpo train [CONFIG.yaml] [key=value ...]",
                     "GRPO: a cold start (sft_steps), then `steps` steps; with no arguments, the "
                     "built-in demo. Writes OUTPUT_DIR (metrics.jsonl, checkpoints/, final/, "
                     "report.html).", PRINT_CONFIG, EVERY_KEY),
    "sft": Command(cmd_sft, "grpo sft [CONFIG.yaml] [key=value ...]",
                   "Cold-start supervised tuning only, on the task's demonstrations or the "
                   "dataset's `completion` column; writes OUTPUT_DIR/final.", PRINT_CONFIG,
                   {"model": ALL, "data": PROMPT_DATA, "agent": {"tools", "environment", "tool_format"},
                    "run": {"sft_steps", "sft_lr", "sft_batch_size", "seed", "output_dir", "threads"}}),
    "eval": Command(cmd_eval, "grpo eval [CONFIG.yaml | RUN_DIR] [key=value ...] [--out FILE]",
                    "Held-out accuracy of a model, one JSON line: greedy, or eval_samples=N for "
                    "pass@1, pass@k and maj@k. A run (its directory or config.yaml, or model= "
                    "RUN_DIR, its final/ or a checkpoint) is evaluated with its trained weights "
                    "(final/, else its newest checkpoint) and the keys it was trained with; keys "
                    "given here win. Only the held-out rows are read (a training file may be "
                    "gone). Every row's completions and scores go beside what was evaluated (RUN_DIR/eval.jsonl, "
                    "NAME-eval.jsonl beside a model directory) or to --out.",
                    {"--out": ("FILE", "where the per-row results go (as eval_output)"),
                     **PRINT_CONFIG},
                    {"model": ALL, "data": ALL, "sampling": {"max_new_tokens", "stop"}, "reward": ALL,
                     "eval": ALL, "agent": ALL, "run": {"seed", "output_dir", "threads"}}),
    "score": Command(cmd_score, "grpo score [CONFIG.yaml] dataset=FILE [key=value ...] "
                                "[--completions COLUMN] [--out FILE]",
                     "Score given completions (a file of model outputs, or a benchmark's canonical "
                     "solutions) with the reward functions, no model: the rows have the dataset's "
                     "columns plus a completion, or a list of completions, each. Prints one JSON "
                     "line (pass@1, pass@k for eval_k, maj@k, each function's mean); every row's "
                     "scores go beside the file (FILE-score.jsonl) or to --out. Rewards see each "
                     "prompt as written in the file.",
                     {"--completions": ("COLUMN", "the column of completions (text, or a list of "
                                                  "texts per row), any column as the file names "
                                                  "it; default `completion`, else `completions`"),
                      "--out": ("FILE", "where the per-row results go (as eval_output)")},
                     {"data": PROMPT_DATA - {"task", "system_prompt", "long_prompts"},
                      "reward": ALL, "eval": {"eval_k", "eval_output"}, "run": {"output_dir"}}),
    "bench": Command(cmd_bench, "grpo bench [CONFIG.yaml] [key=value ...]",
                     "A few measured GRPO steps (no cold start, no evaluation, no files), one JSON "
                     "line: seconds per step and its split, tokens/s, peak memory, FLOP/s.",
                     PRINT_CONFIG, EVERY_KEY),
    "explain": Command(
        cmd_explain, "grpo explain [CONFIG.yaml] [key=value ...] [--row N | --prompt TEXT "
                     "[--answer A]] [--json]\n       grpo explain --overview",
        "The four steps of GRPO on one prompt, every number shown: the group's completions, "
        "rewards and advantages, then each of the num_iterations updates with every token's "
        "ratio, clip and KL. With no model= it explains the demo's tiny model after a cold "
        "start, with num_iterations=4.",
        {"--row": ("N", "the data's row N, numbered from 1 as in the file (a built-in task: its "
                        "N-th training row); default 1"),
         "--prompt": ("TEXT", "a prompt of your own instead of a row"),
         "--answer": ("A", "with --prompt: the gold answer the rewards compare with"),
         "--json": (None, "every number as one JSON object instead of tables"),
         "--overview": (None, "the algorithm, reward functions, tasks and presets, as text"),
         **PRINT_CONFIG},
        {"model": ALL, "data": PROMPT_DATA,
         "sampling": {"group_size", "max_new_tokens", "temperature", "top_p", "top_k", "min_p",
                      "repetition_penalty", "stop"}, "reward": ALL,
         "loss": ALL, "optim": {"lr", "weight_decay", "max_grad_norm", "num_iterations",
                                "micro_batch_size", "micro_batch_tokens"},
         "run": {"sft_steps", "sft_lr", "sft_batch_size", "seed", "threads", "algorithm"},
         "agent": ALL}),
    "launch": Command(cmd_launch, "grpo launch [CONFIG.yaml] [key=value ...] [--nproc-per-node N] "
                                  "[--port P] [--servers N | --nodes A,B --server-nodes C,D]",
                      "A vLLM server and the trainer on it, in one command: starts `vllm serve` "
                      "with the flags the run needs, waits until it is healthy, runs grpo train "
                      "with sampler=vllm_server (under torchrun with --nproc-per-node), and stops "
                      "the server when the run ends or fails. Exits with the trainer's status.",
                      {"--nproc-per-node": ("N", "trainer processes, under torchrun (default 1)"),
                       "--port": ("P", "the server's port on 127.0.0.1 (default: a free one); "
                                       "with --servers N, the first of N"),
                       "--servers": ("N", "vLLM servers, each on its own port, with its own log and "
                                          "an equal share of the GPUs, or of the CPU cores (default 1)"),
                       "--nodes": ("A,B", "the trainer's machines: print each machine's command, start "
                                          "nothing (with --server-nodes and a shared vllm_weights_dir)"),
                       "--server-nodes": ("C,D", "with --nodes: the machines that run a vLLM server "
                                                 "each, on --port (default 8000)"),
                       **PRINT_CONFIG}, EVERY_KEY),
    "report": Command(cmd_report, "grpo report RUN_DIR [RUN_DIR ...] [--out DIR]",
                      "An HTML report with plots and a completion browser for a run directory "
                      "(RUN_DIR/report.html); several runs overlaid in one (default ./report).",
                      {"--out": ("DIR", "where the report of several runs goes")}),
}


def parse_flags(command: str, args: list[str]) -> tuple[dict, list[str]]:
    """The command's own --options (a value each, or a switch) and the rest of the arguments;
    an option the command does not have is a UsageError listing those it has."""
    spec = COMMANDS[command].flags
    options, rest, i = {}, [], 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--") and "=" in arg and arg.split("=", 1)[0] in spec:   # --port=8000
            name, given = arg.split("=", 1)
            if spec[name][0] is None:
                raise UsageError(f"{name} is a switch and takes no value: {name}")
            options[name[2:]] = given
            i += 1
            continue
        if arg.startswith("--"):
            if arg not in spec:
                have = ", ".join(spec) or "none"
                raise UsageError(f"unknown option {arg!r}; grpo {command}'s options: {have} "
                                 f"(`grpo {command} --help`)")
            value, _ = spec[arg]
            if value is not None:
                if i + 1 >= len(args):
                    raise UsageError(f"{arg} needs a value: {arg} {value}")
                options[arg[2:]] = args[i + 1]
                i += 2
                continue
            options[arg[2:]] = True
        else:
            rest.append(arg)
        i += 1
    return options, rest


def command_help(command: str) -> str:
    """`grpo COMMAND --help`: its usage, what it does, its own options and the keys it reads."""
    import textwrap
    spec = COMMANDS[command]
    lines = [f"usage: {spec.usage}", "", textwrap.fill(spec.summary, 96), "", "options:"]
    flags = {f"{flag} {value}" if value else flag: text for flag, (value, text) in
             {**spec.flags, "-h, --help": (None, "this text")}.items()}
    width = max(map(len, flags))
    for name, text in flags.items():
        lines.append(textwrap.fill(text, 96, initial_indent=f"  {name:{width}s}  ",
                                   subsequent_indent=" " * (width + 4)))
    if spec.keys is not None:
        from grpo.config import KEYS, help_text
        from grpo.data.tasks import TASKS
        keys = [k for k, (section, _, _) in KEYS.items() if section in spec.keys
                and (spec.keys[section] is ALL or k in spec.keys[section])]
        lines += ["", f"keys grpo {command} reads, in CONFIG.yaml or as key=value (defaults are "
                      "the demo's):", "", help_text(keys, choices={"task": list(TASKS)})]
    return "\n".join(lines)


@contextmanager
def _sigterm_raises():
    """SIGTERM becomes an exception (as SIGINT is KeyboardInterrupt), so every command exits with
    a line and status 143 instead of dying silently; the training loop and the cold start put
    their own handler in place while they run (resume.StopOnSignal)."""
    import threading
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"grpo: unknown command '{command}'\n\n{USAGE}", file=sys.stderr)
        return 2
    if any(a in ("-h", "--help") for a in rest):
        print(command_help(command))
        return 0
    from grpo.config import ConfigError, to_yaml
    if "--print-config" in rest and "--print-config" in COMMANDS[command].flags:
        try:
            _, rest = parse_flags(command, rest)
            if command == "explain":    # with the demo's keys where no model is given
                from grpo.commands.explain import config_for
                config = config_for(*_checked_args(rest))[0]
            elif command == "eval":     # a run named: its weights and settings
                from grpo.assembly import eval_setup
                config = eval_setup(*_checked_args(rest)).config
            elif command == "launch":   # as launch runs it: on the server it starts
                from grpo.commands.launch import launch_config
                config = launch_config(*_checked_args(rest))
            else:
                config = _config(rest)
            print(to_yaml(config), end="")
        except (ConfigError, UsageError) as e:
            to_stderr(f"grpo {command}: error: {e}")
            return 2
        return 0
    _quiet_libraries()
    from grpo.run.checkpoint import CheckpointError
    from grpo.data import DataError
    from grpo.pipeline import PipelineError
    from grpo.run.resume import Stopped
    from grpo.rewards import RewardError
    from grpo.train import TrainingError
    from grpo.commands.launch import LaunchError
    from grpo.sampling.engine import EngineError
    with _sigterm_raises():
        try:
            options, rest = parse_flags(command, rest)
            COMMANDS[command].run(rest, options)
        except Stopped as e:
            to_stderr(f"grpo {command}: {e}")
            return 128 + e.signum
        except (UsageError, ConfigError, DataError, RewardError, TrainingError, CheckpointError,
                PipelineError, LaunchError, EngineError) as e:   # a worker or a server lost
            to_stderr(f"grpo {command}: error: {e}")
            return 2
        except KeyboardInterrupt:
            to_stderr(f"grpo {command}: interrupted")
            return 130
        except Terminated:
            to_stderr(f"grpo {command}: stopped by SIGTERM before it finished")
            return 128 + signal.SIGTERM
    return 0


if __name__ == "__main__":
    sys.exit(main())
