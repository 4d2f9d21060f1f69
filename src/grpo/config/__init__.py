"""Typed, frozen configuration: one dataclass per concern, flat plain-named keys.

Every key is unique across the sections, so a YAML file and `key=value` overrides stay flat:
`grpo train run.yaml group_size=16 lr=1e-5`. The defaults are the built-in demo: a tiny model, cold
start on the `largest` task's demonstrations, then GRPO.

    sections.py   the section dataclasses, each key's default and docstring (its help text)
    load.py       YAML files and `key=value` overrides read and typed; unknown keys explained;
                  `grpo train --help` and docs/config.md written from the docstrings
    foreign.py    names from TRL, transformers and verl, and what each is here (for unknown keys'
                  errors), and what TRL's values of loss_type are here
    rules.py      each numeric key's range and the rules across keys, one table of named checks
    presets.py    `algorithm=NAME`: the keys each paper sets
    plan.py       what the config decides about the algorithm, decided once at start
"""

from grpo.config.load import (FOREIGN_KEYS, KEYS, VISION_DEMO, build_config, field_docs, help_text,
                              implied_keys, load_config, load_yaml, nested_section_error,
                              parse_overrides, reference_markdown, to_yaml, unknown_keys_error)
from grpo.config.presets import ALGORITHMS
from grpo.config.rules import BOUNDS, RULES, UNBOUNDED, Bound, Rule, sampler_own_keys, validate
from grpo.config.sections import (SECTIONS, AgentConfig, ConfigError, DataConfig, EvalConfig,
                                  LossConfig, ModelConfig, OptimConfig, PipelineConfig, RewardConfig,
                                  RunConfig, SamplingConfig, TrainConfig)

__all__ = ["TrainConfig", "ConfigError", "load_config", "build_config", "help_text", "to_yaml",
           "ALGORITHMS", "KEYS",
           # the rest of what the modules hold, for the code and tests that import it from here
           "SECTIONS", "AgentConfig", "DataConfig", "EvalConfig", "LossConfig", "ModelConfig",
           "OptimConfig", "PipelineConfig", "RewardConfig", "RunConfig", "SamplingConfig",
           "FOREIGN_KEYS", "VISION_DEMO", "field_docs", "implied_keys", "load_yaml",
           "nested_section_error", "parse_overrides", "reference_markdown", "unknown_keys_error",
           "BOUNDS", "RULES", "UNBOUNDED", "Bound", "Rule", "sampler_own_keys", "validate"]
