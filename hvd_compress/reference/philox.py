"""NumPy Philox4x32-10 (Salmon et al., SC 2011), keyed as the core keys it (cpp/include/hvdc/philox.h).

Written from the paper's definition, independently of the C++ core: the tests compare the two word for
word, and both against Random123's published known-answer vectors.
"""

from __future__ import annotations

import numpy as np

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_LOW = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)


def philox4x32_10(counter: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Philox4x32-10 of ``counter`` (shape (..., 4), uint32) under the 2-word ``key``; same shape, uint32."""
    c = [np.asarray(counter, dtype=np.uint64)[..., i] for i in range(4)]
    k0, k1 = int(key[0]) & 0xFFFFFFFF, int(key[1]) & 0xFFFFFFFF
    for _ in range(10):
        p0 = _M0 * c[0]
        p1 = _M1 * c[2]
        hi0, lo0 = p0 >> _SHIFT, p0 & _LOW
        hi1, lo1 = p1 >> _SHIFT, p1 & _LOW
        c = [hi1 ^ c[1] ^ np.uint64(k0), lo1, hi0 ^ c[3] ^ np.uint64(k1), lo0]
        k0 = (k0 + _W0) & 0xFFFFFFFF
        k1 = (k1 + _W1) & 0xFFFFFFFF
    return np.stack(c, axis=-1).astype(np.uint32)


def words(n: int, seed: int, step: int, stream: int = 0, offset: int = 0) -> np.ndarray:
    """Words [offset, offset + n) of the sequence of (seed, step, stream), uint32."""
    index = np.arange(offset, offset + n, dtype=np.uint64)
    block = index >> np.uint64(2)
    counter = np.stack(
        [
            block & _LOW,
            block >> _SHIFT,
            np.full(n, step & 0xFFFFFFFF, dtype=np.uint64),
            np.full(n, stream & 0xFFFFFFFF, dtype=np.uint64),
        ],
        axis=-1,
    )
    out = philox4x32_10(counter, (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF))
    return out[np.arange(n), (index & np.uint64(3)).astype(np.int64)]


def uniform(n: int, seed: int, step: int, stream: int = 0, offset: int = 0) -> np.ndarray:
    """Uniforms in [0, 1) of those words, float32: (word >> 8) * 2**-24."""
    return ((words(n, seed, step, stream, offset) >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)).astype(
        np.float32
    )
