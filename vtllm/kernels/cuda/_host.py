"""Host-side helpers of the CUDA launchers.

Checks: device arrays only (a host array would be copied to the device and back on every
launch), dtype, rank, shape, C-contiguity. They read only metadata, never device memory, so
they never synchronize and work inside graph capture.

allow_dynamic_shared: a kernel may use up to 227 KB of shared memory a block on sm_90, but the
driver refuses a launch asking for more than 48 KB of dynamic shared memory unless the
function's MAX_DYNAMIC_SHARED_SIZE_BYTES attribute was raised first, and numba's launcher does
not do it. allow_dynamic_shared compiles the kernel for the launch's argument types (numba
would on the launch anyway) and raises the attribute once per compiled function, before its
first launch. The simulator has no such limit.
"""

import numpy as np
from numba import cuda

from vtllm.kernels import QType, block_layout
from vtllm.kernels.cuda._device import SIMULATOR

_WEIGHT_DTYPES = {QType.F32: np.float32, QType.F16: np.float16, QType.BF16: np.uint16}
# what the kernels read: float weights as integer bits, quantized ones as bytes
_KERNEL_VIEW = {QType.F32: np.uint32, QType.F16: np.uint16, QType.BF16: np.uint16}

_empty_cache: dict = {}
_raised: set = set()  # allow_dynamic_shared's (kernel, layout, context, bytes) done


def is_device_array(a) -> bool:
    return not isinstance(a, np.ndarray) and hasattr(a, "is_c_contiguous") and hasattr(a, "dtype")


def check(op: str, name: str, a, dtype, ndim: int, shape=None) -> None:
    """ValueError unless a is a C-contiguous device array of dtype, rank ndim (and shape)."""
    if not is_device_array(a):
        raise ValueError(f"{op}: {name} must be a numba.cuda device array, got {type(a).__name__}")
    if a.dtype != dtype or len(a.shape) != ndim:
        raise ValueError(
            f"{op}: {name} must be a {ndim}-D {np.dtype(dtype)} device array, got "
            f"{a.dtype} {tuple(a.shape)}"
        )
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}, got {tuple(a.shape)}")
    if not a.is_c_contiguous():
        raise ValueError(f"{op}: {name} must be C-contiguous")


def weight_view(op: str, w, qtype, k: int):
    """Checks W = (w, qtype) against K; returns (the view the kernels read, int qtype):
    F32 as uint32 bits, F16 / BF16 as uint16 bits, block-quantized rows (Q4_0 / Q4_1 / Q8_0,
    Q5_0 / Q5_1, Q2_K .. Q6_K) as uint16 words (every such block size is even)."""
    try:
        qtype = QType(qtype)
    except ValueError:
        raise ValueError(f"{op}: unsupported qtype {qtype!r}") from None
    layout = block_layout(qtype) if qtype != QType.Q8_K else None  # Q8_K: activations only
    if layout is not None:
        per, nbytes = layout
        if k % per:
            raise ValueError(f"{op}: {qtype.name} needs K % {per} == 0, got K={k}")
        check(op, "weight", w, np.uint8, 2)
        if w.shape[1] != k // per * nbytes:
            raise ValueError(f"{op}: {qtype.name} weight shape {w.shape} does not match K={k}")
        return w.view(np.uint16), int(qtype)
    if qtype not in _WEIGHT_DTYPES:
        raise ValueError(
            f"{op}: {qtype.name} weights have no CUDA kernel yet (the cpu device runs them)"
        )
    check(op, "weight", w, _WEIGHT_DTYPES[qtype], 2)
    if w.shape[1] != k:
        raise ValueError(f"{op}: {qtype.name} weight shape {w.shape} does not match K={k}")
    return w.view(_KERNEL_VIEW[qtype]), int(qtype)


def aligned(a, nbytes: int) -> bool:
    """Whether a's data starts on an nbytes boundary (always so under the simulator)."""
    cai = getattr(a, "__cuda_array_interface__", None)
    return cai is None or cai["data"][0] % nbytes == 0


def placeholder(dtype, ndim: int = 1):
    """A tiny device array passed where an optional argument is absent (flagged off), made
    once per dtype so later launches (and graph capture) allocate nothing."""
    key = (np.dtype(dtype), ndim)
    if key not in _empty_cache:
        _empty_cache[key] = cuda.device_array((1,) * ndim, dtype)
    return _empty_cache[key]


def grid_blocks(n: int, per_block: int) -> int:
    return max(1, -(-n // per_block))


def allow_dynamic_shared(kernel, args, nbytes: int) -> None:
    """Lets kernel (a @cuda.jit dispatcher) launch with nbytes of dynamic shared memory."""
    if SIMULATOR or nbytes <= 48 * 1024:
        return
    # cheap key first: a launch that repeats a known argument layout costs no typing
    layout = tuple((getattr(a, "dtype", type(a)), getattr(a, "ndim", 0)) for a in args)
    key = (id(kernel), layout, id(cuda.current_context()), nbytes)
    if key in _raised:
        return
    compiled = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
    cufunc = compiled._codelibrary.get_cufunc()  # the function bound to the current context
    from numba.cuda.cudadrv.driver import binding, driver  # raises on a failed call

    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    if hasattr(cufunc, "kernel"):  # loaded as a library: the handle is a CUkernel
        driver.cuKernelSetAttribute(attr, nbytes, cufunc.handle, cufunc.device.id)
    else:
        driver.cuFuncSetAttribute(cufunc.handle, attr, nbytes)
    _raised.add(key)
