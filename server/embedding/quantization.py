"""Dynamic int8 quantization of a float ONNX graph, shared by the models satchel derives."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any


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
