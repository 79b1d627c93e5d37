"""EAGLE-3 heads in the speculators format (vLLM's format for speculative heads), out and in.

A speculators `eagle3` checkpoint is a directory with config.json (`speculators_model_type: eagle3`, the
head's decoder layer as a Llama config, the draft vocabulary size, the target layer ids it fuses, the
verifier's name) and model.safetensors: the head's weights under their module names, its own token
embeddings and draft-vocabulary LM head, and the vocabulary maps (`d2t[i]` = target id of draft id i,
minus i; `t2d` a boolean mask over the target's vocabulary). Checked against speculators 0.9.0.

The EAGLE repository's own EAGLE-3 layout (and SpecForge's) imports too: the same tensors, the layer under
`midlayer.`, its config the layer's Llama config with `draft_vocab_size`, the default target layers.

specdec's EAGLE-3 head is that layout (heads/eagle3.py), so an export is a renaming plus the parts our
heads borrow from the target (embeddings, LM-head rows). EAGLE (EAGLE-2 style) and Medusa heads have no
speculators counterpart and are refused with the difference named. Imports accept the options our head
computes identically and refuse the others, rather than draft with a head that computes something else.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from specdec.errors import CorruptModelError, InvalidParameterError
from specdec.heads.checkpoint import HeadInfo, LoadedHead, load_head, read_head_info, target_identity
from specdec.heads.eagle3 import Eagle3Head, Eagle3Shape, default_feature_layers
from specdec.heads.target_parts import embed, lm_head_rows, native_model
from specdec.models.config import RopeConfig
from specdec.models.fingerprint import tokenizer_sha256
from specdec.paths import building_directory

CHECKED_VERSION = "0.9.0"
# Options of speculators' eagle3 type our head does not compute (each changes the head's function).
UNSUPPORTED_OPTIONS = {
    "norm_before_fc": "a norm over the fused features before fc",
    "fc_norm": "a norm per target layer before fc",
    "norm_output": "normed states fed back between draft steps",
}
NO_COUNTERPART = {
    "eagle": ("an EAGLE (EAGLE-2 style) head: its fc mixes token embedding and final feature before one "
              "standard layer; speculators' eagle3 fuses target layers and reads the embedding beside the "
              "feature. Train an EAGLE-3 head (`specdec train eagle3`) to export"),
    "medusa": "Medusa heads: speculators 0.9 has no Medusa type",
}


def checkpoint_format(path: Path) -> str | None:
    """"speculators" (config.json with `speculators_model_type`), "eagle" (the EAGLE repository's EAGLE-3
    layout, as SpecForge also writes it: a Llama config with `draft_vocab_size`, the layer's weights under
    `midlayer.`), or None."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    if "speculators_model_type" in data:
        return "speculators"
    return "eagle" if "draft_vocab_size" in data else None


def is_speculators_checkpoint(path: Path) -> bool:
    return checkpoint_format(path) is not None


def rope_parameters(rope: RopeConfig) -> dict:
    """Our rope settings as transformers' `rope_parameters`."""
    params: dict = {"rope_type": rope.rope_type, "rope_theta": rope.theta}
    if rope.rope_type in ("linear", "llama3"):
        params["factor"] = rope.factor
    if rope.rope_type == "llama3":
        params.update(low_freq_factor=rope.low_freq_factor, high_freq_factor=rope.high_freq_factor,
                      original_max_position_embeddings=rope.original_max_position_embeddings)
    return params


def rope_config(params: dict, where: str) -> RopeConfig:
    kind = params.get("rope_type", "default")
    if kind not in ("default", "linear", "llama3"):
        raise InvalidParameterError(f"{where}: rope type {kind!r} is not supported (default, linear, llama3)")
    return RopeConfig(theta=float(params.get("rope_theta", 10000.0)), rope_type=kind,
                      factor=float(params.get("factor", 1.0)),
                      low_freq_factor=float(params.get("low_freq_factor", 1.0)),
                      high_freq_factor=float(params.get("high_freq_factor", 4.0)),
                      original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)))


def layer_config(head: Eagle3Head, vocab_size: int, max_positions: int) -> dict:
    """The head's decoder layer as the Llama config speculators' `transformer_layer_config` holds."""
    c = head.config
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": vocab_size,
            "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size, "num_hidden_layers": 1,
            "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
            "hidden_act": "silu", "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": max_positions,
            "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
            "rope_parameters": rope_parameters(c.rope)}


def check_exportable(head_dir: Path, out_dir: Path) -> HeadInfo:
    """head.json of a head that can be exported to out_dir, or a clear error (before any model loads)."""
    out_dir = Path(out_dir).expanduser()
    if out_dir.exists() and not is_speculators_checkpoint(out_dir) and any(out_dir.iterdir()):
        raise InvalidParameterError(f"{out_dir}: exists and is not a speculators checkpoint; choose a new --out")
    info = read_head_info(Path(head_dir).expanduser())
    if info.kind != "eagle3":
        raise InvalidParameterError(f"{head_dir}: no speculators counterpart for {NO_COUNTERPART[info.kind]}")
    return info


def export_speculators(head_dir: Path, target, out_dir: Path, verifier: str | None = None) -> Path:
    """Write the specdec head at head_dir (trained for `target`, a LoadedModel) as a speculators eagle3
    checkpoint in out_dir; verifier: the name the checkpoint gives its target (a Hugging Face id for vLLM;
    default the target's directory)."""
    head_dir, out_dir = Path(head_dir).expanduser(), Path(out_dir).expanduser()
    check_exportable(head_dir, out_dir)
    loaded = load_head(head_dir, target, ("eagle3",))
    model = native_model(target.model)
    head: Eagle3Head = loaded.module
    ids = loaded.draft_vocab.sort().values  # speculators keeps the draft vocabulary in target-id order
    count, vocab_size = ids.shape[0], model.vocab_size
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    tensors = {name.replace("layer.", "layers.0.", 1): value for name, value in head.state_dict().items()}
    with torch.no_grad():
        tensors["embed_tokens.weight"] = torch.cat([embed(model, part.unsqueeze(0).to(model.device))[0]
                                                    for part in torch.arange(vocab_size).split(8192)])
        tensors["lm_head.weight"] = lm_head_rows(model, ids.to(model.device))
    tensors = {name: value.detach().to(torch.bfloat16).cpu().contiguous() for name, value in tensors.items()}
    tensors["d2t"] = (ids - torch.arange(count)).to(torch.int64)
    tensors["t2d"] = t2d
    target_config = json.loads((Path(target.path) / "config.json").read_text())
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": CHECKED_VERSION,
        "draft_vocab_size": count,
        "eagle_aux_hidden_state_layer_ids": list(head.shape.feature_layers),
        "norm_before_residual": head.shape.norm_before_residual,
        "norm_before_fc": False, "fc_norm": False, "norm_output": False, "embed_requires_grad": False,
        "target_hidden_size": None,
        "transformer_layer_config": layer_config(head, vocab_size, model.config.max_position_embeddings),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3, "accept_tolerance": 0.0,
                                  "verifier_accept_k": 1}],
            "verifier": {"name_or_path": verifier or str(Path(target.path).resolve()),
                         "architectures": target_config.get("architectures") or []},
        },
        # Not read by speculators; lets specdec check the target on import.
        "specdec": {"target": dataclasses.asdict(loaded.info.target), "training": loaded.info.training},
    }
    with building_directory(out_dir) as partial:
        save_file(tensors, str(partial / "model.safetensors"))
        (partial / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def _check_layer(layer: dict, where: str) -> None:
    refusals = []
    if layer.get("model_type", "llama") != "llama":
        refusals.append(f"a {layer.get('model_type')!r} decoder layer (ours is Llama's: no query/key norms)")
    if layer.get("num_hidden_layers", 1) != 1:
        refusals.append(f"{layer['num_hidden_layers']} decoder layers (ours has one)")
    if layer.get("attention_bias") or layer.get("mlp_bias"):
        refusals.append("biases in the decoder layer")
    if layer.get("hidden_act", "silu") != "silu":
        refusals.append(f"activation {layer['hidden_act']!r}")
    if refusals:
        raise InvalidParameterError(f"{where}: this EAGLE-3 head has {'; '.join(refusals)}, which specdec's "
                                    "EAGLE-3 head does not compute")


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    """model.safetensors, or the EAGLE repository's pytorch_model.bin (read as plain tensors only)."""
    try:
        if (path / "model.safetensors").is_file() or not (path / "pytorch_model.bin").is_file():
            return load_file(str(path / "model.safetensors"))
        return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    except (SafetensorError, OSError, RuntimeError, EOFError) as exc:
        raise CorruptModelError(f"{path}: the head's weights are unreadable ({exc})") from None


def load_speculators_head(path: Path, target) -> LoadedHead:
    """A speculators eagle3 checkpoint (or the EAGLE repository's layout) at `path`, checked against
    `target` (a LoadedModel)."""
    path = Path(path).expanduser()
    config, repository_layout = _read_head_config(path)
    layer = config.get("transformer_layer_config") or {}
    model = native_model(target.model)
    hidden, vocab_size = model.hidden_size, model.vocab_size
    recorded = _check_fits_target(path, config, layer, target, model)
    tensors = _read_weights(path)
    if repository_layout:
        tensors = {name.replace("midlayer.", "layers.0.", 1): value for name, value in tensors.items()}
    draft_vocab = _draft_vocabulary(path, tensors.pop("d2t", None), int(config.get("draft_vocab_size", 0)), vocab_size)
    # the EAGLE repository (and speculators without explicit ids) fuse the default low, middle, high layers
    ids = config.get("eagle_aux_hidden_state_layer_ids") or default_feature_layers(model.num_layers)
    shape = Eagle3Shape(int(layer.get("intermediate_size", 0)), tuple(ids), bool(config.get("norm_before_residual")))
    rope = rope_config(layer.get("rope_parameters") or {"rope_theta": layer.get("rope_theta", 10000.0)}, str(path))
    head_geometry = dict(num_heads=int(layer["num_attention_heads"]),
                         num_kv_heads=int(layer.get("num_key_value_heads", layer["num_attention_heads"])),
                         rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)), rope=rope)
    head_geometry["head_dim"] = int(layer.get("head_dim") or hidden // head_geometry["num_heads"])
    module = Eagle3Head(dataclasses.replace(model.config, **head_geometry), shape)
    lm_rows = tensors.pop("lm_head.weight", None)
    embeddings = tensors.pop("embed_tokens.weight", None)
    for ignored in ("t2d", "verifier_lm_head.weight", "verifier_norm.weight"):
        tensors.pop(ignored, None)
    state = {name.replace("layers.0.", "layer.", 1): value.float() for name, value in tensors.items()}
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CorruptModelError(f"{path}: weights do not match the head's config ({str(exc).splitlines()[0]})") from None
    verifier = (config.get("speculators_config") or {}).get("verifier") or {}
    info = HeadInfo("eagle3", target_identity(recorded, str(path)), recorded.get("name") or verifier.get("name_or_path"),
                    (config.get("specdec") or {}).get("training") or {})
    return LoadedHead(info, module.to(model.device).eval(), draft_vocab,
                      lm_rows=None if lm_rows is None else lm_rows.float(),
                      embeddings=None if embeddings is None else _own_embeddings(model, embeddings))


def _read_head_config(path: Path) -> tuple[dict, bool]:
    """(the checkpoint's config in speculators' form, whether it came in the EAGLE repository's layout)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CorruptModelError(f"{path}/config.json: unreadable ({exc})") from None
    repository_layout = "speculators_model_type" not in config
    if repository_layout:  # the EAGLE repository's config is the layer's own Llama config
        config = {"speculators_model_type": "eagle3", "draft_vocab_size": config.get("draft_vocab_size"),
                  "transformer_layer_config": {**config, "model_type": "llama"}}
    kind = config.get("speculators_model_type")
    if kind != "eagle3":
        raise InvalidParameterError(f"{path}: a speculators {kind!r} checkpoint; specdec drafts with eagle3 ones")
    for option, meaning in UNSUPPORTED_OPTIONS.items():
        if config.get(option):
            raise InvalidParameterError(f"{path}: {option} ({meaning}) is not supported by specdec's EAGLE-3 head")
    return config, repository_layout


def _check_fits_target(path: Path, config: dict, layer: dict, target, model) -> dict:
    """InvalidParameterError unless the head's layer, width, vocabulary and tokenizer fit `target`; returns
    the target the checkpoint records (specdec's own metadata), if any. `model`: the target's native model."""
    _check_layer(layer, str(path))
    hidden, vocab_size = model.hidden_size, model.vocab_size
    if layer.get("hidden_size") != hidden or layer.get("vocab_size", vocab_size) != vocab_size:
        raise InvalidParameterError(
            f"{path}: this head was made for hidden size {layer.get('hidden_size')} and vocabulary "
            f"{layer.get('vocab_size')}; {target.name!r} has {hidden} and {vocab_size}")
    recorded = (config.get("specdec") or {}).get("target") or {}
    if recorded.get("tokenizer_sha256") not in (None, tokenizer_sha256(target.tokenizer)):
        raise InvalidParameterError(f"{path}: this head was made for {recorded.get('name')!r}, whose tokenizer "
                                    f"differs from {target.name!r}'s")
    return recorded


def _draft_vocabulary(path: Path, d2t: torch.Tensor | None, count: int, vocab_size: int) -> torch.Tensor:
    """The target token id of each of the head's `count` rows (speculators' d2t holds offsets)."""
    if d2t is None:  # a head scoring the whole vocabulary
        d2t = torch.zeros(vocab_size, dtype=torch.int64)
    if d2t.shape[0] != count:
        raise CorruptModelError(f"{path}: d2t has {d2t.shape[0]} entries, draft_vocab_size is {count}")
    draft_vocab = d2t.to(torch.int64) + torch.arange(count)
    if count and (int(draft_vocab.min()) < 0 or int(draft_vocab.max()) >= vocab_size):
        raise CorruptModelError(f"{path}: d2t maps outside the target's vocabulary of {vocab_size}")
    return draft_vocab


def _own_embeddings(model, embeddings: torch.Tensor) -> torch.Tensor | None:
    """A head trained with frozen target embeddings carries a copy of them: None then, to use the target's own
    (no second table in memory). One trained with its own embeddings keeps them, in bfloat16 as stored."""
    vocab_size, hidden = model.vocab_size, model.hidden_size
    with torch.no_grad():
        probe = torch.arange(0, vocab_size, max(1, vocab_size // 512))
        ours = embed(model, probe.unsqueeze(0).to(model.device))[0].cpu()
    theirs = embeddings[probe].float()
    if embeddings.shape == (vocab_size, hidden) and torch.allclose(theirs, ours, rtol=1e-2, atol=1e-3):
        return None
    return embeddings.to(torch.bfloat16).to(model.device)  # as stored: half float32's memory
