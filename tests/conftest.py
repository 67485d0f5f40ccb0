import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same RNG state, so results do not depend on test order."""
    torch.manual_seed(0)
