"""hvd_compress.tensorflow ops on real ranks, eager and inside tf.function; the test compares with the reference.
Also bad input (every rank must raise, never hang), DistributedGradientTape, and hck.DistributedOptimizer's
compression= (fp16/bf16 on the fused gradient reduction)."""

import functools

import keras
import numpy as np
import tensorflow as tf
from tf_common import outcome, save

import hvd_compress.keras as hck
import hvd_compress.tensorflow as hc

hc.init()
r, n = hc.rank(), hc.size()


def rank_input(rank: int, numel: int, seed: int, dtype: str = "float32") -> np.ndarray:
    return np.random.default_rng(seed * 1000 + rank).standard_normal(numel).astype(dtype)


out: dict = {}
for dtype in ("float16", "float32", "float64"):
    x = tf.constant(rank_input(r, 37, 1, dtype))
    out[f"Average/{dtype}/eager"] = hc.allreduce(x).numpy()
    out[f"Sum/{dtype}/graph"] = tf.function(lambda t: hc.allreduce(t, op=hc.Sum))(x).numpy()
a, b = tf.constant(rank_input(r, 20, 2)), tf.constant(rank_input(r, 9, 3))
out["Adasum/eager"] = hc.allreduce(a, op=hc.Adasum).numpy()
grouped = tf.function(lambda u, v: hc.grouped_allreduce([u, v], op=hc.Adasum))
out["Adasum/grouped/graph"] = [t.numpy() for t in grouped(a, b)]
out["grouped/mixed"] = [t.numpy() for t in hc.grouped_allreduce([a, tf.cast(b, tf.float64)], op=hc.Sum)]
# Many collectives in one tf.function: stateful calls keep program order on every rank.
many = tf.function(lambda u: [hc.allreduce(u * float(i + 1), op=hc.Sum, name=f"many.{i}") for i in range(6)])
out["many"] = [t.numpy() for t in many(a)]
# Broadcast: any dtype, variables (tf and Keras-like) in place.
v32, v64 = tf.Variable(rank_input(r, 5, 4)), tf.Variable(np.arange(3, dtype=np.int64) * (r + 1))
hc.broadcast_variables([v32, v64], root_rank=n - 1)
out["broadcast_variables"] = (v32.numpy(), v64.numpy())
out["broadcast"] = hc.broadcast(tf.constant([r, r + 1], dtype=tf.int32), root_rank=1).numpy()
# 1-bit compressed allreduce: three calls, eager then graph, with the error feedback carried in the state.
state = hc.OneBitState(50)
seq = [hc.compressed_allreduce(tf.constant(rank_input(r, 50, 10)), state).numpy()]
fn = tf.function(lambda t: hc.compressed_allreduce(t, state))
seq += [fn(tf.constant(rank_input(r, 50, 10 + k))).numpy() for k in (1, 2)]
out["compressed"] = seq
out["compressed_state"] = (state.worker_error.copy(), state.server_error.copy())
# DistributedGradientTape: a None gradient stays None; an embedding's IndexedSlices is densified.
emb = tf.Variable(np.arange(12, dtype=np.float32).reshape(6, 2))
w, unused = tf.Variable([1.0, 2.0]), tf.Variable([3.0])
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.gather(emb, [r % 6, 2]) * (r + 1)) + tf.reduce_sum(w * w) * (r + 1)
grads = hc.DistributedGradientTape(tape).gradient(loss, [emb, w, unused])
out["tape"] = [None if g is None else tf.convert_to_tensor(g).numpy() for g in grads]
# Min/Max/Product and integer tensors, eager and in a tf.function.
out["Min/float32"] = hc.allreduce(tf.constant(rank_input(r, 11, 5)), op=hc.Min).numpy()
xi = tf.constant((np.arange(6) * (r + 1) - 3 * r).astype(np.int32))
out["Max/int32/graph"] = tf.function(lambda t: hc.allreduce(t, op=hc.Max))(xi).numpy()
out["Product/int64"] = hc.allreduce(tf.constant(np.arange(1, 4, dtype=np.int64) + r), op=hc.Product).numpy()
# allgather: r + 1 rows on rank r, eager and in a tf.function, and its gradient (Horovod's: averaged, cut).
rows = np.full((r + 1, 2), r, np.float32) + np.arange(2, dtype=np.float32)
out["allgather"] = hc.allgather(tf.constant(rows)).numpy()
out["allgather/graph"] = tf.function(lambda t: hc.allgather(t, name="gather.graph"))(tf.constant(rows)).numpy()
var = tf.Variable(rows)
with tf.GradientTape() as tape:
    gathered = hc.allgather(var, name="gather.grad")
    weights = tf.reshape(tf.range(tf.size(gathered), dtype=tf.float32), tf.shape(gathered))
    loss = tf.reduce_sum(gathered * weights) * float(r + 1)
out["allgather/grad"] = tape.gradient(loss, var).numpy()
with tf.GradientTape() as tape:
    tape.watch(a)
    m = hc.allreduce(a, op=hc.Max, name="max.grad")
out["max_grad"] = outcome(lambda: tape.gradient(m, a))
# compression=: fp16 on the wire; top-k with its error feedback over two calls (eager, then in a tf.function).
out["fp16"] = hc.allreduce(tf.constant(rank_input(r, 40, 6)), compression=hc.Compression.fp16).numpy()
topk_state = hc.CompressionState(40, hc.Compression.topk(0.25))
topk_fn = tf.function(lambda t: hc.allreduce(t, compression=hc.Compression.topk(0.25), state=topk_state))
out["topk"] = [hc.allreduce(tf.constant(rank_input(r, 40, 20)), compression=hc.Compression.topk(0.25),
                            state=topk_state).numpy(), topk_fn(tf.constant(rank_input(r, 40, 21))).numpy()]
out["topk_error"] = topk_state.error.copy()
# hck.DistributedOptimizer(compression=): SGD(1) from zeros leaves -(the reduced gradient) in the variables; two
# variables fused into one buffer; the second kind's step runs inside a tf.function; config round trip.
for kind, op in (("fp16", "Average"), ("bf16", "Sum")):
    opt = hck.DistributedOptimizer(keras.optimizers.SGD(1.0), op=getattr(hck, op),
                                   compression=getattr(hck.Compression, kind))
    opt = hck.DistributedOptimizer.from_config(opt.get_config())
    variables = [keras.Variable(np.zeros((4, 5), "float32")), keras.Variable(np.zeros(7, "float32"))]
    grads = [tf.constant(rank_input(r, 27, 30)[:20].reshape(4, 5)), tf.constant(rank_input(r, 27, 30)[20:])]
    opt.build(variables)
    if kind == "bf16":
        tf.function(functools.partial(opt.apply, grads, variables))()  # bound, not inputs: variables stay
    else:
        opt.apply(grads, variables)
    out[f"keras/{kind}"] = -np.concatenate([v.numpy().reshape(-1) for v in variables])
    out[f"keras/{kind}/config"] = opt.get_config()["compression"]
# Horovod's keywords: gradient_predivide_factor, sparse_as_dense and the global process_set on the Keras wrapper
# (kept through get_config); on the tape also compression= and Horovod's fusion/placement arguments at defaults.
opt = hck.DistributedOptimizer(keras.optimizers.SGD(1.0), gradient_predivide_factor=2.0, sparse_as_dense=True,
                               process_set=hck.global_process_set)
opt = hck.DistributedOptimizer.from_config(opt.get_config())
variables = [keras.Variable(np.zeros((4, 5), "float32")), keras.Variable(np.zeros(7, "float32"))]
opt.apply([tf.constant(rank_input(r, 27, 30)[:20].reshape(4, 5)), tf.constant(rank_input(r, 27, 30)[20:])],
          variables)
out["keras/predivide"] = -np.concatenate([v.numpy().reshape(-1) for v in variables])
# average_aggregated_gradients=True (Horovod's): the two passes' gradients averaged, not summed; SGD(1) from zeros.
opt = hck.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2,
                               average_aggregated_gradients=True, device_dense="", num_groups=0)
variables = [keras.Variable(np.zeros(27, "float32"))]
for k in (60, 61):
    opt.apply([tf.constant(rank_input(r, 27, k))], variables)
out["keras/average_passes"] = -variables[0].numpy()
out["keras/groups"] = outcome(lambda: hck.DistributedOptimizer(keras.optimizers.SGD(1.0), groups=[[0]]))
out["keras/predivide_topk"] = outcome(lambda: hck.DistributedOptimizer(
    keras.optimizers.SGD(1.0), gradient_predivide_factor=2.0, compression=hc.Compression.topk(0.5)))
out["keras/predivide_sum"] = outcome(lambda: hck.DistributedOptimizer(keras.optimizers.SGD(1.0), op=hck.Sum,
                                                                      gradient_predivide_factor=2.0))
tape_var = tf.Variable(rank_input(r, 27, 50))
with tf.GradientTape(persistent=True) as tape:
    tape_loss = tf.reduce_sum(tape_var * tf.constant(rank_input(r, 27, 51)))  # the gradient: rank_input(r, 27, 51)
out["tape/fp16"] = hc.DistributedGradientTape(tape, compression=hc.Compression.fp16, device_dense="", num_groups=0,
                                              process_set=hc.global_process_set).gradient(tape_loss, tape_var).numpy()
out["tape/predivide"] = hc.DistributedGradientTape(tape, gradient_predivide_factor=4.0,
                                                   sparse_as_dense=True).gradient(tape_loss, [tape_var])[0].numpy()
out["tape/groups"] = outcome(lambda: hc.DistributedGradientTape(tape, groups=2))
out["tape/unknown"] = outcome(lambda: hc.DistributedGradientTape(tape, average=True))
out["tape/topk"] = outcome(lambda: hc.DistributedGradientTape(tape, compression=hc.Compression.topk(0.5)))
out["process_set/global"] = hc.allreduce(tf.ones(3), op=hc.Sum, process_set=hc.global_process_set).numpy()
out["process_set/unregistered"] = outcome(lambda: hc.broadcast(tf.ones(3), process_set=hc.ProcessSet([0])))
# A process set of the first and the last rank (every rank adds it): its collectives on its members, eager and in a
# tf.function; the others raise; the optimizer wrappers take the global set only.
ends = hc.add_process_set([0, n - 1])
if ends.included():
    ps_in = tf.constant(rank_input(r, 5, 70))
    out["process_set/sum"] = hc.allreduce(ps_in, op=hc.Sum, process_set=ends).numpy()
    out["process_set/avg/graph"] = tf.function(lambda t: hc.allreduce(t, process_set=ends))(ps_in).numpy()
    out["process_set/bcast"] = hc.broadcast(ps_in, root_rank=n - 1, process_set=ends).numpy()
    out["process_set/gather"] = hc.allgather(tf.fill([r + 1], float(r)), process_set=ends).numpy()
else:
    out["process_set/outside"] = outcome(lambda: hc.allreduce(tf.ones(3), process_set=ends))
out["process_set/tape"] = outcome(lambda: hc.DistributedGradientTape(tape, process_set=ends))
out["keras/adasum_fp16"] = outcome(lambda: hck.DistributedOptimizer(keras.optimizers.SGD(1.0), op=hck.Adasum,
                                                                    compression=hc.Compression.fp16))
# Bad input: every rank raises, none hangs.
out["bad_shape"] = outcome(lambda: hc.allreduce(tf.zeros((2, 3) if r == 0 else (3, 2))))
out["bad_numel"] = outcome(lambda: hc.allreduce(tf.zeros(4 + r)))
out["bad_dtype"] = outcome(lambda: hc.allreduce(tf.zeros(4, tf.bfloat16)))
out["bad_op"] = outcome(lambda: hc.allreduce(tf.zeros(4), op=hc.OneBitAdam))
out["xla"] = outcome(lambda: tf.function(hc.allreduce, jit_compile=True)(tf.zeros(3)))
out["after_errors"] = hc.allreduce(tf.ones(3), op=hc.Sum).numpy()  # the world still works
# The masked (SLAMB) reduction, eager and inside tf.function with the step a tensor (not frozen at trace time).
masked_in = tf.constant(rank_input(r, 4, 20).reshape(2, 2).repeat(50, axis=0))
out["masked/eager"] = hc.masked_allreduce(masked_in, 0.25, 7, 3).numpy()
masked_fn = tf.function(lambda t, s: hc.masked_allreduce(t, 0.25, 7, s))
out["masked/graph"] = [masked_fn(masked_in, tf.constant(s, tf.int64)).numpy() for s in (1, 2)]
out["random_mask"] = tf.function(lambda s: hc.random_mask(200, 0.25, 7, s))(tf.constant(2, tf.int64)).numpy()
save(r, out)
