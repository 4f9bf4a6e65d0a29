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
