"""What handing the weights to a vLLM server on the same machine costs, as grpo does it today.

    python benchmarks/gpu_handoff.py              # on a CUDA GPU: Qwen2.5-0.5B and 1.5B shapes
    python benchmarks/gpu_handoff.py --smoke      # a tiny shape, CPU tensors: checks the script
    python benchmarks/gpu_handoff.py --cpu        # the two shapes from CPU tensors (no GPU needed)

The trainer writes one safetensors file, whole, under /dev/shm and renames it into place
(sampling.vllm_server.write_weights); the server then reloads from it. This times that write for
a policy with float32 master weights on the device (random weights; the shape is what counts),
from the device's tensors to a closed, renamed file, in the server's dtype (bfloat16, what
mixed_precision=bf16 serves; and float32), `--repeats` times, median:

    total_s          write_weights, end to end (the step pays this at each sync)
    to_host_s        its first part alone: cast on the device, copy to the host (host_tensors)
    file_s           the rest: the safetensors file written and renamed (total_s - to_host_s)
    gb               the file's size; gb_per_s = gb / total_s

The server's reload (reading the file back into its GPU) is not in it: that needs vLLM, which this
machine's image lacks. vLLM's own transfer (NCCL or CUDA IPC, its weight-transfer API) is
published at 0.15-0.2 s for 0.5-0.6B models; `over_published` is total_s / 0.2 for the 0.5B shape.
One JSON file goes to --out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gpu_check import SHAPES, SMOKE   # noqa: E402

PUBLISHED_S = 0.2        # vLLM's native transfer at 0.5-0.6B, the slower end of 0.15-0.2 s


def model_on(shape: dict, vocab: int, device: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    config = Qwen2Config(vocab_size=vocab, max_position_embeddings=32768, **shape)
    with torch.device(device):
        torch.manual_seed(0)
        return Qwen2ForCausalLM(config).float()


def time_write(model, dtype, repeats: int, parent: str) -> dict:
    from grpo.sampling.engine import weights_of
    from grpo.sampling.vllm_server import host_tensors, write_weights
    sync = torch.cuda.synchronize if next(model.parameters()).is_cuda else (lambda: None)
    totals, to_host, size = [], [], 0
    with tempfile.TemporaryDirectory(prefix="grpo-handoff-", dir=parent) as folder:
        for i in range(repeats + 1):                     # the first is a warm-up
            sync()
            started = time.perf_counter()
            path = write_weights(weights_of(model), folder, dtype, "the benchmark's weights")
            total = time.perf_counter() - started
            sync()
            started = time.perf_counter()
            tensors = host_tensors(weights_of(model), dtype)
            host = time.perf_counter() - started
            del tensors
            size = Path(path).stat().st_size
            if i:
                totals.append(total)
                to_host.append(host)
    total, host = statistics.median(totals), statistics.median(to_host)
    return {"total_s": round(total, 4), "to_host_s": round(host, 4), "file_s": round(total - host, 4),
            "gb": round(size / 1e9, 3), "gb_per_s": round(size / 1e9 / total, 2),
            "totals_s": [round(t, 4) for t in totals]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="a tiny shape from CPU tensors")
    ap.add_argument("--cpu", action="store_true", help="the real shapes, from CPU tensors")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default="/dev/shm", help="where the file goes (grpo's default)")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not (args.smoke or args.cpu)
    if not cuda and not (args.smoke or args.cpu):
        raise SystemExit("no CUDA GPU here: --cpu times the shapes from CPU tensors, --smoke checks the script")
    device = "cuda" if cuda else "cpu"
    shapes = SMOKE if args.smoke else SHAPES
    report = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "dir": args.dir, "repeats": args.repeats,
              "published_native_s": PUBLISHED_S, "shapes": {}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "-smoke" if args.smoke else ("-cpu" if args.cpu else "")
    path = out / f"gpu_handoff{tag}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    for name, shape in shapes.items():
        model = model_on(shape, 512 if args.smoke else 151936, device)
        entry = {"params": sum(p.numel() for p in model.parameters())}
        need = 2 * 4 * entry["params"] + 2**30         # the float32 file, and the one replacing it
        where = args.dir
        if shutil.disk_usage(where).free < need:       # a container's /dev/shm is often 64 MB
            where = tempfile.gettempdir()
            entry["dir"] = f"{where} ({args.dir} has {shutil.disk_usage(args.dir).free / 1e9:.1f} GB free)"
        for label, dtype in (("bfloat16", torch.bfloat16), ("float32", None)):
            entry[label] = time_write(model, dtype, args.repeats, where)
            print(f"{name} {label}: {entry[label]}", file=sys.stderr, flush=True)
        if name == "qwen2.5-0.5b":
            entry["over_published"] = round(entry["bfloat16"]["total_s"] / PUBLISHED_S, 2)
        report["shapes"][name] = entry
        path.write_text(json.dumps(report, indent=1) + "\n")     # kept if a later shape runs out of time
        del model
        if cuda:
            torch.cuda.empty_cache()
    print(path)


if __name__ == "__main__":
    main()
