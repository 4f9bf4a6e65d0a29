"""Child process of test_int8_variants: the int8 GEMV compiled for the target numba was given
(NUMBA_CPU_NAME / NUMBA_CPU_FEATURES), run on the parent's inputs.

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
    # without prange: the same bits (the kernel's law) at a fraction of the compile time
    gemv = _njit(nogil=True)(linear_int8._gemv_kernel.py_func)
    outs = {}
    for key in sorted(inputs):
        if key.startswith("x_"):
            name = key[2:]
            qtype = int(name.split("_")[0])
            out = np.empty((inputs[key].shape[0], inputs["w_" + name].shape[0]), np.float32)
            gemv(inputs[key], inputs["w_" + name], qtype, inputs["bias"], out, 2)
            outs["out_" + name] = out
    asm = gemv.inspect_asm(gemv.signatures[0])
    np.savez(dst, variant=_int8simd.INT8_VARIANT, asm=asm, **outs)


if __name__ == "__main__":
    main(*sys.argv[1:3])
