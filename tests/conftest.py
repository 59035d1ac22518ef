"""Session fixtures: the tiny target/draft pair (fp32, CPU: exact equality holds) and an engine over them.

Model imports are inside the fixtures so the pure-core unit tests never import transformers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
import torch

if TYPE_CHECKING:
    from inprocess.engine import SpeculativeEngine
    from specserve.models.loading import LoadedModel


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """The tiny models gain nothing from threads, and the test machine's cores are shared."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_target() -> LoadedModel:
    from specserve.models.loading import ModelConfig, load_model

    return load_model(ModelConfig("tiny", device="cpu", dtype="float32"), progress=False)


@pytest.fixture(scope="session")
def tiny_draft() -> LoadedModel:
    from specserve.models.loading import ModelConfig, load_model

    return load_model(ModelConfig("tiny-draft", device="cpu", dtype="float32"), progress=False)


@pytest.fixture(scope="session")
def engine(tiny_target: LoadedModel, tiny_draft: LoadedModel) -> SpeculativeEngine:
    from inprocess.engine import SpeculativeEngine

    return SpeculativeEngine(tiny_target, tiny_draft, num_speculative_tokens=4)
