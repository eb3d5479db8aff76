"""Writing and quantizing the ONNX graphs of the models satchel derives (mpnet, e5)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

OPSET = 17
IR_VERSION = 8


def save_graph(graph: onnx.GraphProto, doc_string: str, out: Path) -> None:
    """Wrap `graph` in a model (opset OPSET, IR version IR_VERSION), check it, write it."""
    import onnx
    from onnx import helper

    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="satchel",
        doc_string=doc_string,
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    onnx.save(model, str(out))


def quantize_int8(float_graph: Path, out: Path, **options: Any) -> None:
    """onnxruntime's `quantize_dynamic` with int8 weights per output channel, plus `options`
    (such as `reduce_range`, `nodes_to_exclude`); its advice to "pre-process" the graph, logged
    on the root logger, is silenced."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        quantize_dynamic(float_graph, out, weight_type=QuantType.QInt8, per_channel=True, **options)
    finally:
        root.setLevel(level)
