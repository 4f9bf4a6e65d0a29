"""GPU tests (marker `gpu`): deselected by default, run on a machine with an NVIDIA GPU:
    .venv/bin/python -m pytest -q -m gpu tests/gpu
Without a usable GPU they are skipped with the reason."""

import pytest


def _skip_reason() -> str | None:
    try:
        from numba import cuda

        if cuda.is_available():
            return None
        return "numba.cuda sees no GPU"
    except Exception as e:
        return f"numba.cuda is unusable here: {e}"


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "tests/gpu" in str(item.path) or "tests\\gpu" in str(item.path):
            reason = reason or _skip_reason() or "ok"
            if reason != "ok":
                item.add_marker(pytest.mark.skip(reason=reason))
