import pytest

from latentkv.sources.readers import read_source


@pytest.fixture(scope="session")
def smollm2():
    """The bundled SmolLM2 GGUF read once per run."""
    return read_source()


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2):
    return smollm2.tokenizer()
