"""Procedural training data for the Atelier demo model: coloured shapes on coloured backgrounds + captions.

    "two small yellow stars on a purple background", "a red circle on the left on a blue background"

A scene is sampled with numpy (deterministic by seed) and rendered with torch (on the GPU during training,
on the CPU here), anti-aliased by supersampling: each pixel's coverage is the mean of an SS x SS grid of
point-in-shape tests. Some (colour, shape, background) triples are held out of training entirely; the
evaluation prompts come from them (tests/data/demo/heldout_prompts.txt).

CLI: python3 shapes.py --png DIR --count N     writes N sample PNGs (+ captions.txt)
     python3 shapes.py --heldout FILE          writes the 50 held-out evaluation prompts
"""
import argparse
import math
import os

import numpy as np
import torch

IMAGE_SIZE = 128
# Named colours, far apart in RGB (the C++ checker, tests/demo_checker.cc, has the same table).
COLOURS = {"red": (215, 35, 35), "orange": (250, 140, 20), "yellow": (250, 230, 40), "green": (40, 170, 60),
           "blue": (40, 80, 225), "purple": (140, 50, 180), "white": (245, 245, 245), "black": (25, 25, 25)}
COLOUR_NAMES = list(COLOURS)
SHAPES = ["circle", "square", "triangle", "star"]
COUNT_WORDS = {1: ["a", "one"], 2: ["two"], 3: ["three"]}
SIZES = {"small": 0.17, "large": 0.34}  # side of the shape's bounding box, as a fraction of the image
SIZE_JITTER = 0.08
POSITIONS = {"left": "on the left", "right": "on the right", "top": "at the top", "bottom": "at the bottom",
             "center": "in the center"}
MARGIN = 4 / 128    # between a shape and the image border, as a fraction of the image
GAP = 6 / 128       # between the bounding boxes of two shapes, as a fraction of the image
SUPERSAMPLE = 4     # SS x SS coverage samples per pixel
P_SIZE_WORD = 0.75  # captions that name the size (otherwise it is random)
P_POSITION = 0.5    # single-shape captions that name a position
HELDOUT_TRIPLES = 24
HELDOUT_SEED = 1234
README_TRIPLE = ("red", "circle", "blue")  # the README's first command: always in the training set
STAR_INNER = 0.45   # inner / outer radius of the 5-point star


def all_triples():
    return [(c, s, b) for c in COLOUR_NAMES for s in SHAPES for b in COLOUR_NAMES if b != c]


def heldout_triples():
    """(colour, shape, background) triples never shown in training."""
    rng = np.random.RandomState(HELDOUT_SEED)
    cands = [t for t in all_triples() if t != README_TRIPLE]
    idx = rng.choice(len(cands), HELDOUT_TRIPLES, replace=False)
    return sorted(cands[i] for i in idx)


def training_triples():
    held = set(heldout_triples())
    return [t for t in all_triples() if t not in held]


def caption_words():
    """Every word a caption can contain (the BPE vocabulary is built from these)."""
    words = {"an", "on", "background", "the", "at", "in"}
    for ws in COUNT_WORDS.values():
        words.update(ws)
    words.update(SIZES)
    words.update(COLOUR_NAMES)
    words.update(SHAPES)
    words.update(s + "s" for s in SHAPES)
    for p in POSITIONS.values():
        words.update(p.split())
    return sorted(words)


class Scene:
    """One image's content: `count` shapes of one kind, colour and size, on a background."""

    def __init__(self, colour, shape, background, count, size, position, sizes_px, centres):
        self.colour, self.shape, self.background = colour, shape, background
        self.count, self.size, self.position = count, size, position
        self.sizes_px, self.centres = sizes_px, centres  # per shape: bbox side; (cx, cy) in pixels

    def caption(self, rng=None, name_size=True):
        n = self.count
        word = COUNT_WORDS[n][0] if rng is None else COUNT_WORDS[n][rng.randint(len(COUNT_WORDS[n]))]
        parts = []
        if name_size:
            parts.append(self.size)
        parts += [self.colour, self.shape + ("s" if n > 1 else "")]
        if word == "a" and parts[0][0] in "aeiou":
            word = "an"
        text = " ".join([word] + parts)
        if self.position:
            text += " " + POSITIONS[self.position]
        article = "an" if self.background[0] in "aeiou" else "a"
        return text + " on " + article + " " + self.background + " background"


def _place(rng, count, sides, position, w):
    """Centres of `count` shapes with bounding-box sides `sides`, inside the image, apart from each other."""
    margin, gap = MARGIN * w, GAP * w
    for _ in range(50):
        cs = []
        for s in sides:
            lo, hi = s / 2 + margin, w - s / 2 - margin
            if position == "left":
                c = (rng.uniform(lo, max(lo, 0.33 * w)), rng.uniform(0.38 * w, 0.62 * w))
            elif position == "right":
                c = (rng.uniform(min(hi, 0.67 * w), hi), rng.uniform(0.38 * w, 0.62 * w))
            elif position == "top":
                c = (rng.uniform(0.38 * w, 0.62 * w), rng.uniform(lo, max(lo, 0.33 * w)))
            elif position == "bottom":
                c = (rng.uniform(0.38 * w, 0.62 * w), rng.uniform(min(hi, 0.67 * w), hi))
            elif position == "center":
                c = (rng.uniform(0.45 * w, 0.55 * w), rng.uniform(0.45 * w, 0.55 * w))
            else:
                c = (rng.uniform(lo, hi), rng.uniform(lo, hi))
            cs.append(c)
        ok = all(abs(a[0] - b[0]) > (sa + sb) / 2 + gap or abs(a[1] - b[1]) > (sa + sb) / 2 + gap
                 for i, (a, sa) in enumerate(zip(cs, sides)) for (b, sb) in zip(cs[i + 1:], sides[i + 1:]))
        if ok:
            return cs
    return _grid_place(rng, sides, w)


def _grid_place(rng, sides, w):
    """Fallback for crowded scenes: distinct cells of a 2x2 (large) or 3x3 (small) grid, jittered inside."""
    n = 2 if max(sides) > 0.25 * w else 3
    cell = w / n
    cells = rng.choice(n * n, len(sides), replace=False)
    out = []
    for c, s in zip(cells, sides):
        j = max(0.0, (cell - s - GAP * w) / 2)
        out.append(((c % n + 0.5) * cell + rng.uniform(-j, j), (c // n + 0.5) * cell + rng.uniform(-j, j)))
    return out


def sample_scene(rng, triples, w=IMAGE_SIZE):
    colour, shape, bg = triples[rng.randint(len(triples))]
    count = 1 + rng.randint(3)
    size = list(SIZES)[rng.randint(2)]
    position = None
    if count == 1 and rng.rand() < P_POSITION:
        position = list(POSITIONS)[rng.randint(len(POSITIONS))]
    sides = [SIZES[size] * w * (1 + rng.uniform(-SIZE_JITTER, SIZE_JITTER)) for _ in range(count)]
    return Scene(colour, shape, bg, count, size, position, sides, _place(rng, count, sides, position, w))


def sample_batch(rng, n, triples, w=IMAGE_SIZE):
    """n scenes and their captions (the size word is left out of some)."""
    scenes = [sample_scene(rng, triples, w) for _ in range(n)]
    caps = [s.caption(rng, name_size=rng.rand() < P_SIZE_WORD) for s in scenes]
    return scenes, caps


def _inside(kind, u, v):
    """Point-in-shape for local coordinates u, v in [-1, 1] (the bounding box), y down. kind: [B,K,1,1]."""
    circle = u * u + v * v <= 1.0
    square = (u.abs() <= 1.0) & (v.abs() <= 1.0)
    triangle = (v <= 1.0) & (u.abs() <= (v + 1.0) / 2.0)
    # 5-point star, tip up: outer radius R so that its width (2 R sin 72) is 2, shifted so its bbox is centred.
    R = 1.0 / math.sin(math.radians(72))
    r = STAR_INNER * R
    vs = v + (R - (R + R * math.cos(math.radians(36))) / 2.0)  # star centre -> bbox centre
    theta = torch.atan2(u, -vs) % (2 * math.pi / 5)
    delta = torch.minimum(theta, 2 * math.pi / 5 - theta)  # 0 at a tip, 36 degrees at an inner vertex
    rho = torch.sqrt(u * u + vs * vs)
    px, py = rho * torch.cos(delta), rho * torch.sin(delta)
    ix, iy = r * math.cos(math.pi / 5), r * math.sin(math.pi / 5)
    # Inside when on the origin's side of the tip->inner-vertex edge.
    star = (ix - R) * py - iy * (px - R) >= 0.0
    return torch.where(kind == 0, circle, torch.where(kind == 1, square, torch.where(kind == 2, triangle, star)))


def scene_arrays(scenes):
    """Scenes -> numpy arrays for render_arrays: kind [B,K] int64, geo [B,K,3] (cx, cy, half side; 0 = none),
    fg [B,3], bg [B,3] (0..255)."""
    b, k = len(scenes), max(s.count for s in scenes)
    kind = np.zeros((b, k), np.int64)
    geo = np.zeros((b, k, 3), np.float32)
    fg = np.array([COLOURS[s.colour] for s in scenes], np.float32)
    bg = np.array([COLOURS[s.background] for s in scenes], np.float32)
    for i, s in enumerate(scenes):
        for j, (c, side) in enumerate(zip(s.centres, s.sizes_px)):
            kind[i, j] = SHAPES.index(s.shape)
            geo[i, j] = (c[0], c[1], side / 2)
    return kind, geo, fg, bg


def render_arrays(kind, geo, fg, bg, w=IMAGE_SIZE, device="cpu", ss=SUPERSAMPLE):
    """scene_arrays' output -> images [B, 3, w, w] float32 in [-1, 1] on `device`."""
    kind, geo, fg, bg = (torch.from_numpy(a).to(device) for a in (kind, geo, fg, bg))
    b = kind.shape[0]
    kind = kind[:, :, None, None]
    cx, cy, hs = (geo[:, :, i, None, None] for i in range(3))
    valid = hs > 0
    hs = hs.clamp(min=1e-3)
    pix = torch.arange(w, dtype=torch.float32, device=device)
    cover = torch.zeros(b, 1, w, w, device=device)
    for sy in range(ss):
        for sx in range(ss):
            y = (pix + (sy + 0.5) / ss)[None, None, :, None]
            x = (pix + (sx + 0.5) / ss)[None, None, None, :]
            hit = _inside(kind, (x - cx) / hs, (y - cy) / hs) & valid
            cover += hit.any(dim=1, keepdim=True).float()
    cover /= ss * ss
    img = bg[:, :, None, None] * (1 - cover) + fg[:, :, None, None] * cover
    return img / 127.5 - 1.0


def render(scenes, w=IMAGE_SIZE, device="cpu"):
    """Scenes -> images [B, 3, w, w] float32 in [-1, 1] on `device`."""
    return render_arrays(*scene_arrays(scenes), w=w, device=device)


def to_uint8(img):
    """[3, H, W] in [-1, 1] -> HWC uint8 numpy."""
    return ((img.clamp(-1, 1) + 1) * 127.5).round().byte().permute(1, 2, 0).cpu().numpy()


def heldout_prompts(n=50, seed=7):
    """The evaluation prompts: scenes from held-out triples, size always named, some positions."""
    rng = np.random.RandomState(seed)
    held = heldout_triples()
    out = []
    for i in range(n):
        colour, shape, bg = held[i % len(held)]
        s = sample_scene(rng, [(colour, shape, bg)])
        out.append(s.caption(rng, name_size=True))
    return out


def _save_png(arr, path):
    from PIL import Image
    Image.fromarray(arr).save(path, optimize=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--png", help="write sample PNGs to this folder")
    ap.add_argument("--count", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heldout", help="write the held-out evaluation prompts to this file")
    a = ap.parse_args()
    if a.heldout:
        with open(a.heldout, "w") as f:
            f.write("\n".join(heldout_prompts()) + "\n")
    if a.png:
        os.makedirs(a.png, exist_ok=True)
        rng = np.random.RandomState(a.seed)
        scenes, caps = sample_batch(rng, a.count, all_triples())
        caps = [s.caption(name_size=True) for s in scenes]
        imgs = render(scenes)
        with open(os.path.join(a.png, "captions.txt"), "w") as f:
            for i, (img, cap) in enumerate(zip(imgs, caps)):
                name = "shape_%02d.png" % i
                _save_png(to_uint8(img), os.path.join(a.png, name))
                f.write("%s\t%s\n" % (name, cap))


if __name__ == "__main__":
    main()
