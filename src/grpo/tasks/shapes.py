"""Shapes: a 32x32 picture of 1 to 4 coloured shapes on black; "how many shapes?" -> "3".

The vision demo's task (`grpo train task=shapes`): the answer is in the pixels only, so a model
that ignores the image scores about 1 in 4. Images are drawn by the package from a seed (no
files, no download); held-out pictures come from their own seeds, never drawn for training.
"""

from __future__ import annotations

import random

SIZE, CELL = 32, 8                  # a 4x4 grid of 8-pixel cells, one shape at most per cell
COLOURS = [(255, 64, 64), (64, 220, 64), (80, 120, 255), (255, 220, 40), (230, 80, 230), (60, 220, 220)]


def draw(count: int, rng: random.Random):
    """A picture of `count` shapes (squares, discs, triangles) in distinct cells, jittered."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (SIZE, SIZE), (0, 0, 0))
    pen = ImageDraw.Draw(image)
    for cell in rng.sample(range((SIZE // CELL) ** 2), count):
        x0 = (cell % (SIZE // CELL)) * CELL + rng.randint(0, 1)
        y0 = (cell // (SIZE // CELL)) * CELL + rng.randint(0, 1)
        side = rng.randint(6, 7)
        box = (x0, y0, x0 + side - 1, y0 + side - 1)
        colour = rng.choice(COLOURS)
        kind = rng.randrange(3)
        if kind == 0:
            pen.rectangle(box, fill=colour)
        elif kind == 1:
            pen.ellipse(box, fill=colour)
        else:
            pen.polygon([(x0, y0 + side - 1), (x0 + side - 1, y0 + side - 1), (x0 + side // 2, y0)],
                        fill=colour)
    return image


class ShapesTask:
    name = "shapes"
    rewards = ["exact_answer"]
    vision = True                   # rows hold images: `model=tiny` builds a vision-language model
    prompt = "how many shapes?"

    def __init__(self, most: int = 4, train_size: int = 4000, eval_size: int = 400):
        self.most, self.train_size, self.eval_size = most, train_size, eval_size

    def _rows(self, n: int, seed: int) -> list[dict]:
        rng = random.Random(seed)
        rows = []
        for _ in range(n):
            count = rng.randint(1, self.most)
            rows.append({"prompt": self.prompt, "answer": str(count), "images": [draw(count, rng)]})
        return rows

    def train_rows(self, seed: int) -> list[dict]:
        return self._rows(self.train_size, seed)

    def eval_rows(self) -> list[dict]:
        return self._rows(self.eval_size, seed=-1)    # a seed no training run is given

    def demonstration(self, row: dict) -> str:
        return row["answer"]
