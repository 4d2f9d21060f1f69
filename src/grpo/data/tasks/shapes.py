"""Shapes: a 32x32 picture of 1 to 4 coloured shapes on black; "how many shapes?" -> "3".

The vision demo's task (`grpo train task=shapes`): the answer is in the pixels only, so a model
that ignores the image scores about 1 in 4. Images are drawn by the package (no files, no
download) from one fixed seed; a hash-chosen tenth of the distinct pictures is held out and never
trained on, and a run's seed only reorders the training pictures.
"""

from __future__ import annotations

import random
import zlib

SIZE, CELL = 32, 8                  # a 4x4 grid of 8-pixel cells, one shape at most per cell
COLOURS = [(255, 64, 64), (64, 220, 64), (80, 120, 255), (255, 220, 40), (230, 80, 230), (60, 220, 220)]


def picture(count: int, rng: random.Random) -> tuple:
    """What a picture holds: per shape its cell, jitter, side, colour and kind, in cell order."""
    return tuple(sorted((cell, rng.randint(0, 1), rng.randint(0, 1), rng.randint(6, 7),
                         rng.randrange(len(COLOURS)), rng.randrange(3))
                        for cell in rng.sample(range((SIZE // CELL) ** 2), count)))


def render(shapes: tuple):
    """The 32x32 RGB image of a `picture`."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (SIZE, SIZE), (0, 0, 0))
    pen = ImageDraw.Draw(image)
    for cell, dx, dy, side, colour, kind in shapes:
        x0 = (cell % (SIZE // CELL)) * CELL + dx
        y0 = (cell // (SIZE // CELL)) * CELL + dy
        box, fill = (x0, y0, x0 + side - 1, y0 + side - 1), COLOURS[colour]
        if kind == 0:
            pen.rectangle(box, fill=fill)
        elif kind == 1:
            pen.ellipse(box, fill=fill)
        else:
            pen.polygon([(x0, y0 + side - 1), (x0 + side - 1, y0 + side - 1), (x0 + side // 2, y0)],
                        fill=fill)
    return image


def draw(count: int, rng: random.Random):
    """A picture of `count` shapes (squares, discs, triangles) in distinct cells, jittered."""
    return render(picture(count, rng))


class ShapesTask:
    name = "shapes"
    rewards = ["exact_answer"]
    vision = True                   # rows hold images: `model=tiny` builds a vision-language model
    prompt = "how many shapes?"

    def __init__(self, most: int = 4, train_size: int = 4000, eval_size: int = 400):
        self.most, self.train_size, self.eval_size = most, train_size, eval_size
        self._pool: tuple[list, list] | None = None

    @staticmethod
    def is_held_out(shapes: tuple) -> bool:
        return zlib.crc32(repr(shapes).encode()) % 10 == 0

    def _pictures(self) -> tuple[list, list]:
        """Distinct pictures from one fixed seed: a hash-chosen tenth held out, never trained on."""
        if self._pool is None:
            rng, seen, train, held = random.Random(20261202), set(), [], []
            while len(train) < self.train_size or len(held) < self.eval_size:
                shapes = picture(rng.randint(1, self.most), rng)
                if shapes in seen:
                    continue
                seen.add(shapes)
                split = held if self.is_held_out(shapes) else train
                if len(split) < (self.eval_size if split is held else self.train_size):
                    split.append(shapes)
            self._pool = (train, held)
        return self._pool

    @staticmethod
    def _row(shapes: tuple) -> dict:
        return {"prompt": ShapesTask.prompt, "answer": str(len(shapes)), "images": [render(shapes)],
                "picture": repr(shapes)}

    def train_rows(self, seed: int) -> list[dict]:
        train = list(self._pictures()[0])
        random.Random(seed).shuffle(train)
        return [self._row(s) for s in train]

    def eval_rows(self) -> list[dict]:
        return [self._row(s) for s in self._pictures()[1]]

    def demonstration(self, row: dict) -> str:
        return row["answer"]
