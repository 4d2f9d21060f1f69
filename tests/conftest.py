import os

import pytest
import torch

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")   # as the command sets it
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A small randomly initialised model directory, saved with save_pretrained."""
    from grpo.models import build_tiny
    return build_tiny(tmp_path_factory.mktemp("tiny"), hidden_size=32, layers=2, heads=2)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    # One thread: a model this small is faster that way, and it keeps these tests fast when the CPU
    # is shared (two threads contending with another process made them 6x slower).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # tiny_model_dir (conftest): build_tiny(..., hidden_size=32, layers=2, heads=2), built once
    from grpo.models import load_policy, load_tokenizer
    yield load_policy(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def agent_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model after a short cold start on the calculator task: it answers with digits and
    EOS (and now and then a calculator call), so an environment that answers every turn gets
    episodes of several turns. The directory is the run's `final/`."""
    from grpo.config import build_config
    from grpo.train import train
    out = tmp_path_factory.mktemp("agent")
    threads = torch.get_num_threads()
    train(build_config({"model": str(tiny_model_dir), "task": "calculator", "sft_steps": 60,
                        "sft_lr": 1e-2, "steps": 0, "eval_every": 0, "threads": 1,
                        "output_dir": str(out / "run")}), log=lambda line: None)
    torch.set_num_threads(threads)
    return out / "run" / "final"
