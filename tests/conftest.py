"""Fixtures shared by several test modules."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def two_torch_threads():
    """torch on 2 CPU threads for the module (the zoo's recorded numbers were computed that way), restored after."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)
