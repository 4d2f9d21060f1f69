"""Atomic checkpoints: write into a temporary sibling directory, then rename into place.

A crash mid-write leaves the previous checkpoint whole and at most a `.tmp-*` directory behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def save_model_dir(model, tokenizer, target: str | Path) -> Path:
    """Save a Hugging Face model directory (safetensors) to `target`, atomically."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        for f in tmp.iterdir():
            with open(f, "rb") as handle:
                os.fsync(handle.fileno())
        if target.exists():
            old = target.with_name(f".old-{target.name}")
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
