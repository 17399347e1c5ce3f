"""The core's counter-based generator: Random123's known-answer vectors, the NumPy mirror word for word,
the documented keying, and no use of PyTorch's global generator."""

from __future__ import annotations

import numpy as np
import pytest

from hvd_compress import _core
from hvd_compress.ops import random
from hvd_compress.reference import philox as ref

# Random123's published known-answer vectors for Philox4x32-10 (its tests/kat_vectors): counter, key, output.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize(("counter", "key", "expected"), KAT)
def test_known_answers(counter, key, expected):
    assert tuple(_core.philox4x32_10(counter, key)) == expected
    assert tuple(int(w) for w in ref.philox4x32_10(np.array(counter, dtype=np.uint32), key)) == expected


@pytest.mark.parametrize("offset", [0, 1, 3, 4, 1 << 33])
@pytest.mark.parametrize("n", [0, 1, 5, 37, 1000])
def test_core_equals_reference(n, offset):
    seed, step, stream = 0x0123456789ABCDEF, 77, 5
    np.testing.assert_array_equal(random.words(n, seed, step, stream, offset), ref.words(n, seed, step, stream, offset))
    np.testing.assert_array_equal(
        random.uniform(n, seed, step, stream, offset), ref.uniform(n, seed, step, stream, offset)
    )


def test_layout_is_the_documented_one():
    # Element i of (seed, step, stream) is word i % 4 of the block with counter (i // 4, 0, step, stream).
    seed, step, stream = (7 << 32) | 9, 3, 2
    got = random.words(8, seed, step, stream)
    for i in range(8):
        block = _core.philox4x32_10((i // 4, 0, step, stream), (9, 7))
        assert got[i] == block[i % 4]


def test_a_run_is_a_slice_of_the_whole():
    whole = random.uniform(4096, 11, 2)
    np.testing.assert_array_equal(random.uniform(100, 11, 2, offset=1234), whole[1234:1334])


def test_uniforms_are_in_range_and_uniform():
    u = random.uniform(1 << 20, seed=5, step=1)
    assert u.dtype == np.float32 and u.min() >= 0.0 and u.max() < 1.0
    # Mean of 2**20 uniforms: standard error 0.000282; 5 sigma is a 1-in-3.5-million false alarm.
    assert abs(float(u.mean(dtype=np.float64)) - 0.5) < 5 * (1 / 12) ** 0.5 / 2**10
    # Keys that differ in one field give unrelated sequences.
    for other in (random.uniform(1024, 6, 1), random.uniform(1024, 5, 2), random.uniform(1024, 5, 1, stream=1)):
        assert np.mean(other == u[:1024]) < 0.01


def test_bad_arguments_raise():
    for kwargs in ({"n": -1}, {"seed": -1}, {"seed": 1 << 64}, {"stream": 1 << 32}, {"offset": -1}, {"step": -1}):
        args = {"n": 4, "seed": 0, "step": 0, **kwargs}
        with pytest.raises(ValueError):
            random.uniform(**args)


def test_global_torch_generator_untouched():
    import torch

    torch.manual_seed(123)
    expected = torch.rand(8)
    torch.manual_seed(123)
    random.uniform(1000, 1, 1)
    random.words(1000, 2, 2)
    np.testing.assert_array_equal(torch.rand(8).numpy(), expected.numpy())
