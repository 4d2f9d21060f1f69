"""A dataset row's images: file paths (relative to the dataset), `datasets`' Image feature
({"bytes", "path"} or decoded), raw bytes or PIL images, one or a list per row.

Every image is opened once when the data loads, so a missing or unreadable file stops the run
before any training with the row and the file named; pixels are decoded again when a prompt is
drawn, so a large dataset's images are never all held in memory.
"""

from __future__ import annotations

import io
from pathlib import Path

IMAGE_COLUMNS = ("images", "image")


class ImageError(ValueError):
    """An image that cannot be read, named by its row and file."""


def image_column(wanted: str, names: list[str]) -> str | None:
    """The column that holds a row's images: `wanted` when set, else `images` or `image`."""
    if wanted:
        return wanted if wanted in names else None
    return next((n for n in IMAGE_COLUMNS if n in names), None)


def row_images(value, base: Path | None, where: str) -> list:
    """A row's image sources, each checked to open: a path becomes absolute (relative paths are
    taken from the dataset's folder), bytes and PIL images are kept as they are."""
    items = value if isinstance(value, (list, tuple)) else [value]
    sources = []
    for n, item in enumerate(items):
        at = f"{where}, image {n + 1}" if len(items) > 1 else where
        source = _source(item, base, at)
        load_image(source, at)                      # fail now, not in the middle of a run
        sources.append(source)
    return sources


def _source(item, base: Path | None, where: str):
    if item is None:
        raise ImageError(f"{where}: the image is missing (null)")
    if isinstance(item, dict):                      # datasets' Image feature, not decoded
        if item.get("bytes"):
            return bytes(item["bytes"])
        if item.get("path"):
            item = item["path"]
        else:
            raise ImageError(f"{where}: an image record with neither bytes nor a path: {sorted(item)}")
    if isinstance(item, (bytes, bytearray)):
        return bytes(item)
    if isinstance(item, str):
        if item.startswith(("http://", "https://")):
            raise ImageError(f"{where}: {item} is a web address; images are read from files, bytes "
                             "or PIL images (download them first)")
        path = Path(item).expanduser()
        if not path.is_absolute() and base is not None:
            path = base / path
        return str(path)
    if hasattr(item, "convert") and hasattr(item, "size"):      # a PIL image
        return item
    raise ImageError(f"{where}: an image must be a file path, bytes, a PIL image or datasets' Image "
                     f"feature, not {type(item).__name__}")


def load_image(source, where: str = "image"):
    """The RGB PIL image of one source; ImageError naming `where` and the file if it cannot be read."""
    from PIL import Image, UnidentifiedImageError

    if hasattr(source, "convert") and not isinstance(source, (str, bytes)):
        return source.convert("RGB")
    name = "the image bytes" if isinstance(source, bytes) else source
    try:
        opened = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)
        opened.load()
        return opened.convert("RGB")
    except FileNotFoundError:
        raise ImageError(f"{where}: image file not found: {name}") from None
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise ImageError(f"{where}: cannot read {name} as an image ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})") from None


def thumbnail(source, side: int = 48) -> str:
    """A small PNG of an image as a data URI (the report's completion browser shows it)."""
    import base64

    image = load_image(source).copy()
    image.thumbnail((side, side))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
