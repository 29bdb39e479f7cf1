#!/usr/bin/env python3
"""PyTorch's figures for the kernels cuda_ops_bench times, on the same shapes and the same card (the
reference implementation's kernels: scaled_dot_product_attention picks FlashAttention-2 / cuDNN attention,
convolutions go through cuDNN v9). Run on the GPU machine next to cuda_ops_bench so the ratios come from one
run; torch is not a build or test dependency.

  python3 bench/torch_reference_ops.py [--iters 20]

Each line: name, median ms of `iters` calls timed with CUDA events after 3 warm-ups, TFLOP/s (FLOPs counted
as cuda_ops_bench counts them: 4*B*H*Sq*Sk*D for attention, 2*N*O*Ho*Wo*C*kh*kw for convolutions).
"""
import argparse

import torch
import torch.nn.functional as F

WARMUP = 3
ATTENTION_CASES = [  # b, h, sq, sk, d, what (cuda_ops_bench's list)
    (2, 8, 4096, 4096, 40, "SD1.5 512 level 0"),
    (16, 8, 4096, 4096, 40, "SD1.5 512 level 0, batch 16"),
    (2, 8, 1024, 1024, 80, "SD1.5 512 level 1"),
    (2, 8, 256, 256, 160, "SD1.5 512 level 2"),
    (2, 8, 4096, 77, 40, "SD1.5 cross-attention"),
    (2, 8, 16384, 16384, 40, "SD1.5 1024 level 0"),
    (2, 8, 4096, 4096, 64, "head dim 64"),
    (1, 24, 4608, 4608, 128, "FLUX 1024"),
]


def time_ms(fn, iters):
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    ms = sorted(a.elapsed_time(b) for a, b in ev)
    return ms[len(ms) // 2]


def report(name, ms, flops):
    print("%-78s %9.4f ms %8.1f TFLOP/s" % (name, ms, flops / ms / 1e9), flush=True)


def attention(iters):
    for b, h, sq, sk, d, what in ATTENTION_CASES:
        q = torch.randn(b, h, sq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, h, sk, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, h, sk, d, device="cuda", dtype=torch.bfloat16)
        ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v), iters)
        report("torch sdpa %dx%dx%dx%d d%d bf16 (%s)" % (b, h, sq, sk, d, what), ms, 4.0 * b * h * sq * sk * d)


def convolution(iters):
    torch.backends.cudnn.benchmark = True
    for dt in (torch.bfloat16, torch.float16):
        for fmt in (torch.contiguous_format, torch.channels_last):
            for n, c, hw in ((2, 320, 64), (16, 320, 64), (2, 640, 32), (2, 1280, 16)):
                x = torch.randn(n, c, hw, hw, device="cuda", dtype=dt).to(memory_format=fmt)
                w = (0.05 * torch.randn(c, c, 3, 3, device="cuda", dtype=dt)).to(memory_format=fmt)
                bias = torch.randn(c, device="cuda", dtype=dt)
                ms = time_ms(lambda: F.conv2d(x, w, bias, padding=1), iters)
                layout = "NHWC" if fmt is torch.channels_last else "NCHW"
                report("torch conv3x3 %dx%dx%dx%d -> %d +bias %s %s (cudnn.benchmark)" % (n, c, hw, hw, c, str(dt)[6:], layout),
                       ms, 2.0 * n * c * hw * hw * c * 9)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name()), flush=True)
    attention(a.iters)
    convolution(a.iters)


if __name__ == "__main__":
    main()
