#!/usr/bin/python3
"""Fits the polynomial of gelu_erfc_poly (src/backend/cuda/cuda_device.cuh) and checks it.

log2(erfc(u / sqrt 2)) = u * r(u) over u in [0, 3.92 sqrt 2], r of degree 6, by iteratively reweighted least squares
(Lawson's method: weights grow where the error is largest, towards the minimax fit). Then with u = min(|x|, 3.92 sqrt 2)
and h = 2^(u r(u) - 1) = erfc(|x| / sqrt 2) / 2, GELU(x) = x (1 - h) for x >= 0 and x h below (fitting in |x| itself
saves the scaling by 1/sqrt 2, the -1 in the exponent the halving). Evaluated in float32
against the exact GELU (math.erfc in double). Prints the coefficients as float32 literals and the errors. Needs numpy
(Debian: python3-numpy).
"""
import math

import numpy as np

CLAMP = 3.92 * math.sqrt(2)  # erfc(3.92) < 2^-27: past it the clamp's error is below f32's resolution of 1 + erf
DEGREE = 7    # coefficients of u * r(u): u^1 .. u^7


def fit():
    us = np.sort(np.cos(np.linspace(0, np.pi, 4000)) * CLAMP / 2 + CLAMP / 2)  # Chebyshev nodes on [0, CLAMP]
    target = np.array([math.log2(math.erfc(u / math.sqrt(2))) for u in us])
    basis = np.vstack([us ** (k + 1) for k in range(DEGREE)]).T
    w = np.ones_like(us)
    for _ in range(100):
        sw = np.sqrt(w)
        c, *_ = np.linalg.lstsq(basis * sw[:, None], target * sw, rcond=None)
        err = np.abs(basis @ c - target)
        w = w * (err / err.max() + 1e-3)
        w /= w.sum()
    return c.astype(np.float32), float(np.max(np.abs(basis @ c - target)))


def gelu_f32(x, c):
    x = x.astype(np.float32)
    u = np.minimum(np.abs(x), np.float32(CLAMP)).astype(np.float32)
    r = np.full_like(u, c[-1])
    for k in range(DEGREE - 2, -1, -1):
        r = (r * u + c[k]).astype(np.float32)
    h = np.exp2((r * u - np.float32(1)).astype(np.float32).astype(np.float64)).astype(np.float32)
    return (x * np.where(x >= 0, (np.float32(1) - h).astype(np.float32), h)).astype(np.float32)


def main():
    c, exponent_err = fit()
    print("coefficients (u^1 .. u^7 of u * r(u)):", ", ".join(f"{float(v)!r}f" for v in c))
    xs = np.linspace(-8, 8, 200001)
    exact = np.array([0.5 * x * math.erfc(-x / math.sqrt(2)) for x in xs])
    erff_form = np.array([np.float32(0.5) * np.float32(x) * (np.float32(1) + np.float32(math.erf(np.float32(x) * 0.70710678)))
                          for x in xs.astype(np.float32)], dtype=np.float64)
    ours = gelu_f32(xs, c).astype(np.float64)
    near = np.abs(xs) <= 5.5
    rel = lambda y: np.max(np.abs(y - exact)[near] / np.abs(exact[near]).clip(1e-30))
    print(f"max exponent error {exponent_err:.3g}")
    print(f"GELU max abs error {np.max(np.abs(ours - exact)):.3g} (erff's form {np.max(np.abs(erff_form - exact)):.3g})")
    print(f"GELU max rel error, |x| <= 5.5: {rel(ours):.3g} (erff's form {rel(erff_form):.3g})")


if __name__ == "__main__":
    main()
