"""IDX files, the MNIST family's format, plain or gzip-compressed. No pickle anywhere.

An IDX file is a 4-byte magic number `00 00 <dtype code> <ndim>`, then `ndim` big-endian
uint32 dimension sizes, then the values, big-endian, in C order. Compression is detected from
the gzip header, not from the file name.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

import numpy as np

from peg.utils.io import atomic_open

#: IDX dtype code -> big-endian NumPy dtype.
DTYPES: dict[int, str] = {
    0x08: ">u1",
    0x09: ">i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}
_GZIP_MAGIC = b"\x1f\x8b"


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file (plain or gzip) into an array of the shape its header declares.

    Args:
        path: the file.

    Returns:
        A writable array in native byte order, shape `(d1, ..., d_ndim)` from the header (for
        MNIST images `[N, 28, 28]` uint8, for labels `[N]` uint8).

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: naming `path`, for a damaged gzip stream, a bad magic number, an unknown
            dtype code, or a size that does not match the header (a truncated file).
    """
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise ValueError(f"{path}: damaged or truncated gzip stream ({e})") from e
    if len(raw) < 4:
        raise ValueError(f"{path}: not an IDX file ({len(raw)} bytes, shorter than the header)")
    if raw[0] != 0 or raw[1] != 0:
        raise ValueError(
            f"{path}: not an IDX file (magic number {raw[:4].hex()}, expected 0000<dtype><ndim>)"
        )
    code, ndim = raw[2], raw[3]
    if code not in DTYPES:
        known = ", ".join(f"0x{c:02X}" for c in DTYPES)
        raise ValueError(f"{path}: unknown IDX dtype code 0x{code:02X} (known: {known})")
    if ndim == 0:
        raise ValueError(f"{path}: IDX header declares 0 dimensions")
    dtype = np.dtype(DTYPES[code])
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(
            f"{path}: truncated IDX header ({len(raw)} bytes, {ndim} dimensions need {header})"
        )
    shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        what = "truncated" if len(raw) < expected else "has trailing bytes"
        raise ValueError(
            f"{path}: IDX file {what}: header declares shape {shape} of {dtype.name} "
            f"({expected} bytes in all), the data is {len(raw)} bytes"
        )
    values = np.frombuffer(raw, dtype, offset=header).reshape(shape)
    return values.astype(dtype.newbyteorder("="), copy=True)


def write_idx(
    path: str | os.PathLike[str], array: np.ndarray, compress: bool | None = None
) -> Path:
    """Write `array` as an IDX file, atomically (temporary file, then rename).

    Args:
        path: destination; parent folders are created.
        array: any shape with at least one dimension, dtype uint8, int8, int16, int32,
            float32 or float64.
        compress: gzip the file; None (default) compresses when the name ends in ".gz".

    Returns:
        The path written.
    """
    array = np.asarray(array)
    codes = {np.dtype(v).newbyteorder("="): k for k, v in DTYPES.items()}
    native = array.dtype.newbyteorder("=")
    if native not in codes:
        raise ValueError(
            f"array: expected dtype uint8, int8, int16, int32, float32 or float64, "
            f"got {array.dtype}"
        )
    if array.ndim == 0 or array.ndim > 255:
        raise ValueError(f"array: expected 1 to 255 dimensions, got {array.ndim}")
    path = Path(path)
    if compress is None:
        compress = path.name.endswith(".gz")
    payload = (
        bytes([0, 0, codes[native], array.ndim])
        + np.asarray(array.shape, dtype=">u4").tobytes()
        + np.ascontiguousarray(array, dtype=DTYPES[codes[native]]).tobytes()
    )
    if compress:
        payload = gzip.compress(payload, mtime=0)
    with atomic_open(path) as f:
        f.write(payload)
    return path
