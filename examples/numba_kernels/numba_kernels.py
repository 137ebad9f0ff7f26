# SPDX-License-Identifier: Apache-2.0
"""A small library of Numba (numba-cuda) kernels that takes its arrays from
any framework through dlsync's CUDA Array Interface export.

Each function takes its inputs and output as anything dlsync.wrap takes
(PyTorch tensors, CuPy arrays, Numba device arrays, any object with
``__cuda_array_interface__``) and the caller's stream (``stream=``: a
``torch.cuda.Stream``, a CuPy stream, a Numba stream or a handle). The work
is ordered after the work that produced the arrays and before the caller's
later work on ``stream``, eagerly and inside a capture (``torch.cuda.graph``
in any mode), with no host synchronisation:

- ``Kernels()`` launches on the caller's stream
  (``numba.cuda.external_stream``);
- ``Kernels(own_stream=True)`` launches on a stream of its own: one
  ``dlsync.exchange(caller, own)`` orders it after the caller and, under
  capture, joins it into the caller's capture and back.

Every array is imported as ``numba.cuda.as_cuda_array(dlsync.wrap(x,
consumer=s))`` inside a ``dlsync.scope()``: reading that object's
``__cuda_array_interface__`` orders ``s`` after the array's producer and
exports ``stream: None``, so Numba does not synchronise the host on the
producer's stream (its default, ``NUMBA_CUDA_ARRAY_INTERFACE_SYNC=1``, which
breaks a capture).

numba-cuda is optional and never a dependency of dlsync. numba-cuda 0.30.4
fails to compile any kernel under numpy 2.5 (``module 'numpy' has no
attribute 'row_stack'``, raised while it registers its overloads); this
module restores the alias (``numpy.row_stack = numpy.vstack``) before it
imports ``numba.cuda`` when numpy lacks it.
"""

import numpy

if not hasattr(numpy, "row_stack"):  # numba-cuda 0.30.4 under numpy >= 2.5
    numpy.row_stack = numpy.vstack

from numba import cuda  # noqa: E402
from numba.cuda.cudadrv.driver import Stream as _NumbaStream  # noqa: E402

import dlsync  # noqa: E402

THREADS = 256


@cuda.jit
def _affine(x, out, a, b):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + b


@cuda.jit
def _add(x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + y[i]


def stream_handle(stream) -> int:
    """The CUstream handle of a Numba stream (``int(stream)``, unless it has
    ``__cuda_stream__``), or of anything dlsync.stream_handle takes."""
    if isinstance(stream, _NumbaStream) and not hasattr(stream, "__cuda_stream__"):
        return int(stream)
    return dlsync.stream_handle(stream)


class Kernels:
    """The library's kernels, launched on the caller's stream or, with
    ``own_stream=True``, on a Numba stream of the library's own."""

    def __init__(self, own_stream: bool = False):
        self.own = cuda.stream() if own_stream else None
        self.own_handle = stream_handle(self.own) if own_stream else None

    def affine(self, x, out, a: float, b: float, stream) -> None:
        """``out = a * x + b``."""
        self._run(_affine, (x,), out, (a, b), stream)

    def add(self, x, y, out, stream) -> None:
        """``out = x + y``."""
        self._run(_add, (x, y), out, (), stream)

    def _run(self, kernel, inputs, out, scalars, stream) -> None:
        caller = stream_handle(stream)
        if self.own is None:
            numba_stream = cuda.external_stream(caller) if caller else cuda.default_stream()
            with dlsync.scope():
                self._launch(kernel, inputs, out, scalars, caller, numba_stream)
            return
        with dlsync.exchange(caller, self.own_handle), dlsync.scope():
            self._launch(kernel, inputs, out, scalars, self.own_handle, self.own)

    @staticmethod
    def _launch(kernel, inputs, out, scalars, consumer: int, numba_stream) -> None:
        args = [cuda.as_cuda_array(dlsync.wrap(x, consumer=consumer)) for x in inputs]
        o = cuda.as_cuda_array(dlsync.wrap(out, consumer=consumer, writable=True))
        if o.size == 0:
            return
        blocks = (o.size + THREADS - 1) // THREADS
        kernel[blocks, THREADS, numba_stream](*args, o, *scalars)
