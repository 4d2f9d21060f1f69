"""A run put together from its config: the start-up parts, every start-up check, and `assemble`.

    checks.py   every start-up check, and the order `assemble` runs them in
    data.py     rows of the task or the files, with the rows and model given from Python
    rewards.py  the reward functions and every term of the reward, with where each came from
    model.py    the model and tokenizer (a hub name, a directory, a run, the tiny models), LoRA
    learner.py  the policy GRPO starts from (cold start or resume), the learner, the samplers
    groups.py   where step t's groups come from (Plan.groups): inline, workers or a client
    evaluation.py  what `grpo eval` evaluates (a run's weights and keys) and where results go
    run.py      assemble(config) -> Run, complete when returned (or Finished); the rows and model
                of the commands that do not train (eval, explain, sft), checked the same way

What a run is given besides its model (Data, Agent, prompt_texts) is `grpo.inputs`, in the steps
layer, as the pipeline and evaluation read it too.
"""

from grpo.assembly.checks import (check_choices, check_lr, check_pipeline, check_selection,
                                  fit_prompts, unseen_model)
from grpo.assembly.data import load_data, with_given
from grpo.assembly.evaluation import EvalSetup, eval_setup, results_file, setup_of
from grpo.assembly.learner import (cold_start, make_learner, make_sampler, resume_or_cold_start,
                                   with_fresh_adapter)
from grpo.assembly.model import (add_lora, given_model, load_model_and_tokenizer, run_dir_of,
                                 run_settings, run_weights, seed_everything, set_checkpointing)
from grpo.assembly.rewards import choose_accuracy, rewards_comment
from grpo.assembly.run import (Evaluation, Finished, Loaded, Run, assemble, assemble_command,
                               assemble_evaluation)
from grpo.config import ConfigError
from grpo.inputs import Agent, Data, RewardUse, accuracy_text, agent_of, call_format_of, prompt_texts

__all__ = ["assemble", "Run", "Finished", "EvalSetup", "eval_setup", "setup_of", "results_file", "assemble_evaluation", "Evaluation",
           "assemble_command", "Loaded", "Data", "Agent", "RewardUse", "ConfigError",
           "load_data", "with_given", "load_model_and_tokenizer", "given_model", "add_lora",
           "set_checkpointing", "seed_everything", "run_dir_of", "run_settings", "run_weights",
           "make_learner", "make_sampler", "cold_start", "resume_or_cold_start",
           "with_fresh_adapter", "agent_of", "call_format_of", "prompt_texts", "accuracy_text",
           "choose_accuracy", "rewards_comment", "check_choices", "check_lr", "check_pipeline",
           "check_selection", "fit_prompts", "unseen_model"]
