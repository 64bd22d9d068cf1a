"""Draws FastMLX's icons (icons/*.png): the app icon, three rising bars (a batch growing) on a dark
rounded square, and the menu-bar template icon, the same bars in black on transparent (macOS tints
template images itself). Pure Python, no imaging library:  python3 scripts/make_icons.py"""

import struct
import zlib
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "icons"


def png(path, size, pixel):
    rows = b"".join(b"\x00" + b"".join(bytes(pixel(x, y)) for x in range(size)) for y in range(size))
    chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0))
    data += chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b"")
    path.write_bytes(data)


def in_round_rect(x, y, x0, y0, x1, y1, r):
    if not (x0 <= x <= x1 and y0 <= y <= y1):
        return False
    cx = min(max(x, x0 + r), x1 - r)
    cy = min(max(y, y0 + r), y1 - r)
    return (x - cx) ** 2 + (y - cy) ** 2 <= r * r


# In units of a 512-pixel icon: (x0, y0, x1, y1) of each bar.
BARS = [(136, 256, 184, 400), (232, 176, 280, 400), (328, 112, 376, 400)]
COLOURS = [(96, 165, 250), (147, 197, 253), (219, 234, 254)]


def app_icon(size):
    k = 512 / size

    def pixel(x, y):
        X, Y = (x + 0.5) * k, (y + 0.5) * k
        for (x0, y0, x1, y1), colour in zip(BARS, COLOURS):
            if in_round_rect(X, Y, x0, y0, x1, y1, 16):
                return (*colour, 255)
        if in_round_rect(X, Y, 32, 32, 480, 480, 96):
            return (31, 41, 55, 255)
        return (0, 0, 0, 0)

    return pixel


def tray_icon(size):
    k = 512 / size

    def pixel(x, y):
        X, Y = (x + 0.5) * k, (y + 0.5) * k
        # Bars widened and stretched to fill the menu bar's square.
        for x0, y0, x1, y1 in [(64, 240, 160, 448), (208, 144, 304, 448), (352, 48, 448, 448)]:
            if in_round_rect(X, Y, x0, y0, x1, y1, 24):
                return (0, 0, 0, 255)
        return (0, 0, 0, 0)

    return pixel


if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    for name, size in [("icon.png", 512), ("32x32.png", 32), ("128x128.png", 128), ("128x128@2x.png", 256)]:
        png(OUT / name, size, app_icon(size))
    png(OUT / "tray.png", 64, tray_icon(64))
    print("wrote", sorted(p.name for p in OUT.glob("*.png")))
