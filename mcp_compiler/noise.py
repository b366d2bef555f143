"""Random ops pinned for a comparison: the same noise in the original and the converted model.

A model with RandomNormal[Like], RandomUniform[Like], Multinomial, Bernoulli or Dropout in training
mode gives other outputs on every run, so verify (and the quantization accuracy report) would
compare two draws of noise. For the check only, every such node gets the same `seed` attribute in
both models: onnxruntime then starts each node's generator from that seed, so a node draws the
same numbers in both sessions (the node's own stream, whatever the order the nodes run in). The
served model is not changed: it keeps its randomness.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                        "Multinomial", "Bernoulli"})
SEED = 20261204.0


def _random(op: str, inputs: list) -> bool:
    # Dropout draws only in training mode (a third input, training_mode, given)
    return op in RANDOM_OPS or (op == "Dropout" and len(inputs) > 2 and inputs[2] is not None and inputs[2] != "")


# -- ONNX protobufs (the original, an emitted model.onnx) ----------------------------------------------

def _onnx_nodes(graph: Any) -> Iterator[Any]:
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.HasField("g"):
                yield from _onnx_nodes(a.g)
            for g in a.graphs:
                yield from _onnx_nodes(g)


def pin_onnx(proto: Any) -> int:
    """Give every random node of `proto` (a ModelProto, subgraphs included) the seed; how many."""
    import onnx

    count = 0
    for n in _onnx_nodes(proto.graph):
        if n.domain in ("", "ai.onnx") and _random(n.op_type, list(n.input)):
            for a in list(n.attribute):
                if a.name == "seed":
                    n.attribute.remove(a)
            n.attribute.append(onnx.helper.make_attribute("seed", SEED))
            count += 1
    return count


def pinned_onnx_session(path: Any, options: Any) -> tuple[Any, int]:
    """An onnxruntime session of the ONNX file with its random nodes seeded, and how many there
    were; (None, 0) when it has none or keeps its weights in external files (left as it is)."""
    import onnx
    import onnxruntime as ort

    proto = onnx.load(str(path), load_external_data=False)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer):
        return None, 0
    count = pin_onnx(proto)
    if not count:
        return None, 0
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"]), count


# -- the IR (an .mcpir, a quantized model in memory) ------------------------------------------------

def random_nodes(model: Any) -> list:
    """The random nodes of an IR Model, subgraphs included."""
    return [n for g in model.graph.graphs() for n in g.nodes if n.is_onnx() and _random(n.op_type, list(n.inputs))]


def pin_ir(model: Any) -> list:
    """Give every random node of an IR Model the seed (in place); returns what `unpin_ir` needs to
    put the model back as it was (its length: how many nodes)."""
    from .ir import Attribute, AttrType

    undo = []
    for n in random_nodes(model):
        undo.append((n, n.attributes.get("seed")))
        n.attributes["seed"] = Attribute("seed", AttrType.FLOAT, SEED)
    return undo


def unpin_ir(undo: list) -> None:
    for n, before in undo:
        if before is None:
            n.attributes.pop("seed", None)
        else:
            n.attributes["seed"] = before
