"""The GRPO loop, as Algorithm 1 of DeepSeekMath (arXiv:2402.03300) lays it out.

    for each outer iteration:                       reference <- policy  (every `ref_reset_every`)
        for each step:                              step.grpo_step, whose stages are
            1. sample G completions for each of B prompts        (a group source: pipeline/)
            2. score them with the reward functions              (rewards/)
            3. normalize rewards within each group               (algorithm/advantages.py)
            4. mu times: clipped-surrogate update, pi_old fixed  (algorithm/loss.py, update.py)

The variants (Dr. GRPO, DAPO, GSPO, CISPO, RLOO) change which table entry steps 3 and 4 use and
switch on the extras in the step's stages (dynamic sampling, overlong shaping, KL in the reward,
truncated importance sampling); docs/algorithms.md lists them. `assembly/` puts the run together
(data, model, cold start, resume, learner, group source); this module runs the loop on it, with
evaluation and checkpoints, and writes the final model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from grpo import assembly
from grpo.assembly import Finished, Run, assemble
from grpo.config import ConfigError, TrainConfig, to_yaml
from grpo.data import first_line
from grpo.evaluate import evaluate as evaluate_rows, evaluate_held_out, progress as eval_progress
from grpo.models import adapter_base, is_adapter_dir, load_policy, update_reference
from grpo.rewards import RewardFn
from grpo.run import distributed, resume
from grpo.run.checkpoint import (CheckpointError, fault_point, run_lock, save_model_dir, step_dirs,
                                 storage_fault)
from grpo.run.metrics import (RunawayWatch, metrics_line, sample_records, sampler_gap_warning,
                              unscored_warning)
from grpo.run.progress import Progress, libraries_quiet
from grpo.run.tracking import NullTracker, RunTracker
from grpo.step import TrainingError, grpo_step


@dataclass
class RunResult:
    run_dir: Path
    history: list[dict]       # metrics.jsonl's records: steps and evaluations, in order
    policy: torch.nn.Module
    tokenizer: object

    @property
    def steps(self) -> list[dict]:
        """The training steps' records (`reward/mean`, `kl`, ...), step 1 first."""
        return [m for m in self.history if not is_evaluation(m)]

    @property
    def evaluations(self) -> list[dict]:
        """The held-out evaluations' records (`eval/accuracy`, `eval/n`, ...), step 0 first."""
        return [m for m in self.history if is_evaluation(m)]


def is_evaluation(record: dict) -> bool:
    return "eval/accuracy" in record


@dataclass
class EvalResult:
    metrics: dict             # eval/accuracy, eval/n, eval/reward/NAME/mean, pass@k, ... (grpo eval's)
    rows: list[dict]          # per prompt: row, prompt, answer, completions, scores, answers
    model: str                # what was evaluated


def evaluate(model, *, dataset=None, reward_fns: list[RewardFn] | None = None,
             config: dict | None = None, tokenizer=None, rows_file: str | Path | None = None,
             log: Callable[[str], None] = print) -> EvalResult:
    """`grpo eval` from Python. `model`: a run directory (its trained weights and the keys it was
    trained with, as grpo eval takes them), its final/ or a checkpoint, a model directory or hub
    name, or a loaded model with its `tokenizer`. `dataset`: the held-out rows (a list of dicts,
    a datasets.Dataset, or a file or hub name); default: the run's or the task's held-out rows.
    `reward_fns`: what the completions are scored with (the first is eval/accuracy, each one's
    mean is eval/reward/NAME/mean); default: what training evaluates with. `config`: keys, as
    build_config takes them (eval_samples, eval_k, max_new_tokens, ...), winning over a run's.
    `rows_file`: where the per-row results are written too (none by default)."""
    from grpo.data import given_shape
    values = dict(config or {})
    rows = dataset if dataset is not None and not isinstance(dataset, (str, Path)) else None
    if rows is not None:
        given_shape(rows, "dataset", "evaluate")
        values.setdefault("eval_size", 0)     # rows given are evaluated whole, unless cut here
    if isinstance(dataset, (str, Path)):
        values["eval_dataset"] = str(dataset)
    if isinstance(model, (str, Path)):
        values["model"] = str(model)
    elif model is None:
        raise ConfigError("evaluate(model): give a run directory, a model directory or hub name, "
                          "or a loaded model with tokenizer=")
    with libraries_quiet():
        return _evaluate(model, values, rows, reward_fns, tokenizer, rows_file, log)


def _evaluate(model, values: dict, rows, reward_fns, tokenizer, rows_file, log) -> EvalResult:
    """`evaluate`, with `values` holding the keys (model and a held-out file among them)."""
    from grpo.assembly import assemble_evaluation, setup_of
    said: list[str] = []
    setup = setup_of(values, None, said.append)
    c = setup.config
    if rows is not None:        # the rows given stand for the run's own held-out rows
        c = dataclasses.replace(c, data=dataclasses.replace(c.data, eval_dataset=""))
    given = {"eval_dataset": rows} if rows is not None else {}
    loaded_model = None if isinstance(model, (str, Path)) else model
    run = assemble_evaluation(c, said.append, log, given=given, model=loaded_model,
                              tokenizer=tokenizer, eval_fns=reward_fns)
    for line in said:
        log(line)
    metrics, rows = evaluate_held_out(run.loaded.config, run.sampler, run.loaded.tokenizer,
                                      run.loaded.data, log, rows_file)
    return EvalResult(metrics, rows, run.loaded.config.model.model)


def train(config: TrainConfig, *, reward_fns: list[RewardFn] | None = None,
          tools: list[Callable] | None = None, environment: Callable[[], object] | None = None,
          dataset=None, eval_dataset=None, model=None, tokenizer=None, engine=None,
          log: Callable[[str], None] = print, write_files: bool = True) -> RunResult:
    """Cold start (if `sft_steps`), then `steps` GRPO steps; returns the policy and every metric.
    With `resume`, continues a stopped run from its checkpoint instead (`resume.py`).
    `tools` (functions) and `environment` (a zero-argument factory) add to or stand for the
    config's `tools` and `environment` keys: the run samples multi-turn episodes.
    `dataset` and `eval_dataset` (a list of row dicts or a datasets.Dataset) stand for the keys
    of the same names; `model` and `tokenizer` (loaded, together) for the key `model`: that
    model is the policy, trained in place (docs/guides/python-api.md). `engine` (an Engine,
    sampling/engine.py, such as sampling.vllm.VLLMEngine) samples the groups, loaded with the
    policy's weights at start and after every update, for a run with sampler=vllm.
    The run holds output_dir's lock throughout (checkpoint.RunLock): another run on the same
    directory is refused, naming this one. A full disk or a read-only file system is a
    TrainingError naming the file and the newest checkpoint, which is intact."""
    world = distributed.setup(config.run.collective_timeout_s)
    run_dir = Path(config.run.output_dir)
    try:
        with run_lock(run_dir, world, take=write_files), storage_faults_said(run_dir), \
                libraries_quiet():
            return _train(config, reward_fns=reward_fns, tools=tools, environment=environment,
                          dataset=dataset, eval_dataset=eval_dataset, model=model,
                          tokenizer=tokenizer, engine=engine, log=log, write_files=write_files)
    except RuntimeError as e:
        if (lost := distributed.lost_peer(e)) is None:
            raise
        raise TrainingError(lost) from None
    finally:
        distributed.teardown()


def _train(config: TrainConfig, **given) -> RunResult:
    """`train`, with output_dir's lock held: Algorithm 1 on the assembled run."""
    run = assemble(config, **given)   # with async_steps, the rollout workers are forked in it
    if isinstance(run, Finished):
        return finished_run(run.config, run.checkpoint, run.log)
    c, learner, log = run.config, run.learner, run.log
    with closing_on_error(NullTracker(), run.groups, learner.sampler):   # the workers stop if the files cannot be written
        write_run_files(run)
        tracker = (RunTracker(run.run_dir, purge_step=run.kept + 1, report_to=c.run.report_to,
                              config=c.flat()) if run.write_files else NullTracker())
    history: list[dict] = []

    def record(metrics: dict, step: int) -> None:
        tracker.log(metrics, step)
        history.append({"step": step, **metrics})

    evaluating, accuracy, runaway = bool(run.data.eval_rows and c.run.eval_every), run.accuracy, RunawayWatch()
    if evaluating and run.first == 1:
        accuracy = evaluate_now(run, record, 0)
        log(f"step 0/{c.run.steps}  eval/accuracy {accuracy:.3f}")
    timeline_dir = run.run_dir if run.write_files else None
    with closing_on_error(tracker, run.groups, learner.sampler, timeline_dir), \
            resume.StopOnSignal(log) as stop, \
            Progress("step", c.run.steps, log, c.run.log_every, start=run.first - 1) as bar:
        gap_said = False
        for step in range(run.first, c.run.steps + 1):
            if learner.plan.reset_reference_before(step):   # a new outer iteration
                update_reference(learner.ref, learner.policy, c.run.ref_update_rate)
            learner.step = step
            rollout, metrics = grpo_step(c, learner, run.source, run.data.agent)
            metrics["data/skipped_long_prompts"] = run.data.skipped_long_prompts
            if run.data.curriculum is not None:
                metrics["task/level"] = run.stream.level
            fault_point("step")
            record(metrics, step)
            if (warning := unscored_warning(metrics, step)) is not None:
                log(warning)
            if not gap_said and (warning := sampler_gap_warning(metrics, step)) is not None:
                log(warning + " (said once)")
                gap_said = True
            tracker.samples(sample_records(rollout, step))
            if evaluating and (step % c.run.eval_every == 0 or step == c.run.steps):
                accuracy = evaluate_now(run, record, step, bar)
                raise_level(run, accuracy, step)
            signum = stop.requested(run.world)
            if (c.run.save_every and (step % c.run.save_every == 0 or step == c.run.steps)) or signum:
                save(run, step, accuracy)
            bar.update(step, metrics_line(metrics, accuracy) + runaway.note(metrics))
            if signum:
                raise resume.Stopped.after(signum, step, c.run.steps, run.run_dir)
    finish(run, tracker)
    return RunResult(run.run_dir, history, learner.policy, run.tokenizer)


def write_run_files(run: Run) -> None:
    """config.yaml, and the records of a resumed run cut back to its checkpoint's step."""
    if run.write_files:
        run.run_dir.mkdir(parents=True, exist_ok=True)
        (run.run_dir / "config.yaml").write_text(assembly.rewards_comment(run.data) + to_yaml(run.config))
        resume.cut_run_files(run.run_dir, run.kept)


def evaluate_now(run: Run, record, step: int, steps_bar: Progress | None = None) -> float:
    """The held-out score of the policy now (rank 0 evaluates; every rank gathers a sharded
    model), shown with its own bar in place of the steps'."""
    c, learner = run.config, run.learner
    if run.groups is not None:   # async_steps: only evaluation uses this engine (FSDP2: every
        learner.sampler.sync(learner.policy)   # process gathers the weights as they are sent)
    with distributed.full_parameters(learner.policy):
        if not run.world.is_main:
            return math.nan
        rows_file = run.run_dir / "eval" / f"step-{step}.jsonl" if run.write_files else None
        with (steps_bar.paused() if steps_bar is not None else nullcontext()), \
                eval_progress(len(run.data.eval_rows), run.log) as shown:
            return evaluate_rows(c, learner.sampler, run.tokenizer, run.data, record, step=step,
                            rows_file=rows_file, on_batch=lambda done, accuracy:
                            shown.update(done, f"pass@1 {accuracy:.3f}"))


def raise_level(run: Run, accuracy: float, step: int) -> None:
    """A curriculum (task_args curriculum=T): held-out accuracy at T or more raises the task's
    level by one, below its highest. The training rows become the new level's (a new pass of the
    stream, whose state a checkpoint keeps, level included), and so do the held-out rows. Rank 0
    evaluates; every rank takes its answer."""
    cur = run.data.curriculum
    if cur is None:
        return
    up = run.world.is_main and accuracy >= cur.threshold and run.stream.level < cur.max_level
    if not distributed.sum_values({"up": float(up)}, run.world)["up"]:
        return
    level = run.stream.level + 1
    run.stream.set_level(level)          # the training and held-out rows (assembly.prompt_stream)
    run.log(f"curriculum: held-out accuracy {accuracy:.3f} reached {cur.threshold:g} at step {step}: "
            f"level {level - 1} -> {level} ({cur.describe(level)})")


def save(run: Run, step: int, accuracy: float) -> None:
    """A checkpoint after `step`; with async_steps, the groups already sampled for the next
    steps (from older weights) and where the workers' prompt streams stand are in it."""
    ahead, position = None, run.stream
    if run.groups is not None:
        queued, workers_at = run.groups.ahead(step)
        ahead, position = {"queued": queued}, resume.Position(workers_at)
    resume.save(run.run_dir, run.config, run.learner, run.tokenizer, position, step, accuracy,
                run.write_files, ahead, run.data.fingerprints)


def finish(run: Run, tracker) -> None:
    """The pipeline stopped, the sampler and the trackers closed, then rank 0 alone writes
    final/ and the report, and uploads final/ with push_to_hub."""
    c, policy, run_dir = run.config, run.learner.policy, run.run_dir
    if run.groups is not None:
        run.groups.close()
        if run.write_files:
            resume.write_timeline(run_dir, run.groups.timeline)
    run.learner.sampler.close()    # an engine it made, a server's weights files in /dev/shm
    gathered = distributed.full_state_dict(policy) if distributed.is_sharded(policy) else None
    tracker.close()
    # The run's last collective: what follows is rank 0's alone (files, the upload), so a failure
    # there ends the run with rank 0's error while the other processes have already returned.
    distributed.barrier(run.world)
    if not run.write_files:
        return
    write_final(c, policy, run.tokenizer, run_dir, gathered)
    from grpo.run.report import write_report
    try:
        write_report(run_dir)
    except OSError as e:   # the run itself is whole: final/ is written
        if (fault := storage_fault(e)) is None:
            raise
        raise TrainingError(f"cannot write {e.filename or 'the report'}: {fault[0]}; the run is "
                            f"done and {run_dir / 'final'} is written. {fault[1]}, then write the "
                            f"report with `grpo report {run_dir}`") from e
    if c.run.push_to_hub:
        push_final(c.run.push_to_hub, hub_folder(run_dir / "final", run.tokenizer, c.model.dtype,
                                                 run.log), run.log)


def hub_folder(final: Path, tokenizer, dtype: str, log) -> Path:
    """What push_to_hub uploads: final/, or, where final/ is a LoRA adapter whose base only this
    machine has (the run's cold_start/, its tiny base_model/, any local directory), the merged
    model in final/merged (written now unless lora_merge did): the adapter alone would name a
    base that no one who downloads it can load. The merged model is what `model=RUN/final` loads."""
    if not is_adapter_dir(str(final)):
        return final
    base = adapter_base(final)
    if not (Path(base).expanduser().exists() or _looks_like_a_path(base)):
        return final                                  # a hub name: the adapter loads anywhere
    merged = final / "merged"
    if not (merged / "config.json").is_file():
        save_model_dir(load_policy(str(final), dtype), tokenizer, merged)
    log(f"push_to_hub: final/ is a LoRA adapter whose base, {base}, is on this machine only; "
        f"uploading the merged model (base and adapters), {merged}, instead")
    return merged


def _looks_like_a_path(name: str) -> bool:
    """Not a hub name (`name` or `org/name`): absolute, relative, or deeper than one slash."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1


def push_final(repo_id: str, final: Path, log) -> None:
    """`final` (final/, or final/merged: hub_folder) uploaded to `repo_id` (created private when
    it does not exist) in one commit; HF_ENDPOINT, read now, names the hub. A failure is one line:
    the run itself is saved."""
    import os
    from huggingface_hub import HfApi
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
    try:
        api.create_repo(repo_id, exist_ok=True, private=True)
        api.upload_folder(folder_path=str(final), repo_id=repo_id,
                          commit_message="grpo: final/ of the run")
    except Exception as e:  # noqa: BLE001 - the hub client's errors have no common base
        raise TrainingError(f"push_to_hub: {final} could not be uploaded to {repo_id}: {first_line(e)}; "
                            f"the run is saved: upload it later with `hf upload {repo_id} {final}`") from None
    log(f"push_to_hub: {final} uploaded to {repo_id}")


def finished_run(c: TrainConfig, checkpoint: Path, log) -> RunResult:
    """`resume` on a run whose checkpoint is at (or past) `steps`: nothing to train. Said, and the
    run as it is returned (its metrics, and the checkpoint's model); no file is written."""
    from grpo.models import load_tokenizer
    done, run_dir = resume.step_of(checkpoint), Path(c.run.output_dir)
    log(f"resume: the run in {run_dir} is finished: its checkpoint {checkpoint.name} is at step "
        f"{done} of steps={c.run.steps}; nothing to do. Set steps= above {done} to train on from it")
    metrics_file = run_dir / "metrics.jsonl"
    history = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()] \
        if metrics_file.is_file() else []
    return RunResult(run_dir, history, load_policy(str(checkpoint), c.model.dtype),
                     load_tokenizer(str(checkpoint), c.model.chat_template))


def write_final(c: TrainConfig, policy, tokenizer, run_dir: Path, gathered: dict | None = None) -> None:
    """final/ (the adapter alone, with LoRA) and, with lora_merge, final/merged; `gathered`: a
    sharded model's whole state (distributed.full_state_dict, which every rank takes part in)."""
    try:
        save_model_dir(policy, tokenizer, run_dir / "final", gathered)
        if c.model.lora_r and c.model.lora_merge:
            save_model_dir(policy.merge_and_unload(), tokenizer, run_dir / "final" / "merged")
    except CheckpointError as e:
        fault = storage_fault(e)
        then = f"{fault[1]}, then continue" if fault else "Continue"
        raise CheckpointError(f"{e}; {newest_checkpoint_said(run_dir)}. {then} with the same "
                              "command and resume=auto") from e.__cause__


@contextmanager
def storage_faults_said(run_dir: Path):
    """A write that fails for the storage's sake (a full disk, a used-up quota, a read-only file
    system) outside a checkpoint (metrics.jsonl, samples.jsonl, evaluation rows) is a
    TrainingError naming the file, the fault and the newest checkpoint, which is intact: a
    checkpoint is written whole or not at all (checkpoint.write_dir)."""
    try:
        yield
    except Exception as e:   # OSError, and safetensors' error, which wraps one
        if not isinstance(e, OSError) and type(e).__name__ != "SafetensorError":
            raise                # grpo's own errors (a checkpoint's) say it already
        if (fault := storage_fault(e)) is None:
            raise
        named = getattr(e, "filename", None) or next(iter(re.findall(r'at path "([^"]+)"', str(e))), None)
        what = f"cannot write {named}" if named else "a write failed"
        raise TrainingError(f"{what}: {fault[0]}; {newest_checkpoint_said(run_dir)}. {fault[1]}, "
                            "then continue with the same command and resume=auto") from e


def newest_checkpoint_said(run_dir: Path) -> str:
    saved = step_dirs(run_dir / "checkpoints")
    return (f"the newest checkpoint, {saved[-1][1]}, is intact" if saved
            else "no checkpoint was written yet, so resume=auto starts again from step 0")


@contextmanager
def closing_on_error(tracker, groups=None, sampler=None, timeline_dir: Path | None = None):
    """Close the trackers (finishing a W&B or MLflow run), stop the rollout workers (keeping their
    timeline, pipeline.jsonl, in `timeline_dir`) and close the learner's sampler (an engine it
    made, a server's weights files) when the loop stops on an error or a signal."""
    try:
        yield
    except BaseException:
        if groups is not None:
            groups.close()
            if timeline_dir is not None:
                try:
                    resume.write_timeline(timeline_dir, groups.timeline)
                except OSError:
                    pass   # the error under way says more
        if sampler is not None:
            sampler.close()
        try:
            tracker.close()
        except OSError:
            pass   # the error under way says more (a full disk would only be said again)
        raise


