import os

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A small randomly initialised model directory, saved with save_pretrained."""
    from grpo.models import build_tiny
    return build_tiny(tmp_path_factory.mktemp("tiny"), hidden_size=32, layers=2, heads=2)
