"""A fingerprint of this CPU's float32 numerics, as the demo meets them.

    python benchmarks/numerics.py        # prints 12 hex digits

The demo's trajectory is chaotic in the last bits of float32 sums: the same seed gives the same
held-out accuracies on the same CPU and library versions, and different ones where a matrix
product sums in another order (another vector width, another path in the math library, another
torch build). The kernels' name (torch.backends.cpu.get_cpu_capability) does not tell these apart:
two CPUs that both report AVX512 were seen to give two trajectories. This script runs what the
demo's step is made of (the demo model's forward and backward on a fixed batch, with torch's
default threads, as the demo uses) and hashes every bit of the logits and gradients. Two machines
with the same fingerprint compute the demo's step bit for bit alike. tests/test_readme_commands.py
checks the README's figures exactly where the fingerprint is one benchmarks/results/demo_runs.json
names.
"""

from __future__ import annotations

import hashlib
import tempfile


def fingerprint() -> str:
    import torch
    from transformers import AutoModelForCausalLM

    from grpo.models.tiny import build_tiny

    with tempfile.TemporaryDirectory() as where:
        model = AutoModelForCausalLM.from_pretrained(build_tiny(where), dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, model.config.vocab_size, (8, 40), generator=generator)
    digest = hashlib.sha256()
    for rows in (tokens, tokens[:1, :12]):        # a batch, and one short row as sampling has it
        model.zero_grad()
        logits = model(rows).logits
        torch.log_softmax(logits, -1).gather(-1, rows[..., None]).mean().backward()
        digest.update(logits.detach().numpy().tobytes())
        for p in model.parameters():
            digest.update(p.grad.numpy().tobytes())
    return digest.hexdigest()[:12]


if __name__ == "__main__":
    print(fingerprint())
