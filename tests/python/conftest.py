"""Fixtures of the Python module's tests: the default model (loaded once), the kvlab binary
(KVLAB_BINARY, set by CTest) and a context text from the bundled essays."""
import os
import pathlib

import pytest

import kvlab

ROOT = pathlib.Path(os.environ.get("KVLAB_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))


@pytest.fixture(scope="session")
def model():
    return kvlab.Model("smollm2-135m", threads=2)


@pytest.fixture(scope="session")
def binary():
    path = os.environ.get("KVLAB_BINARY", str(ROOT / "build" / "kvlab"))
    assert os.access(path, os.X_OK), "the kvlab binary (KVLAB_BINARY) is needed to compare with the CLI: " + path
    return path


@pytest.fixture(scope="session")
def essay():
    """About 1,000 tokens of the essays, ending with a sentence."""
    text = (ROOT / "data" / "haystack" / "avg.txt").read_text()
    cut = text[:4200]
    return cut[: cut.rfind(".") + 1]
