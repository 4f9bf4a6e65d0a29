"""The int8 dot product's spellings (_int8simd: vnni512, avx512bw, avx2, generic): chosen by the
features of numba's compile target, each exact against numpy on every input the kernels can
pass, and the GEMV and GEMM compiled for an AVX2-only CPU (a child process with
NUMBA_CPU_NAME=haswell) bit-equal to this build's, without one 512-bit register or vpdpbusd,
the GEMM on its narrow tile with (next to) no stack traffic in its hot loops."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from tests.kernels.test_linear import random_blocks
from vtllm.kernels import QType
from vtllm.kernels.cpu._int8simd import (
    INT8_VARIANT,
    VARIANTS,
    compile_target,
    int8_variant,
    itof,
    load_b64,
    load_i16,
)
from vtllm.kernels.cpu._simd import vstore
from vtllm.kernels.cpu.linear_int8 import GEMM_MIN_M, NC_MIN, _gemm_kernel, _gemv_kernel

CHILD = Path(__file__).with_name("int8_target_child.py")
LADDER = ("generic", "avx2", "avx512bw", "vnni512")  # each target runs those up to its own
RUNNABLE = LADDER[: LADDER.index(INT8_VARIANT) + 1]


def test_variant_follows_the_compile_target():
    assert int8_variant(*compile_target()) == INT8_VARIANT
    assert int8_variant("x86-64", "") == "generic"
    assert int8_variant("sandybridge", "") == "generic"  # AVX without AVX2
    assert int8_variant("haswell", "") == "avx2"
    assert int8_variant("skylake-avx512", "-avx512f") == "avx2"
    assert int8_variant("skylake-avx512", "") == "avx512bw"
    assert int8_variant("icelake-server", "+avx512vnni") == "vnni512"
    assert int8_variant("haswell", "-avx2") == "generic"


def _runner(dp):
    @njit
    def run(acc, u, s, out):  # lanes below 2**24 pass through float32 exactly
        vstore(out, 0, itof(dp(load_i16(acc, 0), load_b64(u, 0), load_b64(s, 0))))

    return run


def _cases(rng, u_max):
    """(u, s) byte vectors: random, and the corners where an i16 pair sum is largest."""
    yield rng.integers(0, u_max + 1, 64).astype(np.uint8), rng.integers(-128, 128, 64)
    for u in (u_max, u_max - 1, 128 if u_max > 128 else 0):
        for s in (-128, 127, -127):
            yield np.full(64, u, np.uint8), np.full(64, s)
    u = np.tile(np.array([u_max, u_max, 0, 1], np.uint8), 16)
    yield u, np.tile(np.array([-128, -128, 127, -1]), 16)


@pytest.mark.parametrize("variant", RUNNABLE)
def test_dpbusd_exact(rng, variant):
    """dpbusd for any u, dpbusd_small for u < 128: lane i += sum_j u[4i+j] * s[4i+j]."""
    acc = rng.integers(-(1 << 20), 1 << 20, 16).astype(np.int32)
    for dp, u_max in zip(VARIANTS[variant], (255, 127), strict=True):
        run = _runner(dp)
        for u, s in _cases(rng, u_max):
            s = s.astype(np.int8)
            want = acc + (u.astype(np.int64) * s).reshape(16, 4).sum(axis=1)
            out = np.full(16, np.nan, np.float32)
            run(acc, u, s, out)
            assert np.array_equal(out, want), (variant, u_max, u[:4], s[:4])


_LABEL = re.compile(r"^(\.?L?[\w.$]+):")
_STACK_STORE = re.compile(r"^v\w+\s+%[xyz]mm\d+, -?\d*\(%rsp\)$")


def hot_loops(asm: str, op: str) -> list[list[str]]:
    """The instructions of each loop of one basic block (a label, then code that ends in a
    jump back to it) that holds `op`."""
    loops, name, body = [], None, []
    for line in asm.splitlines():
        label = _LABEL.match(line)
        if label:
            name, body = label.group(1), []
            continue
        ins = line.strip()
        if not ins or ins.startswith("."):
            continue
        body.append(ins)
        if ins.startswith("j"):
            if ins.split()[-1] == name and any(i.split()[0] == op for i in body):
                loops.append(body)
            name, body = None, []
    return loops


def test_avx2_build_matches_this_build(rng, tmp_path):
    """Arbitrary block bytes (Q8_0's -128 included), 17 blocks (a padded pair, two groups of
    Q4_1 minimums), N not a multiple of 4 in tiles of NC_MIN rows; the GEMV at a decode row
    and 3 rows, the GEMM at row counts that fill its 4-row blocks or not, over two panels."""
    n, k = 45, 544
    inputs = {"bias": rng.standard_normal(n).astype(np.float32), "tile_rows": NC_MIN}
    for qtype in (QType.Q4_0, QType.Q4_1, QType.Q8_0):
        for m in (1, 3, 4, 7, 70):
            name = f"{int(qtype)}_{m}"
            inputs["w_" + name] = random_blocks(rng, qtype, n, k)
            x = rng.standard_normal((m, k)) * rng.uniform(0.1, 30, (m, 1))
            inputs["x_" + name] = x.astype(np.float32)
    np.savez(tmp_path / "in.npz", **inputs)
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES="")
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "cache")  # never this build's cached code
    subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
        env=env,
        check=True,
        timeout=300,
    )
    got = np.load(tmp_path / "out.npz")
    assert str(got["variant"]) == "avx2" and bool(got["narrow"])
    for asm in (str(got["asm"]), str(got["gemm_asm"])):
        assert "zmm" not in asm and "vpdpbusd" not in asm
        assert "vpmaddubsw" in asm and "vpmaddwd" in asm and "ymm" in asm
    # The GEMM's hot loops, one per weight type: the 4 x 4 tile spilled ~50 ymm to the stack
    # per iteration; the 4 x 1 sweep none for Q4_0 / Q4_1, and Q8_0's (two masks more) parks
    # one accumulator: at most one store per 8 dots allows that, and no more.
    loops = hot_loops(str(got["gemm_asm"]), "vpmaddubsw")
    assert len(loops) >= 3
    dots = sum(i.split()[0] == "vpmaddubsw" for body in loops for i in body)
    stores = sum(bool(_STACK_STORE.match(i)) for body in loops for i in body)
    assert stores <= dots // 8, (stores, dots)
    for key in inputs:
        if key.startswith("x_"):
            name = key[2:]
            x, w, qtype = inputs[key], inputs["w_" + name], int(name.split("_")[0])
            out = np.empty((x.shape[0], n), np.float32)
            if x.shape[0] < GEMM_MIN_M:
                _gemv_kernel(x, w, qtype, inputs["bias"], out, 2)
            else:
                _gemm_kernel(x, w, qtype, inputs["bias"], out, NC_MIN)
            assert np.array_equal(got["out_" + name], out), name
