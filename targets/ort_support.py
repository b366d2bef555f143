"""Which (op, opset, dtypes) onnxruntime has CPU kernels for: probed from onnxruntime itself.

A key is `domain:op:since_version:input dtypes->output dtypes` (the schema version the node
resolves to at the model's opset, and the element types of its inputs and outputs). The answer
comes from the table committed beside this module (`ort_support.json`, built by probing this
onnxruntime with one-node models: `python -m mcp_compiler.targets.ort_support --build`), or
else from a live probe, remembered for the process. A probe creates an onnxruntime session for a
model holding just that node: "no kernel" errors mean unsupported; other failures (shape errors
of the one-node model, say) mean the probe cannot tell, and the node is taken as supported.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from functools import lru_cache
from pathlib import Path

import onnx
import onnxruntime

TABLE = Path(__file__).with_name("ort_support.json")
_NO_KERNEL = ("NOT_IMPLEMENTED", "Could not find an implementation", "is not a registered function/op",
              "Failed to find kernel")


def dtype_name(elem_type: int | None) -> str:
    return "" if not elem_type else onnx.TensorProto.DataType.Name(elem_type).lower()


@lru_cache(maxsize=None)
def since_version(domain: str, op: str, opset: int) -> int | None:
    """The version of op's schema a model importing `opset` for `domain` uses (None: unknown op)."""
    try:
        return onnx.defs.get_schema(op, opset, domain).since_version
    except onnx.defs.SchemaError:
        return None


def key(domain: str, op: str, version: int, inputs: list[int | None], outputs: list[int | None]) -> str:
    return (f"{domain or 'ai.onnx'}:{op}:{version}:"
            f"{','.join(map(dtype_name, inputs))}->{','.join(map(dtype_name, outputs))}")


class SupportTable:
    """onnxruntime's kernels by key: the committed table first, live probes for the rest."""

    def __init__(self, path: Path = TABLE) -> None:
        self.runtime = f"onnxruntime {onnxruntime.__version__}"
        self.kernels: dict[str, bool] = {}
        self.max_opset = onnx.defs.onnx_opset_version()
        self.probed = 0
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        if data.get("runtime") == self.runtime:   # a table for another onnxruntime is not used
            self.kernels = dict(data.get("kernels", {}))
            self.max_opset = int(data.get("max_opset", self.max_opset))

    def supports(self, node: onnx.NodeProto, inputs: list[onnx.TypeProto | None],
                 outputs: list[onnx.TypeProto | None], opsets: dict[str, int],
                 constants: dict[str, onnx.TensorProto] | None = None) -> bool | None:
        """True/False when known; None when the node cannot be probed (untyped values, subgraphs).

        `inputs`/`outputs` are the types of node.input/node.output, position for position
        (anything for an omitted optional one, named "")."""
        version = since_version(node.domain, node.op_type, opsets.get(node.domain, 1))
        if version is None or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                  for a in node.attribute):
            return None
        present = [t for name, t in zip(node.input, inputs) if name] + \
                  [t for name, t in zip(node.output, outputs) if name]
        if any(t is None or not t.HasField("tensor_type") for t in present):
            return None
        elem = lambda names, ts: [t.tensor_type.elem_type if name else 0 for name, t in zip(names, ts)]  # noqa: E731
        k = key(node.domain, node.op_type, version, elem(node.input, inputs), elem(node.output, outputs))
        if k not in self.kernels:
            result = probe(node, inputs, outputs, opsets, constants or {})
            self.probed += 1
            if result is None:
                return None
            self.kernels[k] = result
        return self.kernels[k]


def probe(node: onnx.NodeProto, inputs: list[onnx.TypeProto], outputs: list[onnx.TypeProto],
          opsets: dict[str, int], constants: dict[str, onnx.TensorProto]) -> bool | None:
    """Create an onnxruntime session for a model of just `node`: does a kernel exist?"""
    from onnx import helper

    n = onnx.NodeProto()
    n.CopyFrom(node)
    del n.input[:]
    del n.output[:]
    graph_inputs, inits = [], []
    for i, (name, t) in enumerate(zip(node.input, inputs)):
        if not name:
            n.input.append("")
            continue
        local = f"i{i}"
        n.input.append(local)
        if name in constants:   # shape-like inputs (Reshape's shape, TopK's k) stay constants
            c = onnx.TensorProto()
            c.CopyFrom(constants[name])
            c.name = local
            inits.append(c)
        else:
            vi = onnx.ValueInfoProto(name=local)
            vi.type.CopyFrom(t)
            graph_inputs.append(vi)
    graph_outputs = []
    for i, (name, t) in enumerate(zip(node.output, outputs)):
        local = f"o{i}" if name else ""
        n.output.append(local)
        if name:
            vi = onnx.ValueInfoProto(name=local)
            vi.type.CopyFrom(t)
            graph_outputs.append(vi)
    g = helper.make_graph([n], "probe", graph_inputs, graph_outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    so = onnxruntime.SessionOptions()
    so.log_severity_level = 4
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        onnxruntime.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime's exception types are not importable alike
        text = str(e)
        return False if any(s in text for s in _NO_KERNEL) else None
    return True


def _max_opset() -> int:
    """The newest ai.onnx opset onnxruntime loads a model of (Relu on float) at."""
    from onnx import TensorProto, helper

    for v in range(onnx.defs.onnx_opset_version(), 6, -1):
        g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", v)])
        so = onnxruntime.SessionOptions()
        so.log_severity_level = 4
        try:
            onnxruntime.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
            return v
        except Exception:  # noqa: BLE001
            continue
    return 7


def _versions(domain: str, op: str, newest: int) -> list[int]:
    """Every since_version of op's schema up to opset `newest`."""
    return sorted({v for v in (since_version(domain, op, o) for o in range(1, newest + 1)) if v is not None})


def build(path: Path = TABLE, models: list[Path] = ()) -> dict:
    """Probe every node of the ONNX node conformance cases and of `models` (with their types),
    at its model's opset and at each earlier version of its schema (models of older opsets use
    the same ops with the same types: a key missing from the table costs a live probe, some
    4 ms, on every conversion), and write the table."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [c.model for c in collect_testcases(None)]
    cases += [onnx.load(p, load_external_data=False) for p in models]
    table = SupportTable(Path("/nonexistent"))
    table.max_opset = _max_opset()
    for model in cases:
        m = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        types = {vi.name: vi.type for vi in [*m.graph.input, *m.graph.output, *m.graph.value_info]}
        consts = {t.name: t for t in m.graph.initializer}
        opsets = {o.domain: o.version for o in m.opset_import}
        for n in m.graph.node:
            ins, outs = [types.get(i) for i in n.input], [types.get(o) for o in n.output]
            table.supports(n, ins, outs, opsets, consts)
            if n.domain in ("", "ai.onnx"):
                for v in _versions(n.domain, n.op_type, min(opsets.get(n.domain, 1), table.max_opset)):
                    table.supports(n, ins, outs, {**opsets, n.domain: v}, consts)
    data = {"runtime": table.runtime, "max_opset": table.max_opset,
            "source": "one-node probes of the nodes of onnx's node conformance cases "
                      f"(onnx {onnx.__version__}) and {len(models)} more models",
            "kernels": dict(sorted(table.kernels.items()))}
    path.write_text(json.dumps(data, indent=0, sort_keys=False) + "\n")
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="store_true", help=f"probe and write {TABLE.name}")
    ap.add_argument("models", nargs="*", type=Path, help="more .onnx models whose nodes to probe")
    args = ap.parse_args(argv)
    if args.build:
        data = build(models=args.models)
        k = data["kernels"]
        print(f"{TABLE}: {data['runtime']}, max opset {data['max_opset']}, {len(k)} keys, "
              f"{sum(not v for v in k.values())} without a kernel")
    return 0


if __name__ == "__main__":
    sys.exit(main())
