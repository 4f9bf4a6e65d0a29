"""Registers, spills and SASS of a CUDA kernel, compiled for the H200 (sm_90) on a machine
without a GPU, so that such questions cost no device time.

Needs numba-cuda (the GPU image's version), NVRTC and ptxas, cuobjdump and nvdisasm. Once, in a
venv of its own (the project's venv has numba's built-in CUDA target, not numba-cuda):
    python3 -m venv /tmp/kvenv && /tmp/kvenv/bin/pip install numba-cuda==0.30.4 msgspec \
        ml_dtypes 'nvidia-cuda-nvrtc==13.0.*' nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
and ptxas on PATH (the CUDA toolkit's, /usr/local/cuda/bin). Then, from the repo root:
    PATH=$PATH:$(echo /tmp/kvenv/lib/python3*/site-packages/nvidia/cu13/bin) \
    PYTHONPATH=$PWD /tmp/kvenv/bin/python tools/kernel_report.py \
        vtllm/kernels/cuda/attention_split.py _split_kernel \
        "(float32[:,:,::1], float32[:,:,:,::1], float32[:,:,:,::1], int32[:,::1], int32[::1], \
          int32[::1], float32, float32[:,:,:,::1], float32[:,:,:,::1])" --max-registers 128 \
        [--sass OUT.sass]
prints ptxas's resource line (registers, stack frame, spill bytes, shared memory) and, with
--sass, writes the disassembly (count LDS / HMMA / CALL in it: a CALL in an inner loop is
usually a 64-bit integer division). The register cap must be the kernel's own max_registers.
"""

import argparse
import importlib.util
import subprocess
import sys
import tempfile

import numba.cuda.dispatcher as dispatcher
from numba import cuda


class _H200:
    compute_capability = (9, 0)


# Device functions are compiled for "the current device" while a kernel is typed; there is none
# here, so say which one.
dispatcher.get_current_device = lambda: _H200()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("module", help="path of the kernel's module")
    p.add_argument("kernel", help="the @cuda.jit kernel's name in it, or an expression of its "
                   "names (_KERNELS[True])")  # fmt: skip
    p.add_argument("signature", help="numba signature of its arguments")
    p.add_argument("--max-registers", type=int)
    p.add_argument("--sass", help="write the disassembly here")
    args = p.parse_args()
    spec = importlib.util.spec_from_file_location("kernel_module", args.module)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernel = eval(args.kernel, vars(module))  # a name, or a table lookup
    ptx, _ = cuda.compile_ptx(kernel.py_func, args.signature, cc=(9, 0))
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/k.ptx", "w") as f:
            f.write(ptx)
        cmd = ["ptxas", "-arch=sm_90", "-v", f"{tmp}/k.ptx", "-o", f"{tmp}/k.cubin"]
        if args.max_registers:
            cmd += ["-maxrregcount", str(args.max_registers)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        print(
            "\n".join(
                line for line in done.stderr.splitlines() if "Used" in line or "spill" in line
            )
        )
        if done.returncode:
            sys.exit(done.stderr)
        if args.sass:
            sass = subprocess.run(["cuobjdump", "-sass", f"{tmp}/k.cubin"], capture_output=True,
                                  text=True, check=True).stdout  # fmt: skip
            with open(args.sass, "w") as f:
                f.write(sass)


if __name__ == "__main__":
    main()
