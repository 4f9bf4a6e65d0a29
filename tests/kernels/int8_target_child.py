"""Child process of test_int8_variants: the int8 GEMV and GEMM compiled for the target numba
was given (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES), run on the parent's inputs (fewer rows than
GEMM_MIN_M: the GEMV, else the GEMM with the parent's tile_rows).

usage: python int8_target_child.py IN.npz OUT.npz

Compiling only what is checked keeps this cheap: explicit signatures compile a module's
kernels when it is imported, so njit drops them here (kernels compile on their first call),
and the kernel package's __init__ (which imports every kernel family) is skipped.
"""

import sys
import types
from pathlib import Path

import numba
import numpy as np

_njit = numba.njit


def _lazy_njit(*args, **kwargs):
    if args and not callable(args[0]):
        args = args[1:]  # the signature
    return _njit(*args, **kwargs)


numba.njit = _lazy_njit

import vtllm.kernels  # noqa: E402

package = types.ModuleType("vtllm.kernels.cpu")
package.__path__ = [str(Path(vtllm.kernels.__file__).parent / "cpu")]
sys.modules["vtllm.kernels.cpu"] = package

from vtllm.kernels.cpu import _int8simd, linear_int8  # noqa: E402


def main(src: str, dst: str) -> None:
    inputs = np.load(src)
    # without prange: the same bits (the kernels' law) at a fraction of the compile time
    gemv = _njit(nogil=True)(linear_int8._gemv_kernel.py_func)
    gemm = _njit(nogil=True)(linear_int8._gemm_kernel.py_func)
    outs = {}
    for key in sorted(inputs):
        if key.startswith("x_"):
            name = key[2:]
            qtype = int(name.split("_")[0])
            x, w = inputs[key], inputs["w_" + name]
            out = np.empty((x.shape[0], w.shape[0]), np.float32)
            if x.shape[0] < linear_int8.GEMM_MIN_M:
                gemv(x, w, qtype, inputs["bias"], out, 2)
            else:
                gemm(x, w, qtype, inputs["bias"], out, int(inputs["tile_rows"]))
            outs["out_" + name] = out
    np.savez(
        dst,
        variant=_int8simd.INT8_VARIANT,
        narrow=linear_int8.NARROW,
        asm=gemv.inspect_asm(gemv.signatures[0]),
        gemm_asm=gemm.inspect_asm(gemm.signatures[0]),
        **outs,
    )


if __name__ == "__main__":
    main(*sys.argv[1:3])
