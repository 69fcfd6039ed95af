"""Finding corrupt image files before `tf.data` decodes them.

TensorFlow's decoders fail inside the pipeline's map with a message that does not
name the file ("Invalid JPEG data or crop window"). So `from_image_folder` screens
every file up front, reading only a few bytes at each end (a truncated file lacks
its end marker) and, for a JPEG, the chain of header segments up to its image data
(a damaged header is fatal to the decoder, while damage inside the image data only
spoils pixels). Each suspect is confirmed by decoding it with TensorFlow: a file
TensorFlow decodes is never reported, whatever its trailer.
"""

from __future__ import annotations

import os

import tensorflow as tf

_HEAD = 32
_TAIL = 64
_JPEG_SEGMENTS = 512  # more header segments than any real JPEG holds


def find_corrupt(files: list[str]) -> dict[str, str]:
    """Returns `{file: reason}` for the files TensorFlow cannot decode as images."""
    corrupt = {}
    for file in files:
        if _suspect(file):
            reason = _decode_error(file)
            if reason is not None:
                corrupt[file] = reason
    return corrupt


def _suspect(file: str) -> bool:
    """Whether the file's first and last bytes (a JPEG's header too) look unlike an image."""
    try:
        size = os.path.getsize(file)
        with open(file, "rb") as handle:
            head = handle.read(_HEAD)
            handle.seek(max(0, size - _TAIL))
            tail = handle.read(_TAIL)
            if head.startswith(b"\xff\xd8"):  # JPEG: header segments, then EOI at the end
                return b"\xff\xd9" not in tail or not _jpeg_header_is_whole(handle, size)
    except OSError:
        return True
    if head.startswith(b"\x89PNG\r\n\x1a\n"):  # PNG: ends with the IEND chunk
        return b"IEND" not in tail
    if head.startswith((b"GIF87a", b"GIF89a")):  # GIF: ends with the ';' trailer
        return not tail.rstrip(b"\x00").endswith(b";")
    if head.startswith(b"BM") and len(head) >= 6:  # BMP: header holds the file size
        return int.from_bytes(head[2:6], "little") > size
    return True  # no known image header


def _jpeg_header_is_whole(handle, size: int) -> bool:
    """Whether the marker segments after SOI chain up to the start of scan (SOS)."""
    position = 2
    for _ in range(_JPEG_SEGMENTS):
        handle.seek(position)
        marker = handle.read(4)
        if len(marker) < 2 or marker[0] != 0xFF:
            return False
        kind = marker[1]
        if kind == 0xDA:  # start of scan: the image data follows
            return True
        if kind == 0xFF:  # fill byte before a marker
            position += 1
        elif kind == 0x01 or 0xD0 <= kind <= 0xD7:  # markers without a length
            position += 2
        elif kind == 0xD9 or len(marker) < 4:  # end of image before any scan
            return False
        else:
            length = int.from_bytes(marker[2:4], "big")
            if length < 2 or position + 2 + length > size:
                return False
            position += 2 + length
    return False


def _decode_error(file: str) -> str | None:
    """TensorFlow's reason for not decoding `file`, or None when it decodes."""
    try:
        tf.io.decode_image(tf.io.read_file(file), expand_animations=False)
    except tf.errors.OpError as error:
        message = getattr(error, "message", str(error))
        return message.split("[Op:")[0].split("}}")[-1].strip() or type(error).__name__
    return None
