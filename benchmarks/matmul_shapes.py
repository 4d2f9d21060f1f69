"""How fast this CPU multiplies the matrices a model's step is made of, against the square product
`grpo bench` calls the peak, in one run.

    python benchmarks/matmul_shapes.py [--hidden 512] [--intermediate 2048] [--tokens 2048] [--rows 64]

A step's model FLOPs are almost all products of a [tokens x in] activation by an [in x out] weight:
in the forward pass, and in the backward pass the same product for the input's gradient and a
[in x tokens] by [tokens x out] one for the weight's. The defaults are W2's layer (hidden 512,
MLP 2048) with a 2,048-token training pass and 64-row decoding. Each rate is the median of
--repeats timings; the square peak is measured before and after, and its median is reported.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from grpo.commands.bench import matmul_peak


def rate(a: torch.Tensor, b: torch.Tensor, repeats: int) -> float:
    a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * a.shape[0] * a.shape[1] * b.shape[1] / statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    h, m = args.hidden, args.intermediate
    peaks = [matmul_peak()]
    # (label, a, b) in the layouts autograd uses for F.linear(x, W), W stored [out, in]:
    # forward x @ W.T, input grad g @ W, weight grad g.T @ x
    products = []
    for name, rows in (("training", args.tokens), ("decoding", args.rows)):
        for k, n in ((h, h), (h, m), (m, h)):          # attention projections, gate/up, down
            x, w, g = torch.randn(rows, k), torch.randn(n, k), torch.randn(rows, n)
            products.append((f"{name} forward [{rows}x{k}] @ [{k}x{n}]", x, w.t()))
            if name == "training":
                products.append((f"{name} input grad [{rows}x{n}] @ [{n}x{k}]", g, w))
                products.append((f"{name} weight grad [{n}x{rows}] @ [{rows}x{k}]", g.t(), x))
    rates = {label: rate(a, b, args.repeats) for label, a, b in products}
    peaks.append(matmul_peak())
    peak = statistics.median(peaks)
    print(f"square 2048 x 2048 product: {peak / 1e9:.1f} GFLOP/s ({torch.get_num_threads()} threads)")
    for label, value in rates.items():
        print(f"{label:45s} {value / 1e9:6.1f} GFLOP/s  {value / peak:4.0%} of the square product")


if __name__ == "__main__":
    main()
