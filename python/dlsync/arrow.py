# SPDX-License-Identifier: Apache-2.0
"""dlsync.arrow: the Arrow C Device data interface from Python
(``__arrow_c_device_array__``), ordered by dlsync in any capture state.

    with dlsync.arrow.import_device_array(producer_obj, consumer=stream) as arr:
        launch_reader(arr.buffers[1], arr.length, stream)
    # the producer's release runs after the reader's work on `stream`

    out = dlsync.arrow.export_device_array(buf, n, "f", producer=stream)
    consumer_library.from_arrow_device(out)   # sync_event marks `stream`'s work

See dlsync._arrow (the implementation) and docs/python.md."""

from ._arrow import (
    DEVICE_CUDA,
    DEVICE_CUDA_HOST,
    DEVICE_CUDA_MANAGED,
    FORMATS,
    PROVENANCES,
    DeviceArray,
    DeviceArrayExport,
    export_device_array,
    import_device_array,
)

__all__ = [
    "DeviceArray",
    "DeviceArrayExport",
    "import_device_array",
    "export_device_array",
    "DEVICE_CUDA",
    "DEVICE_CUDA_HOST",
    "DEVICE_CUDA_MANAGED",
    "FORMATS",
    "PROVENANCES",
]
