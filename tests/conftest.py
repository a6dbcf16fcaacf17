import os
import sys

import pytest
import torch
from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))

settings.register_profile("ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "thorough", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Tests of the real vLLM (CI's second stage runs `pytest -m vllm` in the venv of
# tools/make_vllm_venv.sh): whole modules, and every test using the real-vLLM fixture.
VLLM_MODULES = ("test_vllm_engine", "test_vllm_upstream")
VLLM_FIXTURES = ("vllm_backend", "vllm_ascend_backend")


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        module = item.module.__name__ if item.module is not None else ""
        if module in VLLM_MODULES or any(f in getattr(item, "fixturenames", ()) for f in VLLM_FIXTURES):
            item.add_marker(pytest.mark.vllm)


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches emptied before and after the test (a compile counts its own graphs)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
