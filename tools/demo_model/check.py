"""Prompt-adherence checker for demo images (Python twin of tests/demo_checker.cc; same rules, same constants).

  background: the palette colour most border pixels are nearest to;
  foreground: pixels farther than FG_THRESHOLD from that colour; objects: its 4-connected components of at
              least MIN_AREA_FRAC of the image;
  colour:     the palette colour (not the background) most object pixels are nearest to;
  shape:      per object, solidity = area / convex-hull area and fill = area / bounding-box area:
              solidity < 0.75 star (0.56), else fill > 0.9 square (1.0), > 0.64 circle (0.785), else triangle (0.5);
  size:       mean bounding-box side / image side, small below 0.255 (drawn at 0.17 and 0.34);
  position:   the object's centroid (left: x < 0.4, right: x > 0.6, top/bottom likewise, center: within 0.12).
A prompt passes when everything it names is right.
"""
import numpy as np

import shapes

FG_THRESHOLD = 60.0
MIN_AREA_FRAC = 0.004
STAR_SOLIDITY = 0.75
SQUARE_FILL = 0.9
CIRCLE_FILL = 0.64
SMALL_LARGE_SPLIT = 0.255
SIDE_SPLIT, CENTER_TOL = 0.4, 0.12
PALETTE = np.array([shapes.COLOURS[c] for c in shapes.COLOUR_NAMES], np.float32)


def parse_prompt(text):
    w = text.lower().split()
    exp = {"count": {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3}.get(w[0])}
    exp["size"] = next((x for x in w if x in shapes.SIZES), None)
    colours = [x for x in w if x in shapes.COLOURS]
    exp["colour"] = colours[0] if colours else None
    exp["background"] = w[w.index("background") - 1] if "background" in w else None
    exp["shape"] = next((x.rstrip("s") for x in w if x.rstrip("s") in shapes.SHAPES), None)
    exp["position"] = next((x for x in w if x in shapes.POSITIONS), None)
    return exp


def _nearest(pixels):  # [N, 3] -> palette index [N]
    d = ((pixels[:, None, :] - PALETTE[None]) ** 2).sum(-1)
    return d.argmin(1)


def _components(mask):
    """4-connected components of a bool [H, W] mask -> list of (ys, xs) arrays."""
    h, w = mask.shape
    seen = np.zeros_like(mask)
    comps = []
    for y0, x0 in zip(*np.nonzero(mask)):
        if seen[y0, x0]:
            continue
        stack, ys, xs = [(y0, x0)], [], []
        seen[y0, x0] = True
        while stack:
            y, x = stack.pop()
            ys.append(y)
            xs.append(x)
            for ny, nx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
                if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    stack.append((ny, nx))
        comps.append((np.array(ys), np.array(xs)))
    return comps


def _hull_area(ys, xs):
    """Area of the convex hull of the pixels' corner points (a filled square's hull is its area)."""
    pts = set()
    for y, x in zip(ys.tolist(), xs.tolist()):
        pts.update(((x, y), (x + 1, y), (x, y + 1), (x + 1, y + 1)))
    pts = sorted(pts)
    if len(pts) < 3:
        return 0.0
    cross = lambda o, a, b: (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])
    lower, upper = [], []
    for p in pts:
        while len(lower) >= 2 and cross(lower[-2], lower[-1], p) <= 0:
            lower.pop()
        lower.append(p)
    for p in reversed(pts):
        while len(upper) >= 2 and cross(upper[-2], upper[-1], p) <= 0:
            upper.pop()
        upper.append(p)
    hull = lower[:-1] + upper[:-1]
    return abs(sum(hull[i][0] * hull[i - 1][1] - hull[i - 1][0] * hull[i][1] for i in range(len(hull)))) / 2.0


def classify_shape(ys, xs):
    area = len(ys)
    fill = area / float((ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1))
    solidity = area / max(_hull_area(ys, xs), 1.0)
    if solidity < STAR_SOLIDITY:
        return "star"
    if fill > SQUARE_FILL:
        return "square"
    return "circle" if fill > CIRCLE_FILL else "triangle"


def analyse(img):
    """img: HWC uint8 -> what the image shows (background, colour, shape, count, size, position)."""
    h, w, _ = img.shape
    px = img.astype(np.float32)
    border = np.concatenate([px[:2].reshape(-1, 3), px[-2:].reshape(-1, 3), px[:, :2].reshape(-1, 3),
                             px[:, -2:].reshape(-1, 3)])
    bg = np.bincount(_nearest(border), minlength=len(PALETTE)).argmax()
    mask = np.sqrt(((px - PALETTE[bg]) ** 2).sum(-1)) > FG_THRESHOLD
    comps = [c for c in _components(mask) if len(c[0]) >= MIN_AREA_FRAC * h * w]
    out = {"background": shapes.COLOUR_NAMES[bg], "count": len(comps), "colour": None, "shape": None,
           "size": None, "position": None}
    if not comps:
        return out
    ys = np.concatenate([c[0] for c in comps])
    xs = np.concatenate([c[1] for c in comps])
    d = ((px[ys, xs][:, None, :] - PALETTE[None]) ** 2).sum(-1)
    d[:, bg] = np.inf
    out["colour"] = shapes.COLOUR_NAMES[np.bincount(d.argmin(1), minlength=len(PALETTE)).argmax()]
    kinds = [classify_shape(*c) for c in comps]
    out["shape"] = max(set(kinds), key=kinds.count)
    side = np.mean([max(c[0].max() - c[0].min() + 1, c[1].max() - c[1].min() + 1) for c in comps]) / w
    out["size"] = "small" if side < SMALL_LARGE_SPLIT else "large"
    out["position"] = (xs.mean() / w, ys.mean() / h)
    return out


def position_matches(named, cx, cy):
    if named == "center":
        return abs(cx - 0.5) < CENTER_TOL and abs(cy - 0.5) < CENTER_TOL
    return {"left": cx < SIDE_SPLIT, "right": cx > 1 - SIDE_SPLIT, "top": cy < SIDE_SPLIT,
            "bottom": cy > 1 - SIDE_SPLIT}[named]


def check(img, prompt):
    """-> (passed, expected, found)."""
    exp, got = parse_prompt(prompt), analyse(img)
    ok = all(exp[k] is None or exp[k] == got[k] for k in ("background", "colour", "shape", "count", "size"))
    if exp["position"] is not None:
        ok = ok and got["position"] is not None and position_matches(exp["position"], *got["position"])
    return ok, exp, got


if __name__ == "__main__":
    import sys
    from PIL import Image
    for path, prompt in (l.rstrip("\n").split("\t") for l in open(sys.argv[1])):
        import os
        ok, exp, got = check(np.array(Image.open(os.path.join(os.path.dirname(sys.argv[1]), path)).convert("RGB")), prompt)
        print("PASS" if ok else "FAIL", prompt, got)
