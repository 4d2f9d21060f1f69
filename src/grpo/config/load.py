"""Reading a configuration: YAML files and `key=value` overrides, checked key by key and typed into
the sections; unknown keys explained; the help text and docs/config.md written from the keys'
docstrings."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import re
import inspect
import math
import textwrap
import typing
from pathlib import Path

import yaml

from grpo.config.foreign import FOREIGN_KEYS, named_key
from grpo.config.presets import ALGORITHMS
from grpo.config.rules import validate
from grpo.config.sections import (SECTIONS, ConfigError, LossConfig, RunConfig, TrainConfig,
                                  section_fields)


def _section_of() -> dict[str, tuple[str, dataclasses.Field, type]]:
    """key -> (section attribute, field, section class)."""
    hints = {cls: typing.get_type_hints(cls) for cls in SECTIONS}
    out = {}
    for sfield in section_fields():
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


# How close a misspelling must be for its nearest key to be named: difflib's ratio, twice the
# matching characters over both names' lengths. 0.75 is one slip in a four-letter key (sede: seed)
# and two in an eight-letter one (grup_size: group_size 0.95, lrr: lr 0.8); below it the nearest
# key is a guess, and for another tool's name a wrong one (delta: beta 0.67, vllm_mode: vllm_sleep
# 0.63), so none is named.
NEAR = 0.75


def _ours(path: str) -> str | None:
    """Our key for a name, dotted or not, as another tool nests it: `actor.optim.lr` -> `lr`,
    `actor_rollout_ref.rollout.n` -> `group_size`; None when no key holds it."""
    parts = path.split(".")
    for i in range(len(parts)):                     # the longest known ending wins
        name = ".".join(parts[i:])
        if name in KEYS:
            return name
        if named_key(FOREIGN_KEYS.get(name, "")) in KEYS:
            return named_key(FOREIGN_KEYS[name])
    return None


def _explain_unknown(key: str) -> str:
    """What an unknown key most likely meant: a key's other name (FOREIGN_KEYS), a section, or the
    nearest key, the nearest among our keys and the names other tools give them, when it is NEAR,
    else the keys whose name holds it as a word (at most three)."""
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
    aliases = [name for name, meaning in FOREIGN_KEYS.items()
               if named_key(meaning) in KEYS and "." not in name]
    alias, alias_score = nearest(aliases)
    if max(score, alias_score) < NEAR:
        whole = sorted(k for k in KEYS if re.search(rf"(^|_){re.escape(key)}(_|$)", k))
        if 0 < len(whole) <= 3:                     # warmup: warmup_steps; a word of a key's name
            return f"the keys with '{key}' in their name are {', '.join(repr(k) for k in whole)}"
        return "no key here is close to it"
    if alias_score > score:                         # learnig_rate: learning_rate, which is lr
        ours = named_key(FOREIGN_KEYS[alias])
        return f"the nearest valid key is '{ours}' ('{alias}' is called '{ours}' here)"
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
        sep = "; " if what.startswith(("the nearest", "no key")) else ": "
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
        if isinstance(value, str) and value.lower() in YES_NO:     # YAML 1.1's other booleans
            return YES_NO[value.lower()]
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
    if hint is dict:          # a mapping (task_args): YAML's, or one written on the command line
        if isinstance(value, str) and value.strip():
            try:
                value = yaml.load(value, Loader=_Loader)
            except yaml.YAMLError:
                raise bad("a mapping such as {a: 1, b: 2}") from None
        if value in ("", None):
            return {}
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise bad("a mapping such as {a: 1, b: 2}")
        return dict(value)
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
            out[key.strip()] = yaml.load(raw, Loader=_Loader) if raw.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


class _Twice(Exception):
    def __init__(self, key, first: int, again: int):
        self.key, self.first, self.again = key, first, again


class _Loader(yaml.SafeLoader):
    """YAML's safe loader with YAML 1.2's booleans: true and false alone. YAML 1.1's (PyYAML's)
    also read yes, no, on and off as booleans, so `packing=off` or `mixed_precision: no` would
    reach a key that takes words as False; a key that takes true or false still takes them
    (`_coerce`)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool",
                              re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
YES_NO = {"yes": True, "y": True, "on": True, "no": False, "n": False, "off": False}


class _StrictLoader(_Loader):
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
        if isinstance(value, dict) and not (key in KEYS and KEYS[key][2] is dict):
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
                            for s in section_fields()}, set_keys=frozenset(values))
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
             "Generated from the docstrings of `src/grpo/config/sections.py` by `python -m grpo.config > "
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
