"""Models where users keep them, on fake Ollama, Hugging Face cache, LM Studio and models-folder layouts
built from the tiny test models: each name resolves to its file and decodes as the file given by path;
`specdec models --local` lists them with their tokenizer fingerprints and drafts; a missing or broken
model is one line, never a traceback."""

from __future__ import annotations

import json
import shutil

import pytest

from specdec.api.generator import SpeculativeGenerator
from specdec.cli import main
from specdec.errors import UnknownModelError
from specdec.models.fingerprint import tokenizer_fingerprint
from specdec.models.sources.loading import check_model_spec, load_model, resolve_model_dir
from tiny_models import make_hf_model, save_tiny_model, write_tiny_gguf


@pytest.fixture
def stores(tmp_path, monkeypatch):
    """One tiny Qwen2 model as each store keeps it, and a Gemma 3 one (another tokenizer) in a models folder."""
    source = write_tiny_gguf(tmp_path / "source.gguf", make_hf_model("qwen2", seed=3), "F32")
    small = write_tiny_gguf(tmp_path / "small.gguf", make_hf_model("qwen2", seed=3), "Q8_0")
    ollama = tmp_path / "ollama"
    digest = "sha256:" + "ab" * 32
    (ollama / "blobs").mkdir(parents=True)
    shutil.copy(source, ollama / "blobs" / digest.replace(":", "-"))
    manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "f32"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "cd" * 32},
        {"mediaType": "application/vnd.ollama.image.model", "digest": digest}]}))
    snapshot = tmp_path / "hub" / "models--org--tiny-GGUF" / "snapshots" / "c0ffee"
    snapshot.mkdir(parents=True)
    shutil.copy(small, snapshot / "tiny-q8_0.gguf")
    (tmp_path / "hub" / "models--org--tiny-GGUF" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--tiny-GGUF" / "refs" / "main").write_text("c0ffee")
    lmstudio = tmp_path / "lmstudio" / "pub" / "tiny-GGUF"
    lmstudio.mkdir(parents=True)
    shutil.copy(small, lmstudio / "tiny-Q8_0.gguf")
    mine = tmp_path / "mine"
    mine.mkdir()
    write_tiny_gguf(mine / "gemma-tiny.gguf", make_hf_model("gemma3", seed=3), "F32")
    (mine / "broken.gguf").write_bytes(source.read_bytes()[:200])  # a download cut short
    save_tiny_model(mine / "tiny-dir", "qwen2", seed=3)
    for name, value in {"OLLAMA_MODELS": ollama, "HF_HUB_CACHE": tmp_path / "hub",
                        "LMSTUDIO_MODELS": tmp_path / "lmstudio", "SPECDEC_MODELS_DIR": mine}.items():
        monkeypatch.setenv(name, str(value))
    return source


@pytest.mark.parametrize("name", ["ollama:tiny:f32", "hf:org/tiny-GGUF", "hf:org/tiny-GGUF/tiny-q8_0.gguf",
                                  "lmstudio:pub/tiny-GGUF", "gemma-tiny", "tiny-dir"])
def test_each_store_name_resolves(stores, name):
    check_model_spec(name)
    display, directory = resolve_model_dir(name)
    assert (directory / "config.json").is_file() and display


def test_an_ollama_blob_decodes_as_the_file_given_by_path(stores):
    by_store = SpeculativeGenerator(load_model("ollama:tiny:f32"), None).generate("hello", 12, chat=False)
    by_path = SpeculativeGenerator(load_model(str(stores)), None).generate("hello", 12, chat=False)
    assert by_store.token_ids == by_path.token_ids
    assert load_model("ollama:tiny:f32").name == "ollama:tiny:f32"


@pytest.mark.parametrize("name, words", [
    ("ollama:nothing", "no such model in Ollama's store"),
    ("hf:org/absent", "not in the Hugging Face cache"),
    ("hf:org/tiny-GGUF/other.gguf", "no such file"),
    ("lmstudio:pub/absent", "not in LM Studio's models folder"),
    ("hf:justone", "name a repository as hf:ORG/REPO"),
])
def test_a_missing_stored_model_is_one_clear_error(stores, name, words):
    with pytest.raises(UnknownModelError, match=words):
        check_model_spec(name)


def test_fingerprints_match_exactly_when_token_ids_mean_the_same(stores, tmp_path):
    qwen_f32 = tokenizer_fingerprint(stores)
    qwen_q8 = tokenizer_fingerprint(write_tiny_gguf(tmp_path / "q.gguf", make_hf_model("qwen2", seed=9), "Q8_0"))
    converted = tokenizer_fingerprint(resolve_model_dir(str(stores))[1])  # its tokenizer.json
    gemma = tokenizer_fingerprint(tmp_path / "mine" / "gemma-tiny.gguf")
    assert qwen_f32 == qwen_q8 == converted != gemma


def test_models_local_lists_every_store_with_drafts_and_a_broken_file_in_one_line(stores, capsys):
    assert main(["models", "--local"]) == 0
    lines = capsys.readouterr().out.splitlines()
    by_name = {line.split()[0]: line for line in lines[1:]}
    assert {"ollama:tiny:f32", "hf:org/tiny-GGUF/tiny-q8_0.gguf", "lmstudio:pub/tiny-GGUF/tiny-Q8_0.gguf",
            "gemma-tiny", "broken", "tiny-dir"} <= set(by_name)
    assert "unreadable" in by_name["broken"] and "Traceback" not in "\n".join(lines)
    fingerprint = tokenizer_fingerprint(stores)
    assert fingerprint in by_name["ollama:tiny:f32"] and "hf:org/tiny-GGUF/tiny-q8_0.gguf" in by_name["ollama:tiny:f32"]
    assert fingerprint not in by_name["gemma-tiny"]


def test_a_bad_store_name_on_the_command_line_is_one_line_and_exit_2(stores, capsys):
    assert main(["generate", "hi", "--target", "ollama:nothing", "--max-new-tokens", "2"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("specdec: error: ollama:nothing:") and "\n" not in error
