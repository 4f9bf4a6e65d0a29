"""CUDA kernels against the numpy references, under numba's simulator or on a real GPU.

NUMBA_ENABLE_CUDASIM is read when numba.cuda is first imported, so the simulator run is its own
pytest process:
    NUMBA_ENABLE_CUDASIM=1 .venv/bin/python -m pytest -q -m cudasim tests/kernels_cuda
Without it the folder runs only where numba.cuda sees a GPU; anywhere else every test in it is
skipped, with the reason in the summary (and in the header when this folder is collected first).
"""

import os
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent


def _skip_reason() -> str | None:
    from numba.core import config

    if config.ENABLE_CUDASIM:
        return None
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return "NUMBA_ENABLE_CUDASIM=1 was set after numba read its config: run a fresh process"
    try:
        from numba import cuda

        if cuda.is_available():
            return None
    except Exception as e:  # a broken driver or toolkit: say so instead of failing collection
        return f"numba.cuda is unusable here: {e}"
    return "no CUDA GPU (numba.cuda.is_available() is False) and NUMBA_ENABLE_CUDASIM is not 1"


SKIP_REASON = _skip_reason()


def pytest_report_header(config):
    mode = "simulator" if SKIP_REASON is None and _simulating() else "GPU"
    return f"kernels_cuda: {'skipped: ' + SKIP_REASON if SKIP_REASON else mode}"


def _simulating() -> bool:
    from numba.core import config

    return bool(config.ENABLE_CUDASIM)


# The smoke cases `make test-cudasim-smoke` runs (`-m "cudasim and smoke"`): at least one
# case calling each kernel module (--kernel-coverage checks it), picked among the cheap ones; the
# whole matrix runs in `make test-cudasim` and on a GPU. A file's name alone takes all its cases.
SMOKE = {
    "test_activation.py",
    "test_norm.py",
    "test_rope.py",
    "test_embedding.py",
    "test_gather.py",
    "test_token_masks.py",
    "test_device_helpers.py",
    "test_qkv_rope.py",
    "test_logprobs.py",
    "test_staging.py",
    "test_attention_split_rows.py",
    "test_sampling.py",
    "test_sampling_features.py::test_feature_matches_cpu[combined]",
    "test_sampling_features.py::test_random_mix_matches_cpu",
    "test_attention.py::test_matches_reference[hq4-hk2-d16-bs4-split]",
    "test_attention.py::test_matches_reference[hq2-hk1-d8-bs16-whole-row]",
    "test_attention.py::test_bf16_cache_matches_reference[d32-split]",
    "test_attention.py::test_ring_kernel_gives_the_split_kernels_bits[hq2-hk1-d8-bs16-bfloat16]",
    "test_attention.py::test_skips_inconsistent_sequences",
    "test_attention.py::test_rejects_bad_shapes",
    "test_attention_flash.py::test_matches_reference[hq8-hk1-d16-bs16]",
    "test_attention_flash.py::test_rows_past_a_bad_block_table_entry_stay_unwritten",
    "test_linear.py::test_matches_reference[1-Q4_0]",
    "test_linear.py::test_matches_reference[5-BF16]",
    "test_linear.py::test_rejects_bad_arguments",
    "test_linear_kquant.py::test_col0_writes_its_columns_only",
    "test_linear_kquant.py::test_embedding_rows[Q4_K]",  # _kquant_units (the embedding's decode)
    "test_linear_mma.py::test_accumulate_gives_the_bits_of_the_residual_add[1]",
    "test_linear_mma.py::test_packed_layout_is_the_mma_fragment_order",
    "test_linear_mma.py::test_bad_shapes_are_refused",
    "test_gemm_mma.py::test_device_weight_switches_where_gemm_pays[True]",
    "test_gemm_mma.py::test_bad_shapes_are_refused",
    "test_gemm_wgmma.py::test_device_weight_takes_wgmma_where_asked",
    "test_gemm_wgmma.py::test_round_x_is_split_x_hi",
    "test_gemm_wgmma.py::test_bad_inputs_are_refused",
    "test_linear_rows.py::test_device_weight_takes_batched_steps_here",
    "test_linear_rows.py::test_bad_inputs_are_refused",
    "test_moe.py::test_route_matches_reference_with_ties[True]",
    "test_moe.py::test_expert_linear_matches_reference[F32]",
    "test_moe.py::test_bad_arguments_are_refused",
    "test_spec_decode_sim.py::test_kernels_match_numpy",
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    ours = [item for item in items if HERE in Path(item.path).parents]  # the session's items
    if SKIP_REASON is not None:
        skip = pytest.mark.skip(reason=f"kernels_cuda: {SKIP_REASON}")
        for item in ours:
            item.add_marker(skip)
    unmatched = set(SMOKE)
    for item in ours:
        case = f"{Path(item.path).name}::{item.name}"
        for name in (Path(item.path).name, case):
            if name in SMOKE:
                item.add_marker(pytest.mark.smoke)
                unmatched.discard(name)
    collected = {Path(item.path).name for item in ours}
    stale = sorted(n for n in unmatched if n.split("::")[0] in collected)
    if stale:  # a renamed case must not drop out of the smoke run unnoticed
        raise pytest.UsageError(f"SMOKE names cases that do not exist: {', '.join(stale)}")
    items.sort(key=_long_ones_first)


# Files whose cases take the simulator a minute or more, longest first. They run first so that
# pytest-xdist's round-robin hands them to different workers at the start and the short cases
# fill in behind them, instead of one long case starting last and running alone.
LONG_FIRST = [
    "test_cuda_forward_sim.py",
    "test_spec_decode_sim.py",
    "test_moe_forward_sim.py",
    "test_gemma_forward_sim.py",
    "test_linear_rows.py",
    "test_gemm_mma.py",
    "test_linear_mma.py",
]


def _long_ones_first(item) -> int:
    name = Path(item.path).name
    return LONG_FIRST.index(name) if name in LONG_FIRST else len(LONG_FIRST)


@pytest.fixture(scope="session", autouse=True)
def _fast_simulator():
    """The simulator runs each CUDA thread as a Python thread and polls them at barriers; a
    shorter GIL switch interval makes barriers several times faster."""
    if not _simulating():
        yield
        return
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    yield
    sys.setswitchinterval(before)


@pytest.fixture
def rng(request):
    """Fresh random inputs, reproducible per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


# Which kernel modules a simulator run launched: `--kernel-coverage` fails the run when a module
# of vtllm/kernels/cuda that defines a kernel or device function saw none of them called, so a
# subset (the smoke run) cannot silently stop exercising one.
_called_modules: set[str] = set()


def _kernel_modules() -> set[str]:
    """Modules of vtllm/kernels/cuda with a `@cuda.jit` function (at module level or made by a
    factory), found in their source."""
    import ast

    import vtllm.kernels.cuda as package

    names = set()
    for path in sorted(Path(package.__path__[0]).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            decorators = getattr(node, "decorator_list", ())
            if any(ast.unparse(d).startswith("cuda.jit") for d in decorators):
                names.add(f"{package.__name__}.{path.stem}")
                break
    return names


@pytest.fixture(scope="session", autouse=True)
def _record_kernel_calls():
    if SKIP_REASON is not None or not _simulating():
        yield
        return
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    call = FakeCUDAKernel.__call__

    def recording_call(self, *args):
        _called_modules.add(self.fn.__module__)
        return call(self, *args)

    FakeCUDAKernel.__call__ = recording_call
    yield
    FakeCUDAKernel.__call__ = call


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist: a worker's launched modules reach the controller, which checks them."""
    _called_modules.update(getattr(node, "workeroutput", {}).get("kernel_modules", ()))


def pytest_sessionfinish(session, exitstatus):
    if not session.config.getoption("kernel_coverage") or not _simulating():
        return
    if hasattr(session.config, "workerinput"):  # an xdist worker: report, the controller checks
        session.config.workeroutput["kernel_modules"] = sorted(_called_modules)
        return
    missing = sorted(_kernel_modules() - _called_modules)
    if missing:
        session.config.get_terminal_writer().line(
            f"kernel coverage: no test ran a kernel of {', '.join(missing)}", red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
