"""Vision-language policies: log-probs equal Hugging Face's forward for each family, image features
computed once per group, placeholders never drawn, and the clear errors of bad image data."""

import json
import math

import pytest
import torch
from PIL import Image

from grpo import vision
from grpo.config import ConfigError, load_config
from grpo.data import DataError, format_prompt, load_rows, Columns
from grpo.models import frozen_copy, token_logprobs
from grpo.rollout import Rollout
from grpo.sampling import HFSampler
from grpo.update import logprobs_of
from vlm_families import one_thread, FAMILIES, build, images, messages  # noqa: F401 (one_thread: an autouse fixture)

# Rows of different prompt lengths (left-padded together); two images in the first.
ROWS = [("how many?", 2), ("hi", 1), ("what colour is the top left corner?", 1)]




def _prompts(processor, seed=0):
    pictures = [images(n, seed + i) for i, (_, n) in enumerate(ROWS)]
    texts = [processor.apply_chat_template(messages(t, n), tokenize=False, add_generation_prompt=True)
             for t, n in ROWS]
    return texts, pictures


def _completions(model, rows: int, T: int, seed: int):
    """Right-padded random completions of lengths T, T-2, T-1, ..., no placeholder token in them."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = torch.randint(5, vocab, (rows, T), generator=g)
    banned = vision.placeholder_ids(model)
    allowed = next(i for i in range(vocab - 1, 0, -1) if i not in banned)
    ids[torch.isin(ids, torch.tensor(banned))] = allowed
    lengths = torch.tensor([T - (i % 3) for i in range(rows)])
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    return ids * mask, mask


def _hf_logprobs(model, processor, text, pictures, completion, length):
    """Hugging Face's own forward on one row alone (no padding), with the processor's own inputs;
    placeholders get the logit grpo gives them (never drawn), then log-softmax."""
    enc = processor(text=[text], images=[pictures], return_tensors="pt", add_special_tokens=False)
    P = enc["input_ids"].shape[1]
    ids = torch.cat([enc["input_ids"], completion[None, :length]], 1)
    inputs = {k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask")}
    for key in ("token_type_ids", "mm_token_type_ids"):
        if key in inputs:
            inputs[key] = torch.nn.functional.pad(inputs[key], (0, length))
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), **inputs).logits[0, P - 1:-1]
    banned = vision.placeholder_ids(model)
    logits = logits.index_fill(-1, torch.tensor(banned), vision.BANNED_LOGIT)
    return logits.log_softmax(-1).gather(-1, completion[:length, None]).squeeze(-1)


@pytest.mark.parametrize("family", FAMILIES)
def test_logprobs_equal_hugging_face_forward_per_row(family):
    # Left-padded prompts of several lengths and images, two completions per prompt sharing one
    # Visual; each row's log-probs against HF's forward on that row alone.
    model, processor = build(family)
    texts, pictures = _prompts(processor)
    ids, mask, visuals = vision.encode(processor, texts, pictures)
    assert mask.sum(1).tolist() != [mask.shape[1]] * len(ROWS)        # really padded
    G, T = 2, 6
    completion, completion_mask = _completions(model, len(ROWS) * G, T, seed=1)
    rows_visuals = [v for v in visuals for _ in range(G)]
    full = torch.cat([ids.repeat_interleave(G, 0), completion], 1)
    attention = torch.cat([mask.repeat_interleave(G, 0), completion_mask], 1)
    with torch.no_grad():
        ours, _ = token_logprobs(model, full, attention, T, completion_mask=completion_mask,
                                 visuals=rows_visuals)
    for row in range(len(full)):
        prompt = row // G
        n = int(completion_mask[row].sum())
        reference = _hf_logprobs(model, processor, texts[prompt], pictures[prompt], completion[row], n)
        torch.testing.assert_close(ours[row, :n], reference, atol=2e-5, rtol=1e-5)
        assert (ours[row, n:] == 0).all()


@pytest.mark.parametrize("family", ["qwen3_vl", "gemma3"])
def test_shared_prompt_pass_gives_the_gradients_of_one_pass_per_row(family):
    # Each prompt's language-model states computed once and shared by its rows (with the graph)
    # against every row on its own: the same log-probs and the same gradients.
    model, processor = build(family)
    model.train()
    texts, pictures = _prompts(processor)
    ids, mask, visuals = vision.encode(processor, texts, pictures)
    G, T = 2, 5
    completion, completion_mask = _completions(model, len(ROWS) * G, T, seed=3)
    full = torch.cat([ids.repeat_interleave(G, 0), completion], 1)
    attention = torch.cat([mask.repeat_interleave(G, 0), completion_mask], 1)
    rows_visuals = [v for v in visuals for _ in range(G)]
    shared, _ = token_logprobs(model, full, attention, T, completion_mask=completion_mask, visuals=rows_visuals)
    shared.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    alone = torch.cat([token_logprobs(model, full[r:r + 1], attention[r:r + 1], T,
                                      completion_mask=completion_mask[r:r + 1],
                                      visuals=rows_visuals[r:r + 1])[0] for r in range(len(full))])
    alone.sum().backward()
    torch.testing.assert_close(shared, alone, atol=2e-5, rtol=1e-5)
    assert len(grads) > 10
    for name, p in model.named_parameters():
        if name in grads:
            torch.testing.assert_close(grads[name], p.grad, atol=5e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl"])
def test_the_same_text_with_other_pictures_is_another_prompt(family):
    # Two groups whose prompts tokenize alike (same text, same image size) but hold different
    # pictures: each row's log-probs are those of its own picture.
    model, processor = build(family)
    text = processor.apply_chat_template(messages("how many?", 1), tokenize=False, add_generation_prompt=True)
    first, second = images(1, 7)[0], images(1, 8)[0].resize(images(1, 7)[0].size)
    ids, mask, visuals = vision.encode(processor, [text, text], [[first], [second]])
    assert torch.equal(ids[0], ids[1])
    G, T = 2, 4
    completion, completion_mask = _completions(model, 2 * G, T, seed=5)
    full = torch.cat([ids.repeat_interleave(G, 0), completion], 1)
    attention = torch.cat([mask.repeat_interleave(G, 0), completion_mask], 1)
    with torch.no_grad():
        ours, _ = token_logprobs(model, full, attention, T, completion_mask=completion_mask,
                                 visuals=[v for v in visuals for _ in range(G)])
    for row in range(len(full)):
        n = int(completion_mask[row].sum())
        picture = [first] if row < G else [second]
        reference = _hf_logprobs(model, processor, text, picture, completion[row], n)
        torch.testing.assert_close(ours[row, :n], reference, atol=2e-5, rtol=1e-5)


def _counting(model):
    """Images the image encoder sees, call by call."""
    seen = []
    tower = vision.tower_of(model)

    def hook(module, args, kwargs, out):
        pixels = kwargs.get("pixel_values", args[0] if args else None)
        seen.append(pixels.shape[0])
    tower.register_forward_hook(hook, with_kwargs=True)
    return seen


def test_features_computed_once_per_group_in_sampling_and_every_pass():
    model, processor = build("llava")
    tok = processor.tokenizer
    tok.grpo_processor, tok.padding_side = processor, "left"
    texts, pictures = _prompts(processor)
    seen = _counting(model)
    G = 4
    rollout = HFSampler(model, tok, max_new_tokens=5).sample(
        texts, G, rows=[{"images": p} for p in pictures])
    distinct_images = sum(len(p) for p in pictures)                    # 4, not 4 * G = 16
    assert seen == [distinct_images]
    assert len({id(v) for v in rollout.visuals}) == len(ROWS)
    seen.clear()
    logp = logprobs_of(model, rollout, micro_batch_size=64)
    assert seen == [distinct_images]
    # the sampler's log-probs are those of the training forward
    torch.testing.assert_close(logp, rollout.sampler_logprobs, atol=1e-5, rtol=0)
    seen.clear()
    logprobs_of(model, rollout, micro_batch_size=G)      # passes of G rows: each pass's own prompts
    from grpo.update import length_batches
    prompts_in = [sorted({int(rollout.group_ids[r]) for r in rows}) for rows in length_batches(rollout, G)]
    assert seen == [sum(len(pictures[g]) for g in groups) for groups in prompts_in]
    assert sum(seen) < G * distinct_images


def test_placeholder_token_is_never_drawn_even_when_the_model_prefers_it():
    model, processor = build("llava")
    tok = processor.tokenizer
    tok.grpo_processor, tok.padding_side = processor, "left"
    image_token = vision.placeholder_ids(model)[0]
    with torch.no_grad():             # the image token would win every draw without the ban
        model.get_output_embeddings().weight[image_token] *= 50
        model.get_output_embeddings().weight[image_token] += 1
    texts, pictures = _prompts(processor)
    rollout = HFSampler(model, tok, max_new_tokens=6).sample(texts, 3, rows=[{"images": p} for p in pictures])
    assert not (rollout.completion_ids[rollout.completion_mask.bool()] == image_token).any()
    logp = logprobs_of(model, rollout, micro_batch_size=64)       # would raise on a drawn placeholder
    torch.testing.assert_close(logp, rollout.sampler_logprobs, atol=1e-5, rtol=0)


def test_frozen_tower_is_shared_with_the_reference_and_lora_skips_it():
    model, _ = build("qwen2_5_vl")
    frozen = vision.freeze_tower(model)
    assert frozen == sum(p.numel() for p in vision.tower_of(model).parameters()) > 0
    ref = frozen_copy(model)
    assert vision.tower_of(ref) is vision.tower_of(model)
    assert ref.lm_head is not model.lm_head
    from grpo.assembly import add_lora
    config = load_config(overrides=["lora_r=4"])
    wrapped = add_lora(model, config)
    adapted = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert adapted and all("lora_" in n and "visual" not in n for n in adapted)


def _write_rows(tmp_path, rows):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_image_column_paths_relative_to_the_dataset_bytes_and_several_per_row(tmp_path):
    (tmp_path / "pics").mkdir()
    Image.new("RGB", (8, 8), (255, 0, 0)).save(tmp_path / "pics" / "a.png")
    Image.new("RGB", (8, 8), (0, 0, 255)).save(tmp_path / "pics" / "b.png")
    path = _write_rows(tmp_path, [{"question": "q1", "answer": "1", "images": ["pics/a.png", "pics/b.png"]},
                                  {"question": "q2", "answer": "2", "image": None}][:1])
    rows = load_rows(path)
    assert rows[0]["images"] == [str(tmp_path / "pics" / "a.png"), str(tmp_path / "pics" / "b.png")]
    assert vision.load_image(rows[0]["images"][1]).getpixel((0, 0)) == (0, 0, 255)
    import io
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), (0, 255, 0)).save(buffer, format="PNG")
    assert vision.load_image(vision.row_images({"bytes": buffer.getvalue(), "path": None}, None, "r")[0]
                             ).getpixel((1, 1)) == (0, 255, 0)


def test_missing_and_unreadable_images_name_the_row_and_the_file(tmp_path):
    (tmp_path / "bad.png").write_text("not a picture")
    path = _write_rows(tmp_path, [{"question": "q", "answer": "1", "image": "bad.png"}])
    with pytest.raises(DataError, match=r"row 1, column 'image'.*cannot read .*bad\.png"):
        load_rows(path)
    path = _write_rows(tmp_path, [{"question": "q", "answer": "1", "image": "x.png"},
                                  {"question": "q", "answer": "1", "image": "gone.png"}])
    Image.new("RGB", (4, 4)).save(tmp_path / "x.png")
    with pytest.raises(DataError, match=r"row 2, column 'image'.*not found: .*gone\.png"):
        load_rows(path)
    path = _write_rows(tmp_path, [{"question": "q", "answer": "1", "pics": None}])
    with pytest.raises(DataError, match=r"row 1, column 'pics'.*missing"):
        load_rows(path, Columns(images="pics"))
    with pytest.raises(DataError, match="no image column 'photo'.*image_column=NAME"):
        load_rows(path, Columns(images="photo"))
    path = _write_rows(tmp_path, [{"question": "q", "answer": "1", "image": "https://x.org/a.png"}])
    with pytest.raises(DataError, match="web address"):
        load_rows(path)


def test_image_parts_must_match_the_images_and_need_a_template():
    _, processor = build("llava")
    tok = processor.tokenizer
    text = format_prompt(tok, "count", "auto", images=2)
    assert text.count("<image>") == 2 and text.index("<image>") < text.index("count")
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "count"}]}]
    with pytest.raises(DataError, match=r"2 image\(s\) but its messages hold 1"):
        format_prompt(tok, chat, "auto", images=2)
    with pytest.raises(DataError, match="chat_template=none"):
        format_prompt(tok, "count", "none", images=1)


def test_image_rows_given_to_a_text_only_model_are_refused(tmp_path):
    Image.new("RGB", (4, 4)).save(tmp_path / "a.png")
    path = _write_rows(tmp_path, [{"question": "q", "answer": "1"}, {"question": "q", "answer": "1",
                                                                    "image": "a.png"}][1:])
    from grpo.train import train
    config = load_config(overrides=[f"dataset={path}", "steps=1", f"output_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=r"text-only model.*has images \(1 of 1 rows, the first row 1\)"):
        train(config, log=lambda line: None)


class PictureGame:
    """Shows a picture after the first turn and asks for its count; 1 for the right count."""

    def reset(self, row):
        self.answer = row["answer"]
        return "look "

    def step(self, text):
        from grpo.agents.environments import Step
        from grpo.data.tasks.shapes import draw
        import random
        if not hasattr(self, "shown"):
            self.shown = True
            return Step(["see ", draw(int(self.answer), random.Random(int(self.answer))), " count?"], None, False)
        return Step("ok", 1.0 if text.strip() == self.answer else 0.0, True)


def _tiny_vlm():
    from grpo.models.tiny import build_tiny_vlm
    model, processor = build_tiny_vlm(hidden_size=32, layers=2, vision_hidden=32, vision_layers=1)
    tok = processor.tokenizer
    tok.grpo_processor, tok.padding_side = processor, "left"
    return model, tok


def test_an_observation_image_enters_the_episode_once_as_image_tokens_masked_out_of_the_loss():
    from grpo.sampling.episodes import EpisodeLimits, EpisodeSampler
    from grpo.data.tasks.shapes import draw
    import random
    model, tok = _tiny_vlm()
    image_token = vision.placeholder_ids(model)[0]
    with torch.no_grad():                 # turns that end (at EOS) within their few tokens
        model.lm_head.bias = torch.nn.Parameter(torch.zeros(model.lm_head.out_features))
        model.lm_head.bias[tok.eos_token_id] = 4.0
    limits = EpisodeLimits(max_turns=2, turn_tokens=3, episode_tokens=64, observation_tokens=40)
    sampler = EpisodeSampler(model, tok, limits=limits, tools={}, call_format="plain", make_env=PictureGame)
    rows = [{"prompt": "count", "answer": "2", "images": [draw(3, random.Random(0))]},
            {"prompt": "count", "answer": "3", "images": [draw(1, random.Random(1))]}]
    texts = [format_prompt(tok, r["prompt"], "auto", images=1) for r in rows]
    G = 3
    torch.manual_seed(0)
    rollout = sampler.sample(texts, G, rows=rows)
    sampler_prompts = [rollout.visuals[g * G] if isinstance(rollout.visuals[g * G], vision.Visual)
                       else rollout.visuals[g * G][0] for g in range(len(rows))]
    shown = 0
    for i in range(len(rollout)):
        ids, policy, context = rollout.completion_ids[i], rollout.completion_mask[i], rollout.context_mask[i]
        images = ids == image_token
        if rollout.episodes.turns[i] < 2:            # its first turn was cut: no picture came
            assert not images.any() and isinstance(rollout.visuals[i], vision.Visual)
            continue
        shown += 1
        assert int(images.sum()) == 16                  # the observation's picture, once
        assert not (policy.bool() & images).any()       # never in the loss
        assert context[images].all()                    # always attended
        assert isinstance(rollout.visuals[i], tuple) and len(rollout.visuals[i]) == 2
        assert rollout.visuals[i][0] is sampler_prompts[i // G]          # the prompt's, shared
    assert shown >= 4
    seen = _counting(model)
    logp = logprobs_of(model, rollout, micro_batch_size=64)
    assert seen == [len(rows) + shown]                  # each prompt's picture once, each observation's once
    policy = rollout.completion_mask.bool()
    torch.testing.assert_close(logp[policy], rollout.sampler_logprobs[policy], atol=1e-5, rtol=0)
    assert (logp[~policy] == 0).all()


def test_an_observation_image_for_a_text_only_model_is_refused():
    from grpo.agents.environments import EnvironmentError_
    from grpo.sampling.episodes import answer_ids
    from grpo.models import build_tiny_tokenizer
    with pytest.raises(EnvironmentError_, match="observation holds an image, but the model is text-only"):
        answer_ids(build_tiny_tokenizer(), ["see", Image.new("RGB", (4, 4))])


def _picture_rows(tmp_path, n=24):
    import random
    from grpo.data.tasks.shapes import draw
    (tmp_path / "pics").mkdir(exist_ok=True)
    rows = []
    for i in range(n):
        count = random.Random(i).randint(1, 4)
        draw(count, random.Random(i)).save(tmp_path / "pics" / f"{i}.png")
        rows.append({"question": "how many shapes?", "answer": str(count), "image": f"pics/{i}.png",
                     "completion": str(count)})
    return _write_rows(tmp_path, rows)


def test_a_vision_run_resumes_bit_for_bit(tmp_path):
    from grpo.train import train
    path = _picture_rows(tmp_path)
    keys = ["model=tiny-vlm", f"dataset={path}", "rewards=[exact_answer]", "sft_steps=10",
            "group_size=4", "prompts_per_step=4", "max_new_tokens=3", "eval_every=0", "save_every=2",
            "beta=0.04", "num_iterations=2"]
    whole = train(load_config(overrides=keys + ["steps=4", f"output_dir={tmp_path / 'a'}"]), log=lambda _: None)
    train(load_config(overrides=keys + ["steps=2", f"output_dir={tmp_path / 'b'}"]), log=lambda _: None)
    resumed = train(load_config(overrides=keys + ["steps=4", f"output_dir={tmp_path / 'b'}", "resume=auto"]),
                    log=lambda _: None)
    measured = ["reward/mean", "kl", "loss", "grad_norm", "entropy"]
    first = [[m[k] for k in measured] for m in whole.history if "kl" in m]
    again = [[m[k] for k in measured] for m in resumed.history if "kl" in m]
    assert len(first) == 4 and again == first[2:]
    assert any(row[2] != 0 for row in first)              # the policy moved: the comparison bites
    for (name, p), q in zip(whole.policy.named_parameters(), resumed.policy.parameters()):
        assert torch.equal(p, q), name


def test_a_tool_that_returns_a_picture_answers_with_image_tokens():
    from grpo.sampling.episodes import Episode, answer_ids, respond
    from grpo.data.tasks.shapes import draw
    from grpo.agents.tools import FORMATS, make_tool
    import random

    def chart(count: str):
        """Draw a chart of `count` shapes.

        Args:
            count: how many shapes
        """
        return ["chart:", draw(int(count), random.Random(int(count)))]
    model, tok = _tiny_vlm()
    ep = Episode(row={}, env=None, tools={"chart": make_tool(chart)})
    answer = respond(ep, "<call>chart 3</call>", FORMATS["plain"], 5.0)
    assert [type(p).__name__ for p in answer] == ["str", "Image", "str"]
    assert answer[0].endswith("chart:") and ep.tool_calls == 1 and ep.tool_failures == 0
    ids, visuals = answer_ids(tok, answer)
    image_token = vision.placeholder_ids(model)[0]
    assert ids.count(image_token) == 16 and len(visuals) == 1 and visuals[0].images == 1
    text = tok.decode(ids, skip_special_tokens=True)
    assert "chart:" in text and "\u2063" not in text


def test_an_observation_with_images_is_never_cut_through():
    from grpo.sampling.episodes import Episode, EpisodeLimits, _add_answer, answer_ids
    model, tok = _tiny_vlm()
    ids, visuals = answer_ids(tok, ["see", Image.new("RGB", (32, 32), (9, 9, 9))])
    assert len(ids) == 3 + 16
    roomy = Episode(row={}, env=None, tools={})
    assert _add_answer(roomy, ids, EpisodeLimits(observation_tokens=64, episode_tokens=64), visuals) == ids
    assert roomy.visuals == visuals and not roomy.truncated
    tight = Episode(row={}, env=None, tools={})
    assert _add_answer(tight, ids, EpisodeLimits(observation_tokens=10, episode_tokens=64), visuals) == []
    assert tight.ids == [] and tight.visuals == [] and tight.truncated and tight.done
    text_only = Episode(row={}, env=None, tools={})         # text is cut as before
    assert len(_add_answer(text_only, list(range(30)), EpisodeLimits(observation_tokens=10))) == 10


def test_a_processor_that_needs_a_missing_package_names_it_and_the_guide(tmp_path, monkeypatch):
    import transformers
    from grpo.models import ModelError, load_processor
    from grpo.models.tiny import build_tiny_vlm
    path = build_tiny_vlm(tmp_path / "m", hidden_size=32, layers=1, vision_hidden=32, vision_layers=1)

    def missing(*args, **kwargs):
        raise ImportError("Qwen2VLVideoProcessor requires the Torchvision library but it was not found")
    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", missing)
    with pytest.raises(ModelError, match=r"needs a package that is missing: .*Torchvision.*docs/guides/vision\.md"):
        load_processor(str(path))


def test_the_report_shows_each_prompts_images_as_thumbnails_and_final_loads_with_its_processor(tmp_path):
    from grpo.models import load_policy, load_tokenizer
    from grpo.run.report import write_report
    from grpo.train import train
    run = tmp_path / "run"
    train(load_config(overrides=["task=shapes", "steps=2", "sft_steps=2", "eval_every=0",
                                 "prompts_per_step=4", "group_size=4", f"output_dir={run}"]),
          log=lambda _: None)
    records = [json.loads(line) for line in open(run / "samples.jsonl")]
    step_one = [r for r in records if r["step"] == 1]
    assert len(step_one) == 16 and all(len(r["images"]) == 1 for r in step_one)
    assert step_one[0]["images"][0].startswith("data:image/png;base64,")
    html = write_report(run).read_text()
    assert html.count("data:image/png;base64,") >= 32 and "img.thumb" in html
    tokenizer = load_tokenizer(str(run / "final"))
    assert tokenizer.grpo_processor is not None and vision.is_vision_model(load_policy(str(run / "final")))


def test_image_prompts_through_the_asynchronous_pipeline(tmp_path):
    # A rollout worker (a fork) samples the image prompts with the lagged weights; its parts,
    # Visuals included, cross the transport, and the trainer's passes share each prompt's features.
    from grpo.train import train
    path = _picture_rows(tmp_path, n=16)
    result = train(load_config(overrides=[
        "model=tiny-vlm", f"dataset={path}", "rewards=[exact_answer]", "sft_steps=10", "steps=3",
        "group_size=4", "prompts_per_step=4", "max_new_tokens=3", "eval_every=0", "save_every=0",
        "async_steps=1", "rollout_workers=1", f"output_dir={tmp_path / 'run'}"]), log=lambda _: None)
    steps = [m for m in result.history if "pipeline/staleness_max" in m]
    assert [m["pipeline/staleness_max"] for m in steps] == [0.0, 1.0, 1.0]   # step 1: version 0
    assert all(m["tokens/prompt"] > 16 * 16 for m in steps)     # 16 rows, each with 16 image tokens


@pytest.mark.parametrize("extra", [[f"algorithm={name}"] for name in
                                   ("grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo")]
                         + [["mixed_precision=bf16", "gradient_checkpointing=true"], ["lora_r=4"]])
def test_every_preset_and_precision_trains_on_image_prompts(tmp_path, extra):
    from grpo.train import train
    path = _picture_rows(tmp_path, n=8)
    result = train(load_config(overrides=[
        "model=tiny-vlm", f"dataset={path}", "rewards=[exact_answer]", "sft_steps=4", "steps=2",
        "group_size=4", "prompts_per_step=2", "max_new_tokens=3", "eval_every=0", "save_every=0",
        f"output_dir={tmp_path / 'run'}", *extra]), log=lambda _: None)
    steps = [m for m in result.history if "kl" in m]
    assert len(steps) == 2 and all(m["tokens/prompt"] > 0 for m in steps)
    assert all(math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) for m in steps)


def test_a_parquet_in_geometry3ks_layout_loads_its_list_of_images(tmp_path):
    # hiyouga/geometry3k's published layout: problem, answer, images (a list of datasets' Image
    # feature, stored as {"bytes", "path"}); the prompt's <image> is written by the chat template.
    import io
    from datasets import Dataset, Features, Image as ImageFeature, Sequence, Value
    pictures = [Image.new("RGB", (10, 10), (200, 0, 0)), Image.new("RGB", (12, 8), (0, 0, 200))]
    table = Dataset.from_dict(
        {"problem": ["Find x.", "Find the area."], "answer": ["3", "12"],
         "images": [[pictures[0]], [pictures[0], pictures[1]]]},
        features=Features({"problem": Value("string"), "answer": Value("string"),
                           "images": Sequence(ImageFeature())}))
    table.to_parquet(str(tmp_path / "train.parquet"))
    rows = load_rows(str(tmp_path / "train.parquet"), Columns(prompt="problem"))
    assert [len(r["images"]) for r in rows] == [1, 2] and rows[1]["prompt"] == "Find the area."
    assert vision.load_image(rows[1]["images"][1]).size == (12, 8)
    assert vision.load_image(rows[1]["images"][1]).getpixel((0, 0)) == (0, 0, 200)
    _, processor = build("qwen2_5_vl")
    text = format_prompt(processor.tokenizer, rows[1]["prompt"], "auto", images=2)
    ids, _, (visual,) = vision.encode(processor, [text], [[vision.load_image(s) for s in rows[1]["images"]]])
    assert visual.images == 2 and int((ids == processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum()) > 2


@pytest.mark.parametrize("family", FAMILIES)
def test_sampling_draws_what_the_training_forward_scores_in_every_family(family):
    # The sampler prefills each prompt once and decodes with the cache (Qwen: positions from the
    # multimodal RoPE index, then counted on; Gemma 3: its image blocks); the trainer's forward
    # scores the same tokens with the log-probs they were drawn with.
    model, processor = build(family)
    tok = processor.tokenizer
    tok.grpo_processor, tok.padding_side = processor, "left"
    texts, pictures = _prompts(processor)
    torch.manual_seed(0)
    rollout = HFSampler(model, tok, max_new_tokens=5).sample(texts, 2, rows=[{"images": p} for p in pictures])
    logp = logprobs_of(model, rollout, micro_batch_size=64)
    torch.testing.assert_close(logp, rollout.sampler_logprobs, atol=2e-5, rtol=0)
    assert rollout.completion_mask.sum() >= len(rollout)
