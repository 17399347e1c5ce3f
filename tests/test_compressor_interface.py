"""Horovod's ``Compressor`` interface on hc's compressors, as user code calls it (``hvd.Compression.fp16.compress``
then ``decompress``): fp16/bf16 round floating tensors through 16 bits and restore the dtype, leave integer tensors
alone, ``none`` is the identity, and top-k/random-k (stateful) refuse with a TypeError that says what to do. Torch and
TensorFlow tensors alike, in one process (no collective involved)."""

from __future__ import annotations

import pytest
import torch

import hvd_compress.torch as hc


@pytest.mark.parametrize(("name", "dtype"), [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_torch_fp16_bf16_compress_round_trip(name: str, dtype: torch.dtype) -> None:
    comp = getattr(hc.Compression, name)
    t = torch.randn(17, dtype=torch.float64)
    sent, ctx = comp.compress(t)
    assert sent.dtype == dtype and ctx == torch.float64
    back = comp.decompress(sent, ctx)
    assert back.dtype == torch.float64 and torch.equal(back, t.to(dtype).double())
    ints = torch.arange(4)
    assert comp.compress(ints) == (ints, None) and comp.decompress(ints, None) is ints


def test_none_is_the_identity_and_stateful_compressors_refuse() -> None:
    t = torch.randn(3)
    assert hc.Compression.none.compress(t) == (t, None) and hc.Compression.none.decompress(t, None) is t
    for comp in (hc.Compression.topk(0.1), hc.Compression.randomk(0.1, seed=1)):
        with pytest.raises(TypeError, match="compression="):
            comp.compress(t)
        with pytest.raises(TypeError, match="compression="):
            comp.decompress(t, None)


def test_tensorflow_fp16_compress_round_trip() -> None:
    tf = pytest.importorskip("tensorflow")
    import hvd_compress.tensorflow as hct

    t = tf.constant([1.0, 2.5, 1e-3], dtype=tf.float32)
    sent, ctx = hct.Compression.fp16.compress(t)
    assert sent.dtype == tf.float16 and ctx == tf.float32
    back = hct.Compression.fp16.decompress(sent, ctx)
    assert back.dtype == tf.float32 and back.numpy().tolist() == tf.cast(sent, tf.float32).numpy().tolist()
