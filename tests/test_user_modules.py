"""A user's own tools and environments, from the files they keep in their working directory: found
as rewards are (in the process that resolves them and in the tools' worker processes), and shown to
the model in every prompt, the environment's methods as the run's tools are."""

import json
import os
import sys

import pytest

from grpo.assembly import ConfigError, agent_of, load_data, prompt_texts
from grpo.config import build_config
from grpo.sampling.episodes import EpisodeLimits, start_episode
from grpo.models import build_tiny_tokenizer
from grpo.agents.tools import Call, ToolError, resolve_tools, run_call
from grpo.agents.environments import EnvironmentError_, environment_factory
from grpo.rewards import REWARDS, RewardError, get_reward
from grpo.sandbox.pool import DeadlinePool

MYTOOLS = '''
import datetime
import os


def weekday(date: str) -> str:
    """The day of the week of a date.

    Args:
        date: the date, as YYYY-MM-DD
    """
    return datetime.date.fromisoformat(date).strftime("%A")


def whereabouts() -> str:
    """The process this tool runs in, and its working directory."""
    return f"{os.getpid()} {os.getcwd()}"


def shade(lightness: float) -> str:
    """Where the standard library's colorsys comes from, in the process that runs the tool."""
    import colorsys
    return colorsys.__file__
'''

KVENV = '''
class KVStore:
    """Store numbers under names; the episode ends on the first turn without a call."""

    def reset(self, row: dict):
        self.store = {}
        return None

    def step(self, action: str):
        return None, float(len(self.store)), True

    def put(self, key: str, value: int = 0) -> str:
        """Store a number under a name.

        Args:
            key: the name to store it under
            value: the number
        """
        self.store[key] = value
        return f"{key}={value}"

    def _helper(self):
        return "not a tool: private"
'''

USER_MODULES = ("mytools", "kvenv", "badenv", "brokenmod", "sharedname", "myrewards", "agentpkg")


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A user's directory holding mytools.py and kvenv.py, made the working directory, with no
    PYTHONPATH and nothing of it on sys.path (restored afterwards, with sys.modules and the
    tools' worker processes)."""
    from grpo.agents import tools
    (tmp_path / "mytools.py").write_text(MYTOOLS)
    (tmp_path / "kvenv.py").write_text(KVENV)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    for name in USER_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield tmp_path
    for target in [t for t in tools._POOLS if t.split(":")[0].split(".")[0] in USER_MODULES]:
        tools._POOLS.pop(target)[0].close()
    for name in [m for m in sys.modules if m.split(".")[0] in USER_MODULES]:
        del sys.modules[name]


# ---- Item 3: found where the user keeps them --------------------------------------------------

def test_a_tool_from_the_working_directory_resolves_and_runs_in_its_worker_process(user_dir):
    tools = resolve_tools(["mytools:weekday", "mytools:whereabouts"])
    assert tools["weekday"].runs == "process"            # a module-level function: in a worker
    assert run_call(Call("weekday", {"date": "2024-05-01"}), tools, 30.0).text == "Wednesday"
    pid, cwd = run_call(Call("whereabouts", {}), tools, 30.0).text.split(" ", 1)
    assert int(pid) != os.getpid() and cwd == str(user_dir)   # another process, the user's directory


def test_the_working_directory_never_hides_a_module_the_library_or_a_worker_imports(user_dir):
    # colorsys.py in the user's directory: the standard library's stays the one the tool's worker
    # imports (a worker started with the working directory first would take the user's file).
    if sys.version_info < (3, 11):
        pytest.skip("python -P (a worker without the working directory first) is 3.11+")
    (user_dir / "colorsys.py").write_text("raise ImportError('the user file, not the library')\n")
    sys.modules.pop("colorsys", None)
    tools = resolve_tools(["mytools:shade"])
    where = run_call(Call("shade", {"lightness": 0.5}), tools, 30.0)
    assert not where.failed and not where.text.startswith(str(user_dir)), where.text
    import colorsys                                          # and in this process too
    assert not colorsys.__file__.startswith(str(user_dir))


def test_the_named_module_is_taken_from_the_working_directory_first(user_dir, tmp_path_factory,
                                                                    monkeypatch):
    elsewhere = tmp_path_factory.mktemp("site")
    (elsewhere / "sharedname.py").write_text("def f() -> str:\n    '''Doc.'''\n    return 'elsewhere'\n")
    (user_dir / "sharedname.py").write_text("def f() -> str:\n    '''Doc.'''\n    return 'here'\n")
    monkeypatch.syspath_prepend(str(elsewhere))              # as an installed module would be
    assert resolve_tools(["sharedname:f"])["f"].fn() == "here"


@pytest.mark.parametrize("package", ["a package", "a plain directory"])
def test_a_tool_in_a_package_of_the_working_directory(user_dir, package):
    (user_dir / "agentpkg").mkdir()
    if package == "a package":
        (user_dir / "agentpkg" / "__init__.py").write_text("")
    (user_dir / "agentpkg" / "units.py").write_text(MYTOOLS)
    tools = resolve_tools(["agentpkg.units:weekday"])
    assert run_call(Call("weekday", {"date": "2024-05-04"}), tools, 30.0).text == "Saturday"


def test_an_environment_from_the_working_directory_answers_its_methods_calls(user_dir):
    agent = agent_of(build_config({"environment": "kvenv:KVStore"}))
    assert agent.make_env.__module__ == "kvenv"
    episode = start_episode({"prompt": "p"}, agent.make_env, agent.tools, EpisodeLimits())
    assert sorted(episode.tools) == ["put"]                  # not reset, step or _helper
    answer = run_call(Call("put", {"key": "a", "value": 3}), episode.tools, 5.0)
    assert answer.text == "a=3" and episode.env.store == {"a": 3}   # bound to this episode


def test_a_reward_tool_and_environment_from_the_working_directory_in_one_run(user_dir):
    (user_dir / "myrewards.py").write_text(
        "def brevity(prompts, completions, **columns):\n    return [0.0 for c in completions]\n")
    data = load_data(build_config({"rewards": ["myrewards:brevity"], "tools": ["mytools:weekday"],
                                   "environment": "kvenv:KVStore"}))
    assert [fn.__module__ for fn in data.reward_fns] == ["myrewards"]
    assert list(data.agent.tools) == ["weekday"] and data.agent.make_env.__name__ == "KVStore"


@pytest.mark.parametrize("values, message", [
    ({"tools": ["nosuch:weekday"]},
     r"config key 'tools': tool 'nosuch:weekday': cannot import module 'nosuch': no nosuch.py in "
     r"the working directory \(.+\) nor on Python's path"),
    ({"tools": ["mytools:weekdy"]},
     r"config key 'tools': tool 'mytools:weekdy': module 'mytools' has no function 'weekdy' \(did "
     r"you mean 'weekday'\?\); it was read from .+mytools.py"),
    ({"tools": ["brokenmod:f"]},
     r"config key 'tools': tool 'brokenmod:f': cannot import module 'brokenmod' \(SyntaxError: "
     r".*brokenmod.py, line 1"),
    ({"tools": ["json:weekday"]},
     r"config key 'tools': tool 'json:weekday': module 'json' has no function 'weekday'; it was "
     r"read from .+json/__init__.py; .+/json.py was not read, as a module named 'json' was "
     r"imported before it: rename your file"),
    ({"environment": "nosuch:KVStore"},
     r"config key 'environment': environment 'nosuch:KVStore': cannot import module 'nosuch': no "
     r"nosuch.py in the working directory"),
    ({"environment": "kvenv:KVstore"},
     r"config key 'environment': environment 'kvenv:KVstore': module 'kvenv' has no class or "
     r"function 'KVstore' \(did you mean 'KVStore'\?\)"),
    ({"environment": "badenv:NOT_A_CLASS"},
     r"config key 'environment': environment 'badenv:NOT_A_CLASS' is not a class or a function "
     r"that makes one \(its type is int\)"),
    ({"environment": "badenv:NoStep"},
     r"config key 'environment': environment 'badenv:NoStep': NoStep has no step\(\); an "
     r"environment has reset\(row\) and step\(action\)"),
    ({"environment": "badenv:NeedsSize"},
     r"config key 'environment': environment 'badenv:NeedsSize': making one raised TypeError: .*"
     r"'size' \(an environment is made with no arguments, once per episode\)"),
    ({"environment": "badenv:Untyped"},
     r"config key 'environment': environment 'badenv:Untyped': tool 'peek': parameter 'key' has "
     r"no type hint. Its public methods are the episode's tools: give peek type hints and a "
     r"docstring, or name it _peek to keep it from the model"),
    ({"environment": "badenv:Clash", "tools": ["mytools:weekday"]},
     r"config key 'environment': environment 'badenv:Clash': its method 'weekday' has the name of "
     r"one of the run's tools; rename one"),
])
def test_every_bad_tool_or_environment_is_named_with_its_key_and_module(user_dir, values, message):
    (user_dir / "brokenmod.py").write_text("def f(:\n")
    (user_dir / "json.py").write_text("def weekday(x: str) -> str:\n    '''Doc.'''\n")
    (user_dir / "badenv.py").write_text(BADENV)
    with pytest.raises(ConfigError, match=message):
        load_data(build_config(values))


BADENV = '''
NOT_A_CLASS = 3


class NoStep:
    def reset(self, row):
        return None


class NeedsSize:
    def __init__(self, size):
        self.size = size


class Untyped:
    def reset(self, row):
        return None

    def step(self, action):
        return None, 0.0, True

    def peek(self, key):
        """Look a key up."""


class Clash(Untyped):
    def peek(self) -> str:
        """Nothing to see."""
        return ""

    def weekday(self, date: str) -> str:
        """The environment's own weekday."""
        return date
'''


# ---- Item 2: the environment's tools in the prompt, as the run's tools are ---------------------

PUT_SCHEMA = {"type": "function", "function": {
    "name": "put", "description": "Store a number under a name.",
    "parameters": {"type": "object", "properties": {
        "key": {"type": "string", "description": "the name to store it under"},
        "value": {"type": "integer", "description": "the number"}}, "required": ["key"]}}}

# A template that renders tools when it is given them (apply_chat_template(..., tools=...)), as
# Qwen2.5's does in its system message.
RENDERS_TOOLS = ("{%- if tools %}<tools>{%- for t in tools %}{{ t | tojson }};{%- endfor %}</tools>"
                 "{%- endif %}{%- for m in messages %}<{{ m.role }}>{{ m.content }}{%- endfor %}"
                 "{%- if add_generation_prompt %}<assistant>{%- endif %}")


def test_the_plain_prompt_lists_the_environments_methods_as_the_run_tools_are(user_dir):
    tok = build_tiny_tokenizer()
    rows = [{"prompt": "2024-05-01?"}]
    env_only = build_config({"environment": "kvenv:KVStore"})
    assert prompt_texts(env_only, tok, rows, agent_of(env_only)) == ["<tools>put(key, value)</tools>\n2024-05-01?"]
    assert [t.schema for t in agent_of(env_only).shown] == [PUT_SCHEMA]
    both = build_config({"environment": "kvenv:KVStore", "tools": ["mytools:weekday"]})
    assert prompt_texts(both, tok, rows, agent_of(both)) == ["<tools>weekday(date) put(key, value)</tools>\n2024-05-01?"]


def test_the_hermes_description_holds_the_methods_schema(user_dir):
    tok = build_tiny_tokenizer()
    config = build_config({"environment": "kvenv:KVStore", "tools": ["mytools:weekday"],
                           "tool_format": "hermes"})
    text = prompt_texts(config, tok, [{"prompt": "q"}], agent_of(config))[0]
    body = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].splitlines()
    assert [json.loads(line)["function"]["name"] for line in body] == ["weekday", "put"]
    assert json.loads(body[1]) == PUT_SCHEMA
    assert text.endswith("</tool_call>.\nq")


def test_the_chat_template_is_given_the_methods_schemas_with_the_run_tools(user_dir):
    tok = build_tiny_tokenizer()
    tok.chat_template = RENDERS_TOOLS
    config = build_config({"environment": "kvenv:KVStore", "tools": ["mytools:weekday"],
                           "tool_format": "hermes"})
    weekday = resolve_tools(["mytools:weekday"])["weekday"].schema
    assert prompt_texts(config, tok, [{"prompt": "q"}], agent_of(config)) == [
        f"<tools>{json.dumps(weekday)};{json.dumps(PUT_SCHEMA)};</tools><user>q<assistant>"]


def test_explain_shows_the_environments_tools_in_the_prompt(user_dir, tiny_model_dir, capsys):
    from grpo.commands.cli import main
    main(["explain", f"model={tiny_model_dir}", "environment=kvenv:KVStore",
          "tools=[mytools:weekday]", "sft_steps=0", "group_size=2", "max_new_tokens=4",
          "max_turns=1", "threads=1"])
    out = capsys.readouterr().out
    prompt = " ".join(out[out.index("Prompt"):].split())     # the console wraps long lines
    assert "'<tools>weekday(date) put(key, value)</tools>\\n" in prompt


# ---- A file given by its path: `file.py:object` (sandbox/usercode.py) --------------------------

MYREWARDS = '''
import os


def brevity(prompts, completions, **columns):
    return [1.0 / (1 + len(c)) for c in completions]


def where(prompts, completions, **columns):
    return [float(os.getpid()) for c in completions]


NOT_A_FUNCTION = 3
'''

NAMED = '''
def module_name() -> str:
    """The name of this file's module in the process that runs the tool."""
    return __name__
'''


@pytest.fixture
def file_dir(user_dir):
    """user_dir, with mytools.py, kvenv.py and myrewards.py; the modules of files read by their
    paths, and their tools' worker processes, gone afterwards."""
    from grpo.agents import tools
    (user_dir / "myrewards.py").write_text(MYREWARDS)
    yield user_dir
    for target in [t for t in tools._POOLS if t.startswith("user_file_")]:
        tools._POOLS.pop(target)[0].close()
    for name in [m for m in sys.modules if m.startswith("user_file_")]:
        del sys.modules[name]


def test_a_reward_tool_and_environment_from_a_file_of_the_working_directory(file_dir):
    assert get_reward("myrewards.py:brevity")(["p"], ["abc"]) == [0.25]
    tools = resolve_tools(["mytools.py:weekday"])
    assert tools["weekday"].runs == "process"            # a module-level function: in a worker
    assert run_call(Call("weekday", {"date": "2024-05-01"}), tools, 30.0).text == "Wednesday"
    make_env = environment_factory("kvenv.py:KVStore")
    assert make_env.__name__ == "KVStore"
    episode = start_episode({"prompt": "p"}, make_env, {}, EpisodeLimits())
    assert sorted(episode.tools) == ["put"]                  # not reset, step or _helper
    assert run_call(Call("put", {"key": "a", "value": 3}), episode.tools, 5.0).text == "a=3"
    assert episode.env.store == {"a": 3}


def test_files_in_a_directory_by_their_paths_import_their_neighbours(file_dir):
    parts = file_dir / "agent" / "parts"
    parts.mkdir(parents=True)
    (parts / "scale.py").write_text("FACTOR = 2.0\n")
    (parts / "rewards.py").write_text("from scale import FACTOR\n\n\n"
                                      "def doubled(prompts, completions, **columns):\n"
                                      "    return [FACTOR * len(c) for c in completions]\n")
    (parts / "tools.py").write_text(MYTOOLS + NAMED)
    (parts / "env.py").write_text(KVENV)
    assert get_reward("agent/parts/rewards.py:doubled")(["p"], ["ab"]) == [4.0]
    tools = resolve_tools(["agent/parts/tools.py:weekday", "agent/parts/tools.py:whereabouts",
                           "agent/parts/tools.py:module_name"])
    assert run_call(Call("weekday", {"date": "2024-05-04"}), tools, 30.0).text == "Saturday"
    pid, cwd = run_call(Call("whereabouts", {}), tools, 30.0).text.split(" ", 1)
    assert int(pid) != os.getpid() and cwd == str(file_dir)   # another process, the user's directory
    # the worker reads the file under the name it has here: what one pickles, the other unpickles
    assert run_call(Call("module_name", {}), tools, 30.0).text == tools["module_name"].fn.__module__
    make_env = environment_factory(f"{parts / 'env.py'}:KVStore")     # an absolute path too
    assert make_env().reset({}) is None


def test_a_reward_from_a_file_runs_in_a_deadline_pools_worker_by_its_target(file_dir):
    fn = get_reward("myrewards.py:where")
    pool = DeadlinePool(fn, workers=1, deadline_s=60.0)
    try:
        assert pool.target == f"{os.path.realpath(file_dir / 'myrewards.py')}:where"
        [(kind, value)] = pool.run([((["p"], ["c"]), {})])
    finally:
        pool.close()
    assert kind == "ok" and len(value) == 1 and value != [float(os.getpid())]


LOOKUPS = {"reward function": (get_reward, RewardError),
           "tool": (lambda name: resolve_tools([name]), ToolError),
           "environment": (environment_factory, EnvironmentError_)}


@pytest.mark.parametrize("what, name, message", [
    ("reward function", "brevity",
     f"unknown reward function 'brevity'; built-ins are {sorted(REWARDS)}, or give your own as "
     "module:function"),
    ("tool", "weekday",
     "unknown tool 'weekday'; built-ins are ['calculator', 'python'], or give your own as "
     "module:function"),
    ("environment", "KVStore",
     "unknown environment 'KVStore'; built-ins are ['guess_number'], or give your own as "
     "module:Class"),
    ("reward function", "nofile.py:brevity",
     "reward function 'nofile.py:brevity': cannot read file 'nofile.py': no such file (looked "
     "for {dir}/nofile.py)"),
    ("tool", "agent/nofile.py:weekday",
     "tool 'agent/nofile.py:weekday': cannot read file 'agent/nofile.py': no such file (looked "
     "for {dir}/agent/nofile.py)"),
    ("environment", "nofile.py:KVStore",
     "environment 'nofile.py:KVStore': cannot read file 'nofile.py': no such file (looked for "
     "{dir}/nofile.py)"),
    ("reward function", "myrewards.py:brevty",
     "reward function 'myrewards.py:brevty': file 'myrewards.py' has no function 'brevty' (did "
     "you mean 'brevity'?); it was read from {dir}/myrewards.py"),
    ("environment", "kvenv.py:KVstore",
     "environment 'kvenv.py:KVstore': file 'kvenv.py' has no class or function 'KVstore' (did "
     "you mean 'KVStore'?); it was read from {dir}/kvenv.py"),
    ("reward function", "myrewards.py:NOT_A_FUNCTION",
     "reward function 'myrewards.py:NOT_A_FUNCTION' is not a function (its type is int)"),
    ("tool", "broken.py:f",
     "tool 'broken.py:f': cannot import file 'broken.py' (SyntaxError: "),
])
def test_an_unknown_name_or_a_missing_file_is_one_error_naming_it(file_dir, what, name, message):
    (file_dir / "broken.py").write_text("def f(:\n")
    lookup, error = LOOKUPS[what]
    with pytest.raises(error) as raised:
        lookup(name)
    assert str(raised.value).startswith(message.format(dir=os.path.realpath(file_dir)))
