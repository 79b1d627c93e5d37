"""A GGUF file's matrices as the layers a model packs (`--weights gguf`): each projection on the file's own
blocks (GgufLinear) or float panels of its own type, fused projections stacked, projections the file stores
fused (Phi-3) kept as one layer, a mixture's experts one layer each from their 3-D tensors. Layers come one
at a time and the file's pages are released as they are read, so a first load can stream them into the
packed cache (models/sources/native_load.py: load_native_gguf).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

import gguf
import numpy as np
import torch

from specdec.kernels import INTEGER_COLUMNS
from specdec.models.fused_checkpoints import fused_split_sizes, qkv_row_order
from specdec.models.quantized.gguf_blocks import FLOAT_FORMATS, SUPPORTED_FORMATS, BlockWeights, concatenate, decode
from specdec.models.quantized.gguf_linear import GgufLinear
from specdec.models.quantized.packed_linear import PackedLinear
from specdec.models.sources.gguf_convert import gguf_field, hf_tensor_name, read_gguf, unpermute_llama_qk

if TYPE_CHECKING:
    from specdec.models.config import ModelConfig

# Rows of a vocabulary-sized matrix decoded and packed at once (GgufMatrices._large_matrix); a multiple of 8.
ROWS_AT_ONCE = 8192
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "o_proj": ("o_proj",), "gate_up_proj": ("gate_proj", "up_proj"),
          "down_proj": ("down_proj",)}


class GgufMatrices:
    """A GGUF file's matrices as layers on their own values: block-quantized matrices as GgufLinear (their
    blocks as they are), F16, BF16 and F32 ones as PackedLinear panels of their own type. Opening the file
    checks every matrix's type and raises ValueError naming one the kernels do not multiply, before any
    matrix is read; each layer is decoded when asked for (one layer's codes in memory at a time)."""

    def __init__(self, gguf_path: Path, config: "ModelConfig | None" = None):
        """`config`: the model's, needed where the file stores projections fused (Phi-3) to split them."""
        self.config = config

        reader = read_gguf(gguf_path)
        self.arch = gguf_field(reader, "general.architecture")
        heads = gguf_field(reader, f"{self.arch}.attention.head_count")
        kv_heads = gguf_field(reader, f"{self.arch}.attention.head_count_kv", heads)
        self.tensors = {}  # Hugging Face name -> (GGUF tensor, heads of llama.cpp's q/k row order to undo or None)
        for tensor in reader.tensors:
            name = hf_tensor_name(tensor.name, self.arch)
            if name is None or not (name.endswith("proj.weight") or name.endswith("proj.bias") or ".experts." in name
                                    or name.endswith(".mlp.gate.weight") or name.endswith(".mlp.gate.bias")
                                    or name in ("lm_head.weight", "model.embed_tokens.weight")):
                continue
            kind = tensor.tensor_type.name
            if name.endswith(".weight") and kind not in SUPPORTED_FORMATS and kind not in FLOAT_FORMATS:
                raise ValueError(f"tensor {tensor.name} is {kind}, which the CPU kernels do not multiply (they take "
                                 f"{', '.join(SUPPORTED_FORMATS + tuple(FLOAT_FORMATS))})")
            permute = None
            if self.arch == "llama" and ".attn_q." in tensor.name:
                permute = heads
            elif self.arch == "llama" and ".attn_k." in tensor.name:
                permute = kv_heads
            self.tensors[name] = (tensor, permute)

    @property
    def tied(self) -> bool:
        """Whether the LM head is the token embeddings (no output matrix of its own)."""
        return "lm_head.weight" not in self.tensors

    def _blocks(self, name: str, first: int = 0, stop: int | None = None) -> BlockWeights:
        """Rows first..stop of a block matrix (all of them by default), decoded."""
        tensor, permute = self.tensors[name]
        cols, rows = int(tensor.shape[0]), int(tensor.shape[1])
        if (first, stop) != (0, None):
            assert not permute, "llama's q/k rows are reordered over the whole matrix"
            stop = min(rows, stop)
            return decode(tensor.data[first:stop], tensor.tensor_type.name, stop - first, cols)
        weights = decode(tensor.data, tensor.tensor_type.name, rows, cols)
        if permute:  # rows are independent, so moving whole rows is exact
            weights = weights.rows(torch.from_numpy(np.ascontiguousarray(unpermute_llama_qk(np.arange(rows), permute))))
        return weights

    def _floats(self, name: str) -> torch.Tensor:
        """(N, K) float32: the file's float values, exactly."""
        tensor, permute = self.tensors[name]
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        values = np.asarray(values, dtype=np.float32).reshape(int(tensor.shape[1]), int(tensor.shape[0]))
        return torch.from_numpy(np.array(unpermute_llama_qk(values, permute) if permute else values, order="C"))

    def _bias(self, name: str) -> torch.Tensor | None:
        if name not in self.tensors:
            return None
        tensor, permute = self.tensors[name]
        values = np.asarray(tensor.data, dtype=np.float32)
        return torch.from_numpy(np.array(unpermute_llama_qk(values, permute) if permute else values))

    def layer(self, names: Sequence[str], biases: Sequence[str] = ()) -> PackedLinear:
        """One layer of the matrices `names` stacked (fused projections), in their own format."""
        kinds = {self.tensors[name][0].tensor_type.name for name in names}
        if (len(names) == 1 and not biases and not kinds & set(FLOAT_FORMATS) and not self.tensors[names[0]][1]
                and self.tensors[names[0]][0].shape[1] > ROWS_AT_ONCE):
            return self._large_matrix(names[0])
        part_biases = [self._bias(name) for name in biases] if biases else [None] * len(names)
        where = names[0].rsplit(".", 2)[0]
        if kinds & set(FLOAT_FORMATS) and len(kinds) > 1:
            raise ValueError(f"the matrices of {where} mix {', '.join(sorted(kinds))}")
        float_kind = FLOAT_FORMATS.get(next(iter(kinds)))
        members = [self._floats(name) if float_kind else self._blocks(name) for name in names]
        joined = None if all(b is None for b in part_biases) else torch.cat(
            [b if b is not None else torch.zeros(m.shape[0]) for b, m in zip(part_biases, members)])
        sizes = [m.shape[0] for m in members]
        for name in (*names, *biases):  # decoded: the file's pages are not needed again (see drop_pages)
            if name in self.tensors:
                self.tensors[name][0].drop_pages()
        if float_kind:
            return PackedLinear(torch.cat(members), joined, sizes).quantize_(float_kind)
        return GgufLinear(concatenate(members), joined, sizes)

    def _large_matrix(self, name: str) -> GgufLinear:
        """One big block matrix (a vocabulary-sized LM head or embedding table) decoded and packed a run of rows
        at a time into buffers allocated once: decoding a whole one holds several bytes per weight at once,
        more than the rest of a small model's load. The column blocks of 8 rows are independent, so the
        pieces are exactly the whole's."""
        tensor, _ = self.tensors[name]
        rows = int(tensor.shape[1])
        buffers, form = {}, None
        for first in range(0, rows, ROWS_AT_ONCE):
            piece = GgufLinear(self._blocks(name, first, first + ROWS_AT_ONCE), None, [])
            start = first // INTEGER_COLUMNS
            for key in ("packed", "scales", "super_scales"):
                part = getattr(piece, key)
                if key not in buffers:
                    blocks = (rows + INTEGER_COLUMNS - 1) // INTEGER_COLUMNS
                    buffers[key] = torch.empty((blocks, *part.shape[1:]), dtype=part.dtype)
                buffers[key][start:start + part.shape[0]] = part
            form = piece.block_form
            tensor.drop_pages(first, first + ROWS_AT_ONCE)
        return GgufLinear.from_buffers(buffers["packed"], buffers["scales"], None, rows, int(tensor.shape[0]), [rows],
                                       form, buffers["super_scales"])

    def _stored_fused(self, fused: str, prefix: str) -> PackedLinear:
        """A projection the file stores fused (FUSED_PROJECTIONS' `fused`) as one layer: its parts' sizes, and
        under partial rotary its query/key rows in the order the rope tables expect."""
        if self.config is None:
            raise ValueError(f"{prefix} is stored fused: splitting it needs the model's config")
        name = f"{prefix}.{fused.split('.')[1]}.weight"
        order = qkv_row_order(self.config) if fused == "self_attn.qkv_proj" else None
        sizes = fused_split_sizes(self.config, fused)
        float_kind = FLOAT_FORMATS.get(self.tensors[name][0].tensor_type.name)
        if float_kind:
            values = self._floats(name)
            layer = PackedLinear(values if order is None else values[order], None, sizes).quantize_(float_kind)
        else:
            weights = self._blocks(name)
            layer = GgufLinear(weights if order is None else weights.rows(order), None, sizes)
        self.tensors[name][0].drop_pages()
        return layer

    def most_layers(self) -> int:
        """At least as many as `layers()` yields, without reading a matrix: one a matrix, one an expert."""
        return sum(int(tensor.shape[2]) if len(tensor.shape) == 3 else 1 for tensor, _ in self.tensors.values())

    def _experts(self, prefix: str) -> Iterator[tuple[str, PackedLinear]]:
        """A mixture's layers (MixtureOfExperts.pack_projections' names): the router, then each expert's
        gate/up and down from the file's (experts, rows, inputs) tensors, one expert's matrices at a time
        (with their rows of the (experts, rows) biases where the file has them: gpt-oss)."""
        yield f"{prefix}.gate", self.layer([f"{prefix}.gate.weight"], [f"{prefix}.gate.bias"])
        gate, up, down = (f"{prefix}.experts.{kind}" for kind in ("gate_proj", "up_proj", "down_proj"))
        for expert in range(int(self.tensors[down][0].shape[2])):
            yield f"{prefix}.experts.{expert}.gate_up_proj", self._expert_layer([gate, up], expert)
            yield f"{prefix}.experts.{expert}.down_proj", self._expert_layer([down], expert)
        for name in (gate, up, down):
            self.tensors[name][0].drop_pages()

    def _expert_bias(self, name: str, expert: int, rows: int) -> torch.Tensor | None:
        """Expert `expert`'s row of the (experts, rows) bias of the expert tensor `name`, or None."""
        bias = self.tensors.get(f"{name}_bias")
        if bias is None:
            return None
        return torch.from_numpy(np.asarray(bias[0].data, dtype=np.float32).reshape(-1, rows)[expert].copy())

    def _expert_layer(self, names: Sequence[str], expert: int) -> PackedLinear:
        """One expert's slice of the (experts, rows, inputs) tensors `names`, stacked into one layer."""
        tensors = [self.tensors[name][0] for name in names]
        kinds = {tensor.tensor_type.name for tensor in tensors}
        float_kind = FLOAT_FORMATS.get(next(iter(kinds)))
        if kinds & set(FLOAT_FORMATS) and len(kinds) > 1:
            raise ValueError(f"the experts of {names[0]} mix {', '.join(sorted(kinds))}")
        members = []
        for tensor in tensors:
            cols, rows = int(tensor.shape[0]), int(tensor.shape[1])
            if float_kind:
                values = gguf.quants.dequantize(tensor.data[expert], tensor.tensor_type)
                members.append(torch.from_numpy(np.asarray(values, dtype=np.float32).reshape(rows, cols).copy()))
            else:
                members.append(decode(tensor.data[expert], tensor.tensor_type.name, rows, cols))
        sizes = [m.shape[0] for m in members]
        biases = [self._expert_bias(name, expert, size) for name, size in zip(names, sizes)]
        bias = None if all(b is None for b in biases) else torch.cat(
            [b if b is not None else torch.zeros(size) for b, size in zip(biases, sizes)])
        if float_kind:
            return PackedLinear(torch.cat(members), bias, sizes).quantize_(float_kind)
        return GgufLinear(concatenate(members), bias, sizes)

    def embedding_table(self) -> PackedLinear:
        """The token embeddings as a layer whose rows are looked up (PackedEmbedding): the file's values."""
        return self.layer(["model.embed_tokens.weight"])

    def layers(self) -> Iterator[tuple[str, PackedLinear]]:
        """(packed layer name as LlamaForCausalLM.pack_weights names them, layer), one layer at a time: every
        layer's projections, the LM head (the token embeddings where they are tied), and
        `model.embed_tokens.table` where the embeddings are untied. Each layer's file pages are released once
        it is built, so a caller that keeps no layer holds one layer's worth of the file at a time."""
        count = 1 + max(int(name.split(".")[2]) for name in self.tensors if name.startswith("model.layers."))
        for index in range(count):
            if f"model.layers.{index}.mlp.experts.down_proj" in self.tensors:  # a mixture of experts' layer
                yield from self._experts(f"model.layers.{index}.mlp")
            for fused_name, parts in _FUSED.items():
                block = "self_attn" if fused_name in ("qkv_proj", "o_proj") else "mlp"
                prefix = f"model.layers.{index}.{block}"
                if block == "mlp" and f"{prefix}.experts.down_proj" in self.tensors:
                    continue
                if len(parts) > 1 and f"{prefix}.{fused_name}.weight" in self.tensors:  # stored fused (Phi-3)
                    yield f"{prefix}.{fused_name}", self._stored_fused(f"{block}.{fused_name}", prefix)
                    continue
                yield f"{prefix}.{fused_name}", self.layer([f"{prefix}.{part}.weight" for part in parts],
                                                           [f"{prefix}.{part}.bias" for part in parts])
        if self.tied:
            yield "lm_head", self.embedding_table()
        else:
            yield "lm_head", self.layer(["lm_head.weight"])
            yield "model.embed_tokens.table", self.embedding_table()
