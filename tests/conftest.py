import json
from pathlib import Path

import pytest

GOLDENS = Path(__file__).parent / "goldens" / "smollm2_q4_1.json"


@pytest.fixture(scope="session")
def goldens() -> dict:
    return json.loads(GOLDENS.read_text())


@pytest.fixture(scope="session")
def default_model():
    from vtllm.models.loader import load_model

    return load_model()


def pytest_addoption(parser):
    parser.addoption(
        "--kernel-coverage",
        action="store_true",
        help="under numba's CUDA simulator: fail unless every vtllm/kernels/cuda module that "
        "defines a kernel had one called (tests/kernels_cuda/conftest.py)",
    )
