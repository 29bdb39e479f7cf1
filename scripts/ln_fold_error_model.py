#!/usr/bin/python3
"""Models the roundings of the layer norm folded into the GLU (src/backend/cuda/cuda_ln_fold.cu) on the CPU.

The GPU test CudaOps.LayerNormFoldedIntoTheGluMatchesCpu compares the folded op with a double-precision reference
through the parity criterion (tests/cuda_test_util.h: tolerance 2 x the CPU's error on bf16-rounded inputs + an
output ulp). This script runs the same four cases (their shapes; inputs of the same kind, not the same values)
three ways in numpy:
  unfolded: LN in f32, its output rounded to bf16, the product in f32, the result rounded (the GPU's path today);
  folded:   x (bf16) times bf16(w gamma) in f32, then rstd acc - rstd mean g + w beta + bias, g the row sums of
            the rounded w gamma (what the kernels compute);
and prints each one's relative L2 error against the reference, beside the CPU's error and the tolerance. Written in
session 38 before the fold could run on a GPU. Needs numpy (Debian: python3-numpy).
"""
import math

import numpy as np

EPS = 1e-5
OUTPUT_ULP = 1.0 / 256  # the parity criterion's bf16 term (output_ulp)
rng = np.random.default_rng(0)


def bf16(a):
    """a rounded to bfloat16 (nearest even), kept as float32."""
    u = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def glu_of_norm(x, gamma, beta, w, b, h, round_norm):
    """The reference form: (LN(x) w^T + b) split in value and gate halves, value * gelu(gate)."""
    mean = x.mean(1, keepdims=True)
    var = ((x - mean) ** 2).mean(1, keepdims=True)
    ln = (x - mean) / np.sqrt(var + EPS) * gamma + beta
    if round_norm:
        ln = bf16(ln)
    y = ln @ w.T + b
    return y[:, :h] * gelu(y[:, h:])


def folded(x, gamma, beta, w, b, h):
    """The kernels' form, in float32 where they use float32."""
    wf = bf16(w * gamma[None, :])
    g = wf.astype(np.float64).sum(1)
    bp = w.astype(np.float64) @ beta + b
    mean = x.mean(1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mean) ** 2).mean(1, keepdims=True) + EPS)
    acc = x.astype(np.float32) @ wf.T.astype(np.float32)
    y = rstd * acc - mean * rstd * g[None, :] + bp[None, :]
    return bf16((y[:, :h] * gelu(y[:, h:])).astype(np.float32))


def case(m, k, h, mean, affine):
    x = rng.uniform(-1, 1, (m, k)).astype(np.float32) + mean
    gamma = rng.uniform(-0.5, 0.5, k).astype(np.float32) + 1.0
    beta = rng.uniform(-0.5, 0.5, k).astype(np.float32) if affine else np.zeros(k, np.float32)
    w = (rng.uniform(-1, 1, (2 * h, k)) / math.sqrt(k)).astype(np.float32)
    b = rng.uniform(-0.5, 0.5, 2 * h).astype(np.float32) if affine else np.zeros(2 * h, np.float32)
    want = glu_of_norm(x.astype(np.float64), gamma, beta, w, b, h, False)
    r = [bf16(t) for t in (x, gamma, beta, w, b)]
    rel = lambda a: np.linalg.norm(a - want) / np.linalg.norm(want)
    cpu = rel(glu_of_norm(r[0].astype(np.float64), *r[1:], h, False))
    unfolded = rel(bf16(glu_of_norm(*r, h, True).astype(np.float32)))
    print(f"[{m}, {k}] x [{2 * h}, {k}] mean {mean}: cpu {cpu:.3g}  tol {2 * cpu + OUTPUT_ULP:.3g}  "
          f"unfolded {unfolded:.3g}  folded {rel(folded(*r, h)):.3g}")


if __name__ == "__main__":
    case(256, 320, 1280, 0.0, True)
    case(100, 640, 2560, 0.0, True)
    case(77, 64, 96, 0.0, False)
    case(200, 320, 1280, 8.0, True)
