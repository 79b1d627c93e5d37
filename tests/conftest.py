import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu",
                     help="device for tests/test_device.py (cpu or cuda); the other tests run on the CPU")


def pytest_collection_modifyitems(config, items):
    """The statistical tests (minutes each) count as slow too: `-m "not slow"` is the quick run."""
    for item in items:
        if item.get_closest_marker("statistical") is not None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def device(request) -> str:
    name = request.config.getoption("--device")
    if torch.device(name).type == "cuda" and not torch.cuda.is_available():
        pytest.fail(f"--device {name}: CUDA is not available on this machine")
    return name


# The user's model cache, captured before tests isolate it: slow tests read pulled models from here.
REAL_SPECDEC_HOME = Path(os.environ.get("SPECDEC_HOME") or Path.home() / ".cache" / "specdec")


@pytest.fixture(scope="session")
def built_kernels(tmp_path_factory) -> Path:
    """One directory of compiled kernel libraries for the whole run: a library is named by its sources and
    flags, so sharing it changes nothing but the time a command run as a subprocess would spend compiling."""
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture(autouse=True)
def isolated_specdec_home(tmp_path, monkeypatch, built_kernels):
    """Every test gets its own empty model cache, so nothing a test pulls or converts leaks out (the
    compiled kernels excepted: see built_kernels)."""
    home = tmp_path / "specdec_home"
    home.mkdir()
    (home / "kernels").symlink_to(built_kernels, target_is_directory=True)
    monkeypatch.setenv("SPECDEC_HOME", str(home))


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct (pulled beforehand with `specdec pull smollm2-135m-instruct`)."""
    from specdec.models.sources.loading import load_model

    return load_model(str(pulled_model_dir("smollm2-135m-instruct")))


def pulled_model_dir(name: str) -> Path:
    """The converted directory of a zoo model pulled beforehand (a failure in CI, which pulls them first; a
    skip elsewhere)."""
    path = REAL_SPECDEC_HOME / "models" / name / "hf"
    if not (path / "config.json").exists():
        if os.environ.get("CI"):
            pytest.fail(f"CI must pull {name} before the tests ({path} is missing)")
        pytest.skip(f"{name} is not pulled (run: specdec pull {name})")
    return path


@pytest.fixture(scope="session")
def gemma3():
    """The real Gemma 3 270M on its GGUF file's blocks (pulled beforehand with `specdec pull gemma3-270m`)."""
    from specdec.models.sources.loading import load_model

    return load_model(str(pulled_model_dir("gemma3-270m")))


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """Hugging Face directories of tiny random models, one per architecture variant."""
    from tiny_models import save_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    return {kind: save_tiny_model(root / kind, kind) for kind in ("llama", "llama3", "qwen2", "mistral", "gemma3")}


@pytest.fixture(scope="session")
def tiny_generator(tiny_dirs, tmp_path_factory):
    """The tiny llama with n-gram drafting, K 4: what the server tests serve."""
    from specdec.api.generator import SpeculativeGenerator

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDEC_HOME", str(tmp_path_factory.mktemp("home")))
        return SpeculativeGenerator.from_pretrained(str(tiny_dirs["llama"]), drafter="ngram", k=4)
