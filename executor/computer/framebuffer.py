"""The screen's pixels, read straight from Xvfb's framebuffer file.

Xvfb started with ``-fbdir DIR`` keeps its screen in ``DIR/Xvfb_screen0``, a memory-mapped XWD image: a header
(big-endian CARD32 fields), a colormap, then the pixels. Reading them is a copy out of a shared mapping: no
X connection, no libX11 in the executor (whose bundled glibc must not load the image's libraries), no
screenshot program started per call. A 1280x800 screen is 4 MB, copied in about a millisecond.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

from grove.core.errors import InternalError

_FIELDS = 25
_COLOR_BYTES = 12


@dataclass(frozen=True)
class Frame:
    """One copy of the screen: 32-bit pixels, blue-green-red-pad in memory (Xvfb's depth-24 layout)."""

    width: int
    height: int
    pixels: bytes
    """``height`` rows of ``width * 4`` bytes (any row padding removed)."""


class Framebuffer:
    """The mapped screen file of a running Xvfb."""

    def __init__(self, path: str) -> None:
        """Map ``path``; ``ValueError`` while Xvfb has not written it yet (empty, or a zero header)."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._map = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        header = self._map[: _FIELDS * 4]
        fields = struct.unpack(">25I", header)
        if fields[0] > 1 << 16:  # written in the host's order after all
            fields = struct.unpack("<25I", header)
        header_size, depth, width, height = fields[0], fields[3], fields[4], fields[5]
        bits, line, ncolors = fields[11], fields[12], fields[19]
        if header_size == 0 or width == 0 or height == 0:
            self._map.close()
            raise ValueError("the framebuffer's header is not written yet")
        if depth != 24 or bits != 32:
            raise InternalError(f"the display's framebuffer is {depth}-bit at {bits} bits per pixel; grove "
                                "starts Xvfb at depth 24, which it reads as 32-bit pixels")
        self.width, self.height, self._line = width, height, line
        self._offset = header_size + ncolors * _COLOR_BYTES
        if self._offset + line * height > len(self._map):
            self._map.close()
            raise ValueError("the display's framebuffer file is shorter than its header says (still being made)")

    def read(self) -> Frame:
        """The screen now."""
        start, row = self._offset, self.width * 4
        if self._line == row:
            return Frame(self.width, self.height, self._map[start: start + row * self.height])
        rows = (self._map[start + y * self._line: start + y * self._line + row] for y in range(self.height))
        return Frame(self.width, self.height, b"".join(rows))

    def close(self) -> None:
        """Unmap the file."""
        self._map.close()
