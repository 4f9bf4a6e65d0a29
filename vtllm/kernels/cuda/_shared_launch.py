"""Dynamic shared memory above 48 KB for a numba kernel.

A kernel may use up to 227 KB of shared memory a block on sm_90, but the driver refuses a
launch asking for more than 48 KB of dynamic shared memory unless the function's
MAX_DYNAMIC_SHARED_SIZE_BYTES attribute was raised first, and numba's launcher does not do it.
allow_dynamic_shared compiles the kernel for the launch's argument types (numba would on the
launch anyway) and raises the attribute once per compiled function, before its first launch.
The simulator has no such limit.
"""

from vtllm.kernels.cuda._device import SIMULATOR

_raised: set = set()


def allow_dynamic_shared(kernel, args, nbytes: int) -> None:
    """Lets kernel (a @cuda.jit dispatcher) launch with nbytes of dynamic shared memory."""
    if SIMULATOR or nbytes <= 48 * 1024:
        return
    from numba import cuda

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
