"""Synthetic visual tasks rendered with Pillow: the ``builtin:vision`` taskset.

Each task is one small picture (``image_size`` pixels square, white) and a question whose text is
the same for every task of its kind, so only the picture tells the answer:

- ``count``: "How many shapes?" — 1 to ``max_count`` circles, squares and
  triangles, apart from each other; the answer is how many (chance 1 / ``max_count``).
- ``larger``: "Larger: left or right?" — one shape of a kind on each half, one side
  ``min_ratio`` to 2.2 times the other's width; the answer is ``left`` or ``right`` (chance 1/2).
- ``number``: "What digit is shown?" — one digit in Pillow's default font, of
  a random size, colour and place; the answer is the digit (chance 1/10).

Kinds take turns (task i is ``kinds[i % len(kinds)]``) and each kind's answer is drawn uniformly,
so a policy that ignores the picture answers each kind at its chance. The questions are short: a
character tokenizer (builtin:tiny-vlm's) spends a token per character. A task's metadata holds what
was drawn (``kind``; ``shapes``: each shape's kind, colour and box [x0, y0, x1, y1]; ``digit`` and
its box), from which the answer follows without the picture, and the picture itself
(``images``, see ``data.images``). Parameters (``taskset.params``): ``kinds``, ``image_size``
(default 48), ``max_count`` (4), ``min_ratio`` (1.5).
"""

from __future__ import annotations

import math
import random
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from rftflow.components.data.images import metadata_entry, png_bytes

KINDS = ("count", "larger", "number")
QUESTIONS = {
    "count": "How many shapes?",
    "larger": "Larger: left or right?",
    "number": "What digit is shown?",
}
SHAPES = ("circle", "square", "triangle")
COLORS = {"red": (220, 40, 40), "green": (30, 160, 60), "blue": (40, 70, 220), "orange": (240, 140, 20),
          "purple": (140, 50, 180), "black": (20, 20, 20)}
BACKGROUND = (255, 255, 255)


def chance(kind: str, params: dict[str, Any] | None = None) -> float:
    """The accuracy of a policy that ignores the picture, for tasks of ``kind`` (answers uniform)."""
    return {"count": 1 / int((params or {}).get("max_count", 4)), "larger": 1 / 2, "number": 1 / 10}[kind]


def vision_task_entries(params: dict[str, Any], size: int, seed: int) -> list[dict[str, Any]]:
    """``size`` task entries (question, answer, metadata with the picture), drawn with ``seed``."""
    kinds = list(params.get("kinds", KINDS))
    unknown = [k for k in kinds if k not in KINDS]
    if not kinds or unknown:
        raise ValueError(f"params.kinds {kinds}: each must be one of {', '.join(KINDS)}")
    side, max_count = int(params.get("image_size", 48)), int(params.get("max_count", 4))
    min_ratio = float(params.get("min_ratio", 1.5))
    if not 32 <= side <= 512:
        raise ValueError(f"params.image_size must be from 32 to 512 pixels, got {side}")
    if not 2 <= max_count <= 6:
        raise ValueError(f"params.max_count must be from 2 to 6, got {max_count}")
    if not 1.2 <= min_ratio <= 2.0:
        raise ValueError(f"params.min_ratio must be from 1.2 to 2.0, got {min_ratio}")
    rng = random.Random(seed)
    entries = []
    for i in range(size):
        kind = kinds[i % len(kinds)]
        image = Image.new("RGB", (side, side), BACKGROUND)
        draw = ImageDraw.Draw(image)
        if kind == "count":
            shapes = _apart_shapes(rng, rng.randint(1, max_count), side)
            answer = str(len(shapes))
            metadata: dict[str, Any] = {"shapes": shapes}
        elif kind == "larger":
            shapes = _left_and_right(rng, side, min_ratio)
            answer = "left" if shapes[0]["box"][2] - shapes[0]["box"][0] > shapes[1]["box"][2] - shapes[1]["box"][0] \
                else "right"
            metadata = {"shapes": shapes}
        else:
            digit = rng.randrange(10)
            metadata = {"digit": digit, **_draw_digit(draw, rng, digit, side)}
            answer = str(digit)
        for shape in metadata.get("shapes", ()):
            _draw_shape(draw, shape)
        metadata = {"kind": kind, **metadata, "images": [metadata_entry(png_bytes(image))]}
        entries.append({"question": QUESTIONS[kind], "answer": answer, "metadata": metadata})
    return entries


def _shape(rng: random.Random, box: list[int]) -> dict[str, Any]:
    return {"shape": rng.choice(SHAPES), "color": rng.choice(list(COLORS)), "box": box}


def _apart_shapes(rng: random.Random, n: int, side: int) -> list[dict[str, Any]]:
    """``n`` shapes of width side/6 to side/4, at least 2 pixels apart, inside the picture (drawn
    again from scratch until all fit)."""
    low, high = max(5, side // 6), max(6, side // 4)
    while True:
        boxes: list[list[int]] = []
        for _ in range(n):
            for _attempt in range(50):
                w = rng.randint(low, high)
                x, y = rng.randint(1, side - w - 2), rng.randint(1, side - w - 2)
                box = [x, y, x + w, y + w]
                if all(_apart(box, other, 2) for other in boxes):
                    boxes.append(box)
                    break
        if len(boxes) == n:
            return [_shape(rng, box) for box in boxes]


def _apart(a: list[int], b: list[int], gap: int) -> bool:
    return a[2] + gap <= b[0] or b[2] + gap <= a[0] or a[3] + gap <= b[1] or b[3] + gap <= a[1]


def _left_and_right(rng: random.Random, side: int, min_ratio: float) -> list[dict[str, Any]]:
    """A shape on each half, of one kind; one side ``min_ratio``–2.2 times the other's width."""
    half = side // 2
    small = rng.randint(max(4, side // 10), max(5, side // 6))
    big = min(half - 4, math.ceil(small * rng.uniform(min_ratio, 2.2)))
    widths = [small, big] if rng.random() < 0.5 else [big, small]
    kind = rng.choice(SHAPES)
    shapes = []
    for offset, w in zip((0, half), widths):
        x = offset + rng.randint(2, half - w - 2)
        y = rng.randint(2, side - w - 2)
        shapes.append({"shape": kind, "color": rng.choice(list(COLORS)), "box": [x, y, x + w, y + w]})
    return shapes


def _draw_shape(draw: ImageDraw.ImageDraw, shape: dict[str, Any]) -> None:
    x0, y0, x1, y1 = shape["box"]
    color = COLORS[shape["color"]]
    if shape["shape"] == "circle":
        draw.ellipse((x0, y0, x1, y1), fill=color)
    elif shape["shape"] == "square":
        draw.rectangle((x0, y0, x1, y1), fill=color)
    else:
        draw.polygon([((x0 + x1) / 2, y0), (x1, y1), (x0, y1)], fill=color)


def _draw_digit(draw: ImageDraw.ImageDraw, rng: random.Random, digit: int, side: int) -> dict[str, Any]:
    """Draw ``digit`` in Pillow's default font at a random size, colour and place; what was drawn."""
    size = rng.randint(side * 5 // 12, side * 2 // 3)
    font = ImageFont.load_default(size=size)
    left, top, right, bottom = draw.textbbox((0, 0), str(digit), font=font)
    x = rng.randint(1 - left, max(1 - left, side - right - 1))
    y = rng.randint(1 - top, max(1 - top, side - bottom - 1))
    color = rng.choice(list(COLORS))
    draw.text((x, y), str(digit), fill=COLORS[color], font=font)
    return {"color": color, "font_size": size, "box": [x + left, y + top, x + right, y + bottom]}
