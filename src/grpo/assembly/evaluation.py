"""What `grpo eval` evaluates: a run named by its directory, config.yaml, final/ or a checkpoint
is evaluated with its trained weights and the keys it was trained with (keys given here win);
anything else is the config as every command reads it. And where its per-row results go.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from grpo.assembly.model import run_dir_of, run_settings, run_weights
from grpo.config import TrainConfig, build_config, load_yaml, parse_overrides
from grpo.evaluate import beside
from grpo.run.progress import to_stderr


@dataclass(frozen=True)
class EvalSetup:
    """What `grpo eval` evaluates: the config (a run's own when a run is named), the run whose
    weights are evaluated (None for a model directory or hub name) and the keys the user set."""
    config: TrainConfig
    run_dir: Path | None
    given: frozenset[str]


def eval_setup(path: str | None, overrides: list[str],
               log: Callable[[str], None] = to_stderr) -> EvalSetup:
    """`grpo eval [CONFIG.yaml] [key=value ...]`. A run named as CONFIG (its directory or its
    config.yaml) or as model= (its directory, final/ or a checkpoint) is evaluated with its
    trained weights (a run directory: assembly.run_weights) and the keys it was trained with; keys
    in the user's own config file, then on the command line, win over the run's. Anything else
    is the config as every command reads it."""
    on_line = parse_overrides(overrides)
    as_config = run_weights_named(path) if path is not None else None
    from_file = load_yaml(path) if path is not None and as_config is None else {}
    return setup_of({**from_file, **on_line}, as_config, log)


def setup_of(given: dict, as_config: tuple[Path, Path | None] | None = None,
             log: Callable[[str], None] = to_stderr) -> EvalSetup:
    """eval_setup's config from the keys `given` (a file's, then the command line's; or those
    given to grpo.train.evaluate) and the run named as the config (`as_config`), if any."""
    # whose weights: model='s run when a model is given (a model given wins), else CONFIG's run;
    # whose keys: CONFIG's run, else model='s
    evaluated = run_weights_named(str(given["model"])) if "model" in given else as_config
    settings = as_config or evaluated
    if settings is None:
        return EvalSetup(build_config(given), None, frozenset(given))
    saved = run_settings(settings[0], log)
    for key in NOT_EVALUATION_SETTINGS:
        saved.pop(key, None)
    if HELD_OUT_DATA & set(given):    # held-out rows named here: evaluated whole unless cut here
        saved.pop("eval_size", None)
    values = {**saved, **given}
    if evaluated is not None:
        values["model"] = str(evaluated[1] or run_weights(evaluated[0], log))
    mine = ", ".join(sorted(given)) or "none"
    log(f"evaluating {values['model']} with the keys run {settings[0]} was trained with (its "
        f"config.yaml); keys given here win: {mine}")
    return EvalSetup(build_config(values), evaluated[0] if evaluated else None, frozenset(given))


def run_weights_named(thing: str) -> tuple[Path, Path | None] | None:
    """(run directory, weights) when `thing` is a run's directory (weights None: the run's own,
    assembly.run_weights), its config.yaml, its final/ or final/merged, or one of its checkpoints
    (or the checkpoint's config.yaml); None for anything else."""
    path = Path(thing).expanduser()
    if path.name == "config.yaml" and path.is_file():
        path = path.parent
    if run_dir_of(path) is not None:
        return path, None
    merged = path.name == "merged" and path.parent.name == "final"
    for run, inside in ((path.parent, path.name == "final"),
                        (path.parent.parent, path.parent.name == "checkpoints"),
                        (path.parent.parent, merged)):
        if inside and path.is_dir() and run_dir_of(run) is not None:
            return run, path
    return None


# A run's keys that say where it wrote and how it trained, not what its evaluation is: its output
# goes beside the run, and lora_r would put a fresh adapter on the weights being evaluated.
NOT_EVALUATION_SETTINGS = ("output_dir", "eval_output", "resume", "lora_r")
# Keys that name the held-out rows: given on the command line, the run's eval_size (its cut of
# its own held-out rows) does not carry over to them.
HELD_OUT_DATA = {"eval_dataset", "task", "dataset"}


def results_file(setup: EvalSetup, out: str | None = None) -> Path:
    """Where `grpo eval` writes its per-row results: --out or eval_output; OUTPUT_DIR/eval.jsonl
    when output_dir is given; else beside what is evaluated: RUN_DIR/eval.jsonl for a run's
    final/ (eval-step-N.jsonl for a checkpoint), NAME-eval.jsonl beside a model directory NAME,
    ./NAME-eval.jsonl for a hub model."""
    c = setup.config
    if out or c.eval.eval_output:
        return Path(out or c.eval.eval_output)
    if "output_dir" in setup.given:
        return Path(c.run.output_dir) / "eval.jsonl"
    model = Path(c.model.model).expanduser()
    if setup.run_dir is not None:
        at_checkpoint = model.parent.name == "checkpoints"
        return setup.run_dir / (f"eval-{model.name}.jsonl" if at_checkpoint else "eval.jsonl")
    return beside(model, "eval")
