"""Multi-turn episodes with tools and environments: schemas, parsing, failures, and the exactness
of the token-in token-out trajectory (cache continuation, masks, loss)."""

import json
import time
from typing import Literal, Optional

import pytest
import torch

from grpo.agents.environments import GuessNumber, Step
from grpo.sampling.episodes import EpisodeLimits, sample_episodes
from grpo.algorithm.loss import AGGREGATIONS, LossSettings, policy_loss
from grpo.models import build_tiny, load_policy, load_tokenizer, token_logprobs
from grpo.agents.tools import (Call, ToolError, calculator, make_tool, parse_hermes, parse_plain,
                               resolve_tools, run_call)

from bad_tools import boom, sleepy, tower


# ---- Tools: schemas from signatures and docstrings ---------------------------------------------

def lookup(city: str, days: int = 1, unit: Literal["c", "f"] = "c", note: Optional[str] = None) -> str:
    """Look up the weather.

    Args:
        city: where
        days (int): how many days ahead
    """
    return f"{city}:{days}{unit}"


def test_a_schema_from_the_signature_and_docstring():
    assert make_tool(lookup).schema == {"type": "function", "function": {
        "name": "lookup", "description": "Look up the weather.",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "description": "where"},
            "days": {"type": "integer", "description": "how many days ahead"},
            "unit": {"type": "string", "enum": ["c", "f"]},
            "note": {"type": "string", "nullable": True}}}}}


def no_hint(x) -> str:
    """Doc."""


def star(*numbers: int) -> int:
    """Doc."""


def odd_type(x: complex) -> str:
    """Doc."""


def undocumented(x: int) -> int:
    return x


@pytest.mark.parametrize("fn,message", [
    (no_hint, "tool 'no_hint': parameter 'x' has no type hint"),
    (star, "tool 'star': parameter 'numbers' is \\*args or \\*\\*kwargs"),
    (odd_type, "tool 'odd_type', parameter 'x': type .*complex.* has no JSON schema"),
    (undocumented, "tool 'undocumented': it has no docstring"),
])
def test_a_tool_that_cannot_become_a_schema_is_refused_naming_the_parameter(fn, message):
    with pytest.raises(ToolError, match=message):
        make_tool(fn)


def test_refused_at_start_through_the_config(tmp_path, monkeypatch):
    import sys
    from grpo.assembly import ConfigError, load_data
    from grpo.config import build_config
    (tmp_path / "mytools.py").write_text("def bad(x):\n    '''Doc.'''\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("mytools", None)
    with pytest.raises(ConfigError, match="config key 'tools': tool 'bad': parameter 'x' has no type hint"):
        load_data(build_config({"tools": ["mytools:bad"]}))


# ---- Calls in the model's text --------------------------------------------------------------------

TOOLS = resolve_tools(["calculator"])


def test_plain_and_hermes_calls_are_parsed():
    assert parse_plain("x<call>calculator 12*3</call>", TOOLS) == [Call("calculator", {"expression": "12*3"})]
    assert parse_plain('<call>calculator {"expression": "1+1"}</call>', TOOLS) == \
        [Call("calculator", {"expression": "1+1"})]
    text = '<tool_call>{"name": "calculator", "arguments": {"expression": "2*2"}}</tool_call>'
    assert parse_hermes(text, TOOLS) == [Call("calculator", {"expression": "2*2"})]
    assert parse_hermes('<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1\\"}"}'
                        '</tool_call>', TOOLS)[0].arguments == {"expression": "1"}
    malformed = parse_hermes("<tool_call>{not json</tool_call>", TOOLS)
    assert malformed[0].error and "malformed tool call" in malformed[0].error


def test_every_failure_becomes_what_the_model_reads():
    tools = resolve_tools(["calculator", boom, sleepy])
    raised = run_call(Call("boom", {"x": 1}), tools, 1.0)
    assert (raised.failed, raised.kind, raised.text) == (True, "error", "error: RuntimeError: it broke")
    unknown = run_call(Call("nope", {}), tools, 1.0)
    assert unknown.kind == "unknown" and "the tools are ['boom', 'calculator', 'sleepy']" in unknown.text
    bad_args = run_call(Call("calculator", {"expr": "1"}), tools, 1.0)
    assert bad_args.failed and "TypeError" in bad_args.text
    assert run_call(Call("sleepy", {"seconds": 0}), tools, 1.0).text == "woke"   # its worker is up
    started = time.monotonic()
    hung = run_call(Call("sleepy", {"seconds": 30}), tools, 0.3)
    assert hung.kind == "timeout" and time.monotonic() - started < 2
    assert run_call(Call("calculator", {"expression": "(2 + 3) ** 2 - 7 // 2"}), tools, 1.0).text == "22"
    refused = run_call(Call("calculator", {"expression": "__import__('os').getpid()"}), tools, 1.0)
    assert refused.failed and "not arithmetic" in refused.text


def test_each_tool_keeps_its_deadline_by_killing_a_process_where_it_can():
    from grpo.agents.environments import public_methods
    tools = resolve_tools(["calculator", "python", boom])
    assert {name: t.runs for name, t in tools.items()} == \
        {"calculator": "process", "python": "itself", "boom": "process"}
    closure = make_tool(lambda_like_closure())
    method = make_tool(public_methods(Counter())["add"], "add")
    assert (closure.runs, method.runs) == ("thread", "thread")   # they share the trainer's state


def lambda_like_closure():
    def count_words(text: str) -> int:
        """Count words."""
        return len(text.split())
    return count_words


class Counter:
    def __init__(self):
        self.total = 0

    def add(self, n: int) -> int:
        """Add to the episode's total."""
        self.total += n
        return self.total


def test_a_tool_computing_in_c_past_its_deadline_is_killed_and_its_worker_replaced():
    # In a thread, 9 ** 9 ** 9 held the interpreter's lock: the deadline could not even return.
    tools = resolve_tools([tower])
    assert run_call(Call("tower", {"height": 2}), tools, 5.0).text == str(9 ** 9)
    started = time.monotonic()
    stuck = run_call(Call("tower", {"height": 3}), tools, 0.5)
    assert stuck.kind == "timeout" and time.monotonic() - started < 5
    assert run_call(Call("tower", {"height": 1}), tools, 5.0).text == "9"   # a fresh worker


@pytest.mark.parametrize("expression", ["(((9**99)**99)**99)**99", "9**9**9", "2**(10**400)",
                                        "(10**600)*(10**600)", "1" + "*9" * 2000])
def test_the_calculator_refuses_a_result_too_large_before_computing_it(expression):
    started = time.monotonic()
    refused = run_call(Call("calculator", {"expression": expression}), TOOLS, 1.0)
    assert refused.failed and refused.kind == "error" and time.monotonic() - started < 10
    assert "the calculator refuses to compute it" in refused.text or "at most 1,000" in refused.text
    with pytest.raises(ValueError, match="more than 1,000 digits"):
        calculator("(((9**99)**99)**99)**99")
    assert calculator("2 ** 3000") == str(2 ** 3000)        # 904 digits: computed


def test_the_python_tools_cap_cuts_the_output_and_keeps_the_result():
    # The cap used to cut the result line itself: "the program could not be run" past ~9 KB.
    from grpo.agents.tools import python_tool
    python = python_tool(isolate=False)       # a program that only prints; isolation is tested below
    assert python("print('x' * 20000)") == "x" * 8192 + "\n[output cut at 8 KiB]"
    assert python("print('\\x01' * 9000, end='')") == "\x01" * 8192 + "\n[output cut at 8 KiB]"
    assert python("print('é' * 100)") == "é" * 100 + "\n"
    tools = {"python": make_tool(python, "python")}
    started = time.monotonic()
    hung = run_call(Call("python", {"code": "while True: pass"}), tools, 1.0)
    assert hung.text == "error: the program did not finish within 1 s"
    assert time.monotonic() - started < 10
    long = run_call(Call("python", {"code": "print('y' * 5000)"}), tools, 5.0)
    assert long.text == "y" * 2000 + "\n[cut at 2,000 characters]"


def test_the_python_tools_timeout_is_a_failed_call_of_kind_timeout():
    # It used to come back as kind "ok", so episode/tool_failure_rate did not count it.
    from grpo.agents.tools import python_tool
    tools = {"python": make_tool(python_tool(isolate=False), "python")}
    hung = run_call(Call("python", {"code": "while True: pass"}), tools, 1.0)
    assert (hung.failed, hung.kind, hung.text) == (
        True, "timeout", "error: the program did not finish within 1 s")
    crashed = run_call(Call("python", {"code": "1/0"}), tools, 5.0)
    assert (crashed.failed, crashed.kind, crashed.text) == (True, "error", "error: exit status 256")
    fine = run_call(Call("python", {"code": "print(6*7)"}), tools, 5.0)
    assert (fine.failed, fine.kind, fine.text) == (False, "ok", "42\n")


def test_the_python_tool_runs_in_the_sandbox():
    from grpo.sandbox.isolate import isolation_level
    if isolation_level() != "full":
        pytest.skip("needs root for the sandbox")
    python = resolve_tools(["python"])["python"].fn
    assert python("print(sum(range(10)))") == "45\n"
    assert python("import os\nprint(os.getuid() >= 200000)") == "True\n"
    assert python("while True: pass").startswith("error:")


# ---- Episodes on the KV cache: exactness ----------------------------------------------------------

@pytest.fixture(scope="module")
def talker(tmp_path_factory):
    """A tiny model taught to answer one digit and stop, so episodes have several turns."""
    import random
    from grpo.sft import supervised_finetune
    path = build_tiny(tmp_path_factory.mktemp("talker"), hidden_size=64, layers=2, heads=2)
    tok, model = load_tokenizer(str(path)), load_policy(str(path))
    rng = random.Random(0)
    pairs = [(f"guess {rng.randint(0, 9)}:", str(rng.randint(1, 9))) for _ in range(256)]
    supervised_finetune(model, tok, pairs, steps=30, lr=3e-3, batch_size=32, seed=0)
    return model, tok


class Scripted:
    """Answers each turn with a fixed observation; done after three turns; reward per turn."""
    answers = ["higher and higher", "lo", "done"]

    def reset(self, row):
        self.turn = 0
        return "start:"

    def step(self, action):
        self.turn += 1
        return Step(self.answers[self.turn - 1] if self.turn < 3 else None, 0.5 * self.turn,
                    self.turn == 3)


def test_episode_ids_are_the_turns_concatenated_and_the_cache_matches_a_fresh_forward(talker):
    model, tok = talker
    torch.manual_seed(0)
    r = sample_episodes(model, tok, ["guess 3:", "guess 7:"], [{"_row": 0}, {"_row": 1}], 3,
                        make_env=Scripted, tools={}, call_format="plain",
                        limits=EpisodeLimits(max_turns=4, turn_tokens=6, episode_tokens=80))
    obs = [tok(t, add_special_tokens=False).input_ids for t in ["start:"] + Scripted.answers[:2]]
    checked = 0
    for i in range(len(r)):
        ids = r.completion_ids[i][r.context_mask[i].bool()].tolist()
        policy = r.completion_mask[i][r.context_mask[i].bool()].bool().tolist()
        # rebuild the sequence from its parts: observation, turn, observation, turn, ...
        runs, start = [], 0
        for end in range(1, len(ids) + 1):
            if end == len(ids) or policy[end] != policy[start]:
                runs.append((policy[start], ids[start:end]))
                start = end
        env_runs = [t for by_policy, t in runs if not by_policy]
        assert env_runs == obs[:len(env_runs)]              # each answer tokenized once, as is
        assert sum(len(t) for _, t in runs) == len(ids)
        if r.episodes.turns[i] == 3 and not r.truncated[i]:
            assert r.episodes.turn_rewards[i] == [0.5, 1.0, 1.5]
            assert r.episodes.env_reward[i] == 3.0
            checked += 1
    assert checked >= 1, "no episode ran its three turns; the fixture's model no longer stops"
    logp, _ = token_logprobs(model, r.input_ids, r.attention_mask, r.completion_ids.shape[1],
                             completion_mask=r.completion_mask)
    # The sampler's log-probs came from the cache, turn after turn (answers appended with extend);
    # a fresh forward over each whole history gives the same numbers.
    assert (logp - r.sampler_logprobs).abs().max().item() < 1e-5
    assert ((r.sampler_logprobs != 0) & (r.completion_mask == 0)).sum() == 0


def test_a_guess_number_game_depends_on_earlier_guesses():
    env = GuessNumber(high=16)
    env.reset({"secret": 11})
    assert [env.step(g).observation for g in ["8", "12", "x"]] == ["higher", "lower", "say a number"]
    final = env.step("I say 11")
    assert final.done and final.reward == pytest.approx(1.0 - 0.1 * 3)


def test_an_environment_whose_reset_fails_names_the_row(talker):
    from grpo.agents.environments import EnvironmentError_
    model, tok = talker

    class Broken:
        def reset(self, row):
            raise KeyError("secret")

        def step(self, action):
            return Step()

    with pytest.raises(EnvironmentError_, match=r"reset failed on row 8 \(KeyError: 'secret'\)"):
        sample_episodes(model, tok, ["guess 1:"], [{"_row": 7}], 2, make_env=Broken, tools={},
                        call_format="plain", limits=EpisodeLimits())


def test_the_loss_sees_policy_tokens_only():
    # Two episodes, T = 6: policy tokens at 0,1 and 4 (row 0), 0..2 (row 1); the rest are the
    # environment's. The same numbers with the environment's columns removed make a single-turn
    # batch of T = 3. Loss and gradient must agree, for every aggregation.
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 0]])
    logp = torch.randn(2, 6) * 0.1 - 1
    old = logp.detach() + torch.randn(2, 6) * 0.05
    ref = logp.detach() + torch.randn(2, 6) * 0.05
    adv = torch.tensor([1.5, -0.5])
    keep = [[0, 1, 4], [0, 1, 2]]
    compact = lambda x: torch.stack([x[i, k] for i, k in enumerate(keep)])   # noqa: E731
    for aggregation in AGGREGATIONS:
        a = logp.clone().requires_grad_()
        b = compact(logp).clone().requires_grad_()
        loss_a, _ = policy_loss(a, old, ref, adv, mask, AGGREGATIONS[aggregation](mask, 6),
                                LossSettings(loss_type="clip", beta=0.04, kl_estimator="k3"))
        ones = torch.ones(2, 3, dtype=torch.long)
        loss_b, _ = policy_loss(b, compact(old), compact(ref), adv, ones,
                                AGGREGATIONS[aggregation](ones, 6 if aggregation == "constant" else 3),
                                LossSettings(loss_type="clip", beta=0.04, kl_estimator="k3"))
        loss_a.backward()
        loss_b.backward()
        assert loss_a.item() == pytest.approx(loss_b.item(), abs=1e-7), aggregation
        assert torch.allclose(compact(a.grad), b.grad, atol=1e-8), aggregation
        assert a.grad[mask == 0].abs().max() == 0, aggregation
    # By hand, sequence_mean with beta 0 and ratio 1 (logp = old): the loss is
    # -(1/2) * (A_0 * 3/3 + A_1 * 3/3) = -(1.5 - 0.5) / 2 = -0.5
    same = logp.detach().clone().requires_grad_()
    loss, _ = policy_loss(same, logp.detach(), None, adv, mask, AGGREGATIONS["sequence_mean"](mask, 6),
                          LossSettings(loss_type="clip", beta=0.0, kl_estimator="k3"))
    assert loss.item() == pytest.approx(-0.5, abs=1e-7)


# ---- Everything else keeps working on episodes -----------------------------------------------

def agent_config(model_dir, out, **extra):
    from grpo.config import build_config
    values = {"model": str(model_dir), "task": "calculator", "environment": "guess_number",
              "max_turns": 3, "max_new_tokens": 12, "prompts_per_step": 2, "group_size": 4,
              "steps": 2, "sft_steps": 0, "eval_every": 0, "save_every": 0, "threads": 1,
              "lr": 1e-3, "beta": 0.04, "rewards": ["final_answer", "agent_shaped:distinct"],
              "output_dir": str(out)}
    return build_config({**values, **extra})


@pytest.fixture(autouse=True)
def shaped_reward(tmp_path, monkeypatch):
    """A reward with contrast between a random-ish model's episodes (their text's variety), so
    advantages, gradients and updates are not all 0."""
    (tmp_path / "agent_shaped.py").write_text(
        "def distinct(prompts, completions, **columns):\n"
        "    return [len(set(c)) / 20 for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def run_quietly(config):
    from grpo.train import train
    return train(config, log=lambda line: None)


@pytest.mark.parametrize("algorithm", ["grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo", "sapo", "gmpo",
                                       "clip_cov", "kl_cov", "reinforce_pp", "reinforce_pp_baseline"])
def test_every_preset_trains_on_episodes(agent_model_dir, tmp_path, algorithm):
    from grpo.config.presets import ALGORITHMS
    assert algorithm in ALGORITHMS
    result = run_quietly(agent_config(agent_model_dir, tmp_path / "run", algorithm=algorithm,
                                      num_iterations=2, turn_rewards=algorithm == "grpo"))
    last = result.history[-1]
    assert last["episode/turns_mean"] > 1 and last["episode/env_token_frac"] > 0
    assert all(torch.isfinite(torch.tensor(m["loss"])) for m in result.history)


# The covariance methods with shares of the batch large enough to select tokens in a small one
# (the band is wide open: every covariance qualifies for clip_cov's draw)
SELECTING = {"clip_cov": dict(clip_cov_fraction=0.2, clip_cov_low=-1e9, clip_cov_high=1e9),
             "kl_cov": dict(kl_cov_fraction=0.2)}


@pytest.mark.parametrize("algorithm", ["grpo", "clip_cov", "kl_cov", "reinforce_pp"])
def test_an_agent_run_resumes_bit_for_bit(agent_model_dir, tmp_path, algorithm):
    from safetensors.torch import load_file
    keys = dict(algorithm=algorithm, num_iterations=2, **SELECTING.get(algorithm, {}))
    whole = run_quietly(agent_config(agent_model_dir, tmp_path / "whole", steps=4, save_every=2, **keys))
    run_quietly(agent_config(agent_model_dir, tmp_path / "cut", steps=2, save_every=2, **keys))
    resumed = run_quietly(agent_config(agent_model_dir, tmp_path / "cut", steps=4, save_every=2,
                                       resume="auto", **keys))
    if algorithm in SELECTING:   # the selection acted, in the steps after the resume too
        assert all(m["cov/selected_frac"] > 0.15 for m in resumed.history)
    a = load_file(tmp_path / "whole" / "final" / "model.safetensors")
    b = load_file(tmp_path / "cut" / "final" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    strip = lambda rows: [{k: v for k, v in m.items() if not k.startswith(("time/", "tokens/s"))}   # noqa: E731
                          for m in rows if m["step"] > 2]
    assert strip(whole.history) == strip(resumed.history)
    assert max(m["episode/turns_mean"] for m in whole.history) > 1


def test_lora_trains_an_agent(agent_model_dir, tmp_path):
    pytest.importorskip("peft")
    result = run_quietly(agent_config(agent_model_dir, tmp_path / "lora", lora_r=4, lr=1e-2))
    assert result.history[-1]["episode/turns_mean"] > 1
    assert (tmp_path / "lora" / "final" / "adapter_model.safetensors").exists()


def test_explain_shows_the_turns_with_numbers_on_model_tokens_only(agent_model_dir, tmp_path):
    from grpo.commands.explain import explain_group, render
    result = explain_group(agent_config(agent_model_dir, tmp_path, num_iterations=2), row=1)
    episodes = [c for c in result["completions"] if not all(c["by_policy"])]
    assert episodes, "no episode with an answer from the environment"
    for comp in result["completions"]:
        assert comp["turns"] >= 1
        for mine, in_loss in zip(comp["by_policy"], comp["in_loss"]):
            assert in_loss <= mine                # no environment token is in the loss
    text = render(result)
    assert "[tool/env: " in text and "turns" in text
    assert "[tool/env: " in text.split("4. update")[1]      # the token rows mark the answers too


def test_the_report_and_eval_of_an_agent_run(agent_model_dir, tmp_path, capsys):
    from grpo.commands.cli import main
    from grpo.run.report import write_report
    run_quietly(agent_config(agent_model_dir, tmp_path / "run", eval_every=2, eval_size=8))
    page = write_report(tmp_path / "run").read_text()
    for panel in ("agent", "agent_shares"):     # turns and calls; tool use, failures, env share
        assert (tmp_path / "run" / "plots" / f"{panel}.png").stat().st_size > 5000
        assert f'alt="{panel}"' in page
    samples = json.loads(page.split('id="samples">')[1].split("</script>")[0].replace("<\\/", "</"))
    shown = [s for step in (samples.values() if isinstance(samples, dict) else samples)
             for s in (step if isinstance(step, list) else [step]) if isinstance(s, dict)]
    assert any(who == "env" for s in shown for _, _, who in s.get("spans", [])), \
        "the completion browser marks what the environment wrote"
    main(["eval", f"model={agent_model_dir}", "task=calculator", "environment=guess_number",
          "max_turns=3", "max_new_tokens=12", "eval_size=8", f"output_dir={tmp_path / 'eval'}"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "eval/tool_use_frac" in out and out["eval/n"] == 8
    rows = [json.loads(line) for line in open(out["rows_file"])]
    assert len(rows) == 8 and all("tool_calls" in r for r in rows)


QWEN_LIKE = (   # the tool-message layout of Qwen2.5's template, written for this test
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
NO_TOOL_ROLE = ("{%- for m in messages %}{%- if m.role not in ['user', 'assistant'] %}"
                "{{ raise_exception('roles are user and assistant') }}{%- endif %}"
                "{{ m.role }}: {{ m.content }}\n{%- endfor %}")


def test_hermes_results_go_through_the_chat_template_as_tool_messages(tiny):
    from grpo.agents.tools import FORMATS, templated
    _, tok = tiny
    tok = __import__("copy").deepcopy(tok)
    tok.chat_template = QWEN_LIKE
    fmt = templated(FORMATS["hermes"], tok)
    # Qwen2.5's layout: the assistant's turn closes, one user turn holds every tool_response, and
    # the assistant's header opens the next turn.
    assert fmt.answer_of(["4", "9"]) == ("<|im_end|>\n<|im_start|>user\n<tool_response>\n4\n"
                                         "</tool_response>\n<tool_response>\n9\n</tool_response>"
                                         "<|im_end|>\n<|im_start|>assistant\n")
    tok.chat_template = NO_TOOL_ROLE
    inline = templated(FORMATS["hermes"], tok)
    assert inline.answer_of(["4"]) == "\n<tool_response>\n4\n</tool_response>\n"


FAULTY = '''
import time

class Faulty:
    """Its first step raises, its second hangs past the deadline, its third gives a step that
    is not one; then the episode ends."""
    def reset(self, row):
        self.n = 0

    def step(self, action):
        self.n += 1
        if self.n == 1:
            raise RuntimeError("the game broke")
        if self.n == 2:
            time.sleep(2)
            return "late"
        if self.n == 3:
            return {"not": "a step"}
        return None, 0.0, True
'''


def test_an_environment_that_raises_hangs_or_answers_nonsense_is_counted_and_training_goes_on(
        agent_model_dir, tmp_path):
    (tmp_path / "faulty_env.py").write_text(FAULTY)
    result = run_quietly(agent_config(agent_model_dir, tmp_path / "run", environment="faulty_env:Faulty",
                                      max_turns=4, tool_deadline_s=0.3, steps=1))
    assert result.history[-1]["episode/env_failures"] > 0
    text = (tmp_path / "run" / "samples.jsonl").read_text()
    assert "error: the environment failed (RuntimeError: the game broke)" in text
    assert (tmp_path / "run" / "final" / "model.safetensors").exists()


def test_what_the_model_reads_when_the_environment_fails(talker, tmp_path, monkeypatch):
    (tmp_path / "faulty_env.py").write_text(FAULTY)
    monkeypatch.syspath_prepend(str(tmp_path))
    from faulty_env import Faulty
    model, tok = talker
    torch.manual_seed(0)
    r = sample_episodes(model, tok, ["guess 3:"], [{}], 4, make_env=Faulty, tools={},
                        call_format="plain",
                        limits=EpisodeLimits(max_turns=4, turn_tokens=6, episode_tokens=400,
                                             deadline_s=0.3))
    full = [c for c, n in zip(r.completions, r.episodes.turns) if n == 4]
    assert full, "no episode reached its fourth turn; the fixture's model no longer stops"
    for text in full:
        assert "error: the environment failed (RuntimeError: the game broke)" in text
        assert "error: the environment failed (did not answer within 0.3 s)" in text
        assert "error: the environment failed (" in text.split("within 0.3 s)")[1]   # not a step
    assert all(n == 3 for n, t in zip(r.episodes.env_failures, r.episodes.turns) if t == 4)


class Chatty(Scripted):
    """Never done; answers every turn with 30 characters."""
    def step(self, action):
        return Step("x" * 30, None, False)


@pytest.mark.parametrize("engine", ["lean decoder", "engine"])
def test_each_limit_truncates_the_episode(talker, engine):
    from grpo.sampling.episodes import sample_episodes_on_engine
    model, tok = talker

    def run(limits, make_env=Chatty):
        torch.manual_seed(0)
        if engine == "lean decoder":
            return sample_episodes(model, tok, ["guess 3:"], [{}], 4, make_env=make_env, tools={},
                                   call_format="plain", limits=limits)

        def turns(histories, room, stop, episodes):      # the lean sampler's turns, served one by one
            out = []
            for h, n in zip(histories, room):
                ids, logps = [], []
                for _ in range(n):
                    logits = model(torch.tensor([h + ids])).logits[0, -1]
                    token = int(logits.argmax())
                    ids.append(token)
                    logps.append(float(torch.log_softmax(logits, -1)[token]))
                    if token == tok.eos_token_id:
                        break
                out.append((ids, logps, ids[-1] != tok.eos_token_id))
            return out
        return sample_episodes_on_engine(turns, tok, ["guess 3:"], [{}], 2, make_env=make_env,
                                         tools={}, call_format="plain", limits=limits,
                                         temperature=1.0)

    # out of turns: Chatty is never done, so every episode ends at max_turns, truncated
    r = run(EpisodeLimits(max_turns=2, turn_tokens=8, episode_tokens=500))
    assert r.truncated.all() and all(t <= 2 for t in r.episodes.turns)
    # out of episode tokens: 30-character answers spend a 40-token budget in the second turn
    r = run(EpisodeLimits(max_turns=6, turn_tokens=8, episode_tokens=40))
    assert r.truncated.all() and int(r.context_mask.sum(-1).max()) <= 40
    # a turn cut at turn_tokens that nothing answers (no environment, no call): a 1-token turn
    # cannot end with EOS after a digit, so the episode ends there, truncated
    r = run(EpisodeLimits(max_turns=6, turn_tokens=1, episode_tokens=500), make_env=None)
    assert r.truncated.any() and all(t == 1 for t, cut in zip(r.episodes.turns, r.truncated) if cut)
    # the cut turn is a turn of its own: it has a reward entry (None: no environment saw it), so
    # turn_rewards credits the outcome to it and not to the turn before
    for ends, given, cut in zip(r.episodes.turn_ends, r.episodes.turn_rewards, r.truncated):
        assert len(given) == len(ends)
        if cut:
            assert given == [None]


@pytest.mark.parametrize("engine", ["lean decoder", "engine"])
def test_a_turn_cut_at_turn_tokens_is_answered_and_the_episode_goes_on(talker, engine):
    # A turn cut at turn_tokens used to end the whole episode; the turn ends, the environment
    # answers it and the episode continues (Scripted is done after its third step).
    from grpo.sampling.episodes import sample_episodes_on_engine
    model, tok = talker
    seen: list[str] = []

    class Recording(Scripted):
        def step(self, action):
            seen.append(action)
            return super().step(action)

    limits = EpisodeLimits(max_turns=6, turn_tokens=1, episode_tokens=500)
    torch.manual_seed(0)
    if engine == "lean decoder":
        r = sample_episodes(model, tok, ["guess 3:"], [{}], 2, make_env=Recording, tools={},
                            call_format="plain", limits=limits)
    else:
        def turns(histories, room, stop, episodes):        # one greedy token a turn: never EOS after a digit
            out = []
            for h, n in zip(histories, room):
                logits = model(torch.tensor([h])).logits[0, -1]
                token = int(logits.argmax())
                out.append(([token], [float(torch.log_softmax(logits, -1)[token])],
                            token != tok.eos_token_id))
            return out
        r = sample_episodes_on_engine(turns, tok, ["guess 3:"], [{}], 2, make_env=Recording,
                                      tools={}, call_format="plain", limits=limits, temperature=1.0)
    assert r.episodes.turns == [3, 3] and not r.truncated.any()
    assert r.episodes.turn_rewards == [[0.5, 1.0, 1.5]] * 2
    assert len(seen) == 6 and all(len(tok(a, add_special_tokens=False).input_ids) <= 1 for a in seen)


def hand_episodes(turn_ends, turn_rewards, truncated, T):
    """A Rollout of episodes as the sampler leaves them, with only what turn_advantages reads."""
    from grpo.rollout import Rollout
    n = len(turn_ends)
    given = [[r for r in rs if r is not None] for rs in turn_rewards]
    return Rollout(
        prompts=["p"] * n, completions=["c"] * n, group_ids=torch.zeros(n, dtype=torch.long),
        prompt_ids=torch.zeros(n, 1, dtype=torch.long), prompt_mask=torch.ones(n, 1, dtype=torch.long),
        completion_ids=torch.zeros(n, T, dtype=torch.long),
        completion_mask=torch.tensor([[1, 1, 0, 0, 1, 1]] * n), sampler_logprobs=torch.zeros(n, T),
        truncated=torch.tensor(truncated), context_mask=torch.ones(n, T, dtype=torch.long),
        episodes=some_episodes(n, turn_ends=turn_ends, turn_rewards=turn_rewards,
                               env_reward=[sum(g) if g else None for g in given]))


def some_episodes(n: int, **given):
    """Episodes of n rows with `given` fields, the others empty."""
    from grpo.rollout import Episodes
    empty = dict(turns=[0] * n, turn_ends=[[]] * n, turn_rewards=[[]] * n, env_reward=[None] * n,
                 tool_calls=[0] * n, tool_failures=[0] * n, env_failures=[0] * n, spans=[[]] * n)
    return Episodes(**{**empty, **given})


def test_the_cut_turn_of_a_truncated_episode_gets_its_own_advantage():
    from grpo.step import turn_advantages
    # Two episodes of one group, tokens [p p e e p p] (policy, environment), turns ending at 1 and 5.
    # Episode 0 ends its second turn; the environment gave 0.5 and 1.0; the reward functions give 1.0,
    #   so its reward is 1.0 + 1.5 = 2.5 and its turns are [0.5, 1.0 + (2.5 - 1.5)] = [0.5, 2.0].
    # Episode 1 is cut in its second turn: the environment gave 0.5 for the first and nothing for the
    #   cut one (None); the reward functions give -1.0 (say, the overlong penalty at the budget), so
    #   its reward is -1.0 + 0.5 = -0.5 and its turns are [0.5, 0 + (-0.5 - 0.5)] = [0.5, -1.0].
    # Pooled over the group: [0.5, 2.0, 0.5, -1.0], mean 0.5, deviations [0, 1.5, 0, -1.5],
    #   sample variance (2.25 + 2.25) / 3 = 1.5, std sqrt(1.5); normalized (eps 0):
    #   [0, sqrt(1.5), 0, -sqrt(1.5)] = [0, 1.2247449, 0, -1.2247449].
    # Token t gets the sum over the turns ending at or after it: every token of episode 0 gets
    #   0 + 1.2247449 (first turn's tokens) or 1.2247449; of episode 1, -1.2247449, the cut turn's
    #   tokens 4 and 5 included. (Before, the outcome went to the first turn and tokens 4, 5 got 0.)
    r = hand_episodes([[1, 5], [1, 5]], [[0.5, 1.0], [0.5, None]], [False, True], T=6)
    adv = turn_advantages(r, torch.tensor([2.5, -0.5]), eps=0.0)
    s = 1.5 ** 0.5
    assert adv.tolist() == [pytest.approx([s] * 6, rel=1e-6), pytest.approx([-s] * 6, rel=1e-6)]
    # a rollout whose cut turn has no reward entry at all is read the same way
    r = hand_episodes([[1, 5], [1, 5]], [[0.5, 1.0], [0.5]], [False, True], T=6)
    assert turn_advantages(r, torch.tensor([2.5, -0.5]), eps=0.0).tolist() == adv.tolist()


def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: the text
    """
    return len(text.split())


def test_tools_and_an_environment_given_from_python(agent_model_dir, tmp_path):
    from grpo.config import build_config
    from grpo.train import train
    config = build_config({"model": str(agent_model_dir), "task": "calculator", "max_turns": 3,
                           "max_new_tokens": 12, "prompts_per_step": 2, "group_size": 4, "steps": 1,
                           "sft_steps": 0, "eval_every": 0, "threads": 1,
                           "output_dir": str(tmp_path / "run")})
    result = train(config, tools=[word_count], environment=GuessNumber, log=lambda line: None)
    assert "episode/turns_mean" in result.history[-1]
    sample = json.loads((tmp_path / "run" / "samples.jsonl").read_text().splitlines()[0])
    # the prompts show the task's tool, the tool given from Python and the given environment's
    assert "word_count(text)" in sample["prompt"] and "calculator(expression)" in sample["prompt"]


def test_the_overlong_penalty_counts_the_episodes_tokens_against_episode_tokens():
    from grpo.assembly import Agent, Data
    from grpo.config import build_config
    from grpo.rollout import Rollout
    from grpo.pipeline.inline import score_rollout
    # episode_tokens 30, overlong_buffer 0.2: buffer round(0.2 * 30) = 6 tokens, free up to 24.
    # Three episodes, each with 5 policy tokens, of 30, 27 and 20 tokens after the prompt:
    #   30 -> (24 - 30) / 6 = -1.0 (cut at the budget);  27 -> (24 - 27) / 6 = -0.5;  20 -> 0.
    # Counted by policy tokens alone (5 each) none would be penalized.
    lengths, T = [30, 27, 20], 30
    context = torch.tensor([[1] * n + [0] * (T - n) for n in lengths])
    policy = torch.zeros(3, T, dtype=torch.long)
    policy[:, :5] = 1
    r = Rollout(prompts=["p"] * 3, completions=["c"] * 3, group_ids=torch.zeros(3, dtype=torch.long),
                prompt_ids=torch.zeros(3, 1, dtype=torch.long),
                prompt_mask=torch.ones(3, 1, dtype=torch.long),
                completion_ids=torch.zeros(3, T, dtype=torch.long), completion_mask=policy,
                sampler_logprobs=torch.zeros(3, T), truncated=torch.tensor([True, False, False]),
                context_mask=context, episodes=some_episodes(3))
    agent = Agent(tools={}, make_env=None, call_format="plain",
                  limits=EpisodeLimits(max_turns=3, turn_tokens=5, episode_tokens=30))
    data = Data(train_rows=[], eval_rows=[], reward_fns=[lambda prompts, completions: [1.0] * 3],
                reward_weights=[1.0], accuracy_fn=None, agent=agent)
    score_rollout(build_config({"overlong_buffer": 0.2}), r, data)
    assert r.rewards_per_fn["overlong"] == [-1.0, -0.5, 0.0]
    assert r.rewards.tolist() == [0.0, 0.5, 1.0]
