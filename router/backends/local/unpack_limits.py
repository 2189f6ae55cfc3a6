"""How large an image may unpack: caps per layer and per image, and what one image has unpacked so far.

A layer bomb is a few bytes of gzip (or one sparse tar member) that unpack to gigabytes; the diff-id
check cannot stop it, since the attacker writes the image config too. Every regular file's size is
charged before it is written, and past a cap the import or pull is refused naming the layer and the
option that raises the cap.
"""

from __future__ import annotations

from dataclasses import dataclass

from grove.core.errors import Invalid

GIB = 1 << 30


@dataclass(frozen=True)
class UnpackLimits:
    """How many bytes an image may unpack to: a layer bomb (a few bytes of gzip, or one sparse tar member, that
    unpack to gigabytes) is refused at the cap instead of filling the state disk. Counted in regular files'
    sizes as the archive gives them (a sparse file's holes count, though they are written as holes)."""

    layer_bytes: int = 16 * GIB
    """Most bytes one layer (or a flat import) may unpack to (``--max-layer-gb``)."""
    image_bytes: int = 64 * GIB
    """Most bytes all of one image's layers may unpack to, shared layers included (``--max-image-gb``)."""


class Budget:
    """What one image has unpacked so far, against its :class:`UnpackLimits`."""

    def __init__(self, limits: UnpackLimits, image: str) -> None:
        """Count for the image ``image`` (named in the errors)."""
        self.limits = limits
        self._image = image
        self._layer = "its content"
        self.layer_bytes = 0
        self.image_bytes = 0

    def start_layer(self, name: str) -> None:
        """Count the next layer (``name``: how the errors call it) from zero."""
        self._layer, self.layer_bytes = name, 0

    def charge(self, size: int) -> None:
        """Count ``size`` more bytes; Invalid once past a cap, before they are written."""
        self.layer_bytes += size
        self.image_bytes += size
        if self.layer_bytes > self.limits.layer_bytes:
            raise Invalid(f"{self._image}: {self._layer} unpacks to more than {_gib(self.limits.layer_bytes)} "
                          "(the cap per layer); if the image is meant to be that large, raise it with --max-layer-gb")
        if self.image_bytes > self.limits.image_bytes:
            raise Invalid(f"{self._image} unpacks to more than {_gib(self.limits.image_bytes)} (the cap per image); "
                          "if it is meant to be that large, raise it with --max-image-gb")


def _gib(size: int) -> str:
    return f"{size / GIB:g} GiB"
