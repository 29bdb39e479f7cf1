"""Fast batch renderer for the demo shapes: one pass of signed distances per pixel instead of shapes.py's
4x4 supersampled point-in-shape tests (16 passes), for the same scene arrays (shapes.scene_arrays).

Coverage of a pixel is clamp(0.5 - d, 0, 1) with d the signed distance (in pixels, negative inside) from the
pixel centre to the shape's outline: the area of a 1 px box cut by a straight edge, which is what the
supersampling approximates. Circle and square distances are exact; triangle and star use the distance to
the nearest edge's line (exact along edges, slightly sharp at convex corners, a sub-pixel difference).

  python3 shapes_torch.py      renders 256 training scenes both ways and prints the mean abs difference
"""
import math

import numpy as np
import torch

import shapes

MAX_MEAN_ABS_DIFF = 0.5 / 255  # allowed mean |sdf - supersampled| (0..1 units); measured 0.07-0.14/255,
# while a 1 px shift of every shape gives 1.6/255 and 10% larger shapes 2.3/255


def _star_constants():
    """Outer radius, the star centre's offset from the bbox centre, the tip and inner vertex (local units)."""
    R = 1.0 / math.sin(math.radians(72))
    r = shapes.STAR_INNER * R
    shift = R - (R + R * math.cos(math.radians(36))) / 2.0
    return R, shift, (r * math.cos(math.pi / 5), r * math.sin(math.pi / 5))


def _sdf(kind, dx, dy, hs):
    """Signed distance in pixels (negative inside) from the pixel centres to the outline.
    kind [B,K,1,1] (shapes.SHAPES index); dx, dy [B,K,w,w] pixel offsets from the bbox centre; hs [B,K,1,1]
    half side in pixels. -> [B,K,w,w]"""
    circle = torch.sqrt(dx * dx + dy * dy) - hs
    qx, qy = dx.abs() - hs, dy.abs() - hs
    square = torch.sqrt(qx.clamp(min=0) ** 2 + qy.clamp(min=0) ** 2) + torch.maximum(qx, qy).clamp(max=0)
    # Triangle: apex (0, -hs), base corners (+-hs, hs); the max of its three edges' half-plane distances.
    triangle = torch.maximum(dy - hs, (dx.abs() - 0.5 * dy - 0.5 * hs) / math.sqrt(1.25))
    # Star: fold the angle into one tip -> inner-vertex sector (as shapes._inside), then that edge's line.
    R, shift, (ix, iy) = _star_constants()
    u, vs = dx / hs, dy / hs + shift
    theta = torch.atan2(u, -vs) % (2 * math.pi / 5)
    delta = torch.minimum(theta, 2 * math.pi / 5 - theta)
    rho = torch.sqrt(u * u + vs * vs)
    px, py = rho * torch.cos(delta), rho * torch.sin(delta)
    star = -((ix - R) * py - iy * (px - R)) / math.hypot(ix - R, iy) * hs
    return torch.where(kind == 0, circle, torch.where(kind == 1, square, torch.where(kind == 2, triangle, star)))


def render_arrays(kind, geo, fg, bg, w=shapes.IMAGE_SIZE, device="cpu"):
    """shapes.scene_arrays' output (numpy or torch) -> images [B, 3, w, w] float32 in [-1, 1] on `device`."""
    kind, geo, fg, bg = (torch.as_tensor(a).to(device) for a in (kind, geo, fg, bg))
    kind = kind[:, :, None, None]
    cx, cy, hs = (geo[:, :, i, None, None].float() for i in range(3))
    valid = hs > 0
    hs = hs.clamp(min=1e-3)
    centre = torch.arange(w, dtype=torch.float32, device=device) + 0.5
    dx = centre[None, None, None, :] - cx
    dy = centre[None, None, :, None] - cy
    cover = (0.5 - _sdf(kind, dx, dy, hs)).clamp(0.0, 1.0) * valid
    cover = cover.amax(dim=1, keepdim=True)  # shapes never overlap: the union is the max
    img = bg.float()[:, :, None, None] * (1 - cover) + fg.float()[:, :, None, None] * cover
    return img / 127.5 - 1.0


def render(scenes, w=shapes.IMAGE_SIZE, device="cpu"):
    """Scenes -> images [B, 3, w, w] float32 in [-1, 1] on `device`."""
    return render_arrays(*shapes.scene_arrays(scenes), w=w, device=device)


def mean_abs_diff(n=256, seed=0, w=shapes.IMAGE_SIZE, device="cpu"):
    """Mean |this render - shapes.render| over n training scenes, in 0..1 units, and the max per image."""
    rng = np.random.RandomState(seed)
    scenes, _ = shapes.sample_batch(rng, n, shapes.all_triples(), w)
    arrays = shapes.scene_arrays(scenes)
    diffs = []
    for i in range(0, n, 32):  # chunks: the supersampled reference is memory-hungry on a CPU
        part = [a[i:i + 32] for a in arrays]
        ref = shapes.render_arrays(*part, w=w, device=device)
        got = render_arrays(*part, w=w, device=device)
        diffs.append(((got - ref).abs() / 2).mean(dim=(1, 2, 3)))
    d = torch.cat(diffs)
    return d.mean().item(), d.max().item()


if __name__ == "__main__":
    for size in (shapes.IMAGE_SIZE, 64):
        mean, worst = mean_abs_diff(w=size)
        print("%d px: mean abs diff %.5f (= %.2f/255), worst image %.5f (= %.2f/255)" % (
            size, mean, mean * 255, worst, worst * 255))
        assert mean < MAX_MEAN_ABS_DIFF, "sdf renderer drifted from shapes.py"
