"""Registers, spills and SASS of a CUDA kernel, compiled for sm_90 (Hopper) on a machine
without a GPU: such questions need no card.

Needs numba-cuda (the version the kernels run with on the GPU), NVRTC and ptxas, cuobjdump and
nvdisasm. Once, in a venv of its own (a venv without the [cuda] extra has numba's built-in CUDA
target, not numba-cuda):
    python3 -m venv /tmp/kvenv && /tmp/kvenv/bin/pip install numba-cuda==0.30.4 msgspec \
        ml_dtypes 'nvidia-cuda-nvrtc==13.0.*' nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
and ptxas on PATH (the CUDA toolkit's, /usr/local/cuda/bin). Then, from the repo root:
    PATH=$PATH:$(echo /tmp/kvenv/lib/python3*/site-packages/nvidia/cu13/bin) \
    PYTHONPATH=$PWD /tmp/kvenv/bin/python tools/kernel_report.py \
        vtllm/kernels/cuda/attention_split.py _split_kernel \
        "(float32[:,::1], float32[:,:,:,::1], float32[:,:,:,::1], int32[:,::1], int32[::1], \
          int32[::1], float32, float32[:,:,:,::1], float32[:,:,:,::1], int32[::1], int32[::1], \
          float32[:,::1], float32[::1], float32[::1], float32, boolean)" --max-registers 128 \
        [--sass OUT.sass]
prints ptxas's resource line (registers, stack frame, spill bytes, shared memory), the number
of SASS instructions (16 bytes each: a kernel that runs most of them once, as the small decode
kernels do, may wait on fetching them; BENCHMARKS.md) and, with --sass, writes the
disassembly (count LDS / HMMA / CALL in it: a CALL in an inner loop is usually a 64-bit
integer division). The register cap must be the kernel's own max_registers.
--mma-loop counts the instructions of the tensor-core main loop (the backward branch whose
body holds HMMA) on its common path: without the basic blocks that store to shared memory or
reset 16+ registers at once (gemm_mma's residue-class fold, once per class).
--loops lists every loop (backward branch) with its body's size and its memory and math
instructions: the overhead per useful instruction of an inner loop at a glance (integer
address math around shared loads, 64-bit counters of stepped ranges; BENCHMARKS.md).
"""

import argparse
import importlib.util
import re
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


def _opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


_BRANCH = re.compile(r"BRA .*?0x([0-9a-f]+)")


def _instructions(sass: str) -> list[tuple[int, str]]:
    """(address, text) of every SASS instruction."""
    return [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]


def _loop_bodies(ins: list[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    """The instructions from each backward branch's target to the branch, in code order."""
    at = {a: k for k, (a, _) in enumerate(ins)}
    bodies = []
    for k, (a, t) in enumerate(ins):
        m = _BRANCH.search(t)
        if m and int(m.group(1), 16) <= a and int(m.group(1), 16) in at:
            bodies.append(ins[at[int(m.group(1), 16)] : k + 1])
    return bodies


def loops(sass: str) -> str:
    """One line per loop, as the module docstring says."""
    lines = []
    for body in _loop_bodies(_instructions(sass)):
        ops = [_opcode(t) for _, t in body]
        kinds = ("LDS", "LDG", "STS", "STG", "FFMA", "HMMA", "IMAD")
        counts = [f"{op} {ops.count(op)}" for op in kinds if op in ops]
        if local := ops.count("LDL") + ops.count("STL"):
            counts.append(f"local {local}")
        lines.append(
            f"loop {body[0][0]:#x}-{body[-1][0]:#x}: {len(ops)} instructions"
            + "".join(f", {c}" for c in counts)
        )
    return "\n".join(lines) or "no loops"


def mma_loop(sass: str) -> str:
    """The main loop's common path, as the module docstring says."""
    ins = _instructions(sass)
    targets = {int(m.group(1), 16) for _, t in ins if (m := _BRANCH.search(t))}
    loop = None
    for body in _loop_bodies(ins):
        if any("HMMA" in x for _, x in body):
            loop = body
    if loop is None:
        return "no loop with HMMA"
    blocks, block = [], []
    for a, t in loop:
        if a in targets and block:
            blocks.append(block)
            block = []
        block.append(_opcode(t))
        if block[-1] == "BRA":
            blocks.append(block)
            block = []
    blocks += [block] if block else []
    common = [b for b in blocks if "STS" not in b and b.count("CS2R") < 16 and b.count("IMAD") < 48]
    ops = [op for b in common for op in b]
    return (
        f"mma loop: {len(loop)} instructions; common path {len(ops)}, "
        f"{ops.count('HMMA')} HMMA, {ops.count('LDL') + ops.count('STL')} local"
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("module", help="path of the kernel's module")
    p.add_argument(
        "kernel",
        help="the @cuda.jit kernel's name in it, or an expression of its names (_KERNELS[True])",
    )
    p.add_argument("signature", help="numba signature of its arguments")
    p.add_argument("--max-registers", type=int)
    p.add_argument("--sass", help="write the disassembly here")
    p.add_argument("--mma-loop", action="store_true", help="count the main loop's instructions")
    p.add_argument("--loops", action="store_true", help="list the loops and what is in them")
    p.add_argument(
        "--sm90a",
        action="store_true",
        help="compile for sm_90a (what numba does on an H100 / H200: wgmma kernels need it)",
    )
    args = p.parse_args()
    spec = importlib.util.spec_from_file_location("kernel_module", args.module)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernel = eval(args.kernel, vars(module))  # a name, or a table lookup
    cc = (9, 0, "a") if args.sm90a else (9, 0)
    ptx, _ = cuda.compile_ptx(kernel.py_func, args.signature, cc=cc)
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/k.ptx", "w") as f:
            f.write(ptx)
        arch = "-arch=sm_90a" if args.sm90a else "-arch=sm_90"
        cmd = ["ptxas", arch, "-v", f"{tmp}/k.ptx", "-o", f"{tmp}/k.cubin"]
        if args.max_registers:
            cmd += ["-maxrregcount", str(args.max_registers)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        print(
            "\n".join(
                line
                for line in done.stderr.splitlines()
                # (a wgmma kernel: a wait ptxas injects drains the warpgroup's wgmmas there)
                if any(w in line for w in ("Used", "spill", "warning", "wait is injected"))
            )
        )
        if done.returncode:
            sys.exit(done.stderr)
        sass = subprocess.run(
            ["cuobjdump", "-sass", f"{tmp}/k.cubin"], capture_output=True, text=True, check=True
        ).stdout
        n = len(re.findall(r"/\*[0-9a-f]{4,}\*/\s+[^;]*;", sass))
        print(f"SASS: {n} instructions ({16 * n / 1024:.0f} KiB of code)")
        if args.sass:
            with open(args.sass, "w") as f:
                f.write(sass)
        if args.mma_loop:
            print(mma_loop(sass))
        if args.loops:
            print(loops(sass))


if __name__ == "__main__":
    main()
