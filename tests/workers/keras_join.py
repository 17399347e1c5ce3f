"""``horovod.tensorflow.join()`` once hvd_compress.keras's runtime runs: on every rank it joins; rank n-1 in it
while the others reduce through hck makes every rank raise MismatchError naming it, and a later collective works."""

import horovod.tensorflow as hvd
import tensorflow as tf
from tf_common import outcome, save

import hvd_compress.keras as hck

hvd.init()
r, n = hvd.rank(), hvd.size()
hck.allreduce(tf.ones(3))  # hvd_compress's runtime runs
out = {"even": outcome(hvd.join)}
out["uneven"] = outcome(lambda: hvd.join() if r == n - 1 else hck.allreduce(tf.ones(3), name="grad"))
out["after"] = float(hck.allreduce(tf.ones(3), op=hck.Sum)[0])
save(r, out)
