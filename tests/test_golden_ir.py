"""Golden IR dumps: the golden models' IR as imported, after normalization, and after the whole
triton-v1.12 pipeline, one line per node (`mcp-cli convert --print-ir-after`'s format).

A change in what a pass does shows up as a diff of golden_models/<name>/ir/*.txt in review.
`pytest tests/test_golden_ir.py --update-golden` rewrites them; nobody edits them by hand.
"""

from __future__ import annotations

import pytest
from _helpers import golden_dirs

from mcp_compiler.frontend import load_onnx
from mcp_compiler.ir.printer import print_model
from mcp_compiler.options import PipelineOptions
from mcp_compiler.passes._infra import PrintIR
from mcp_compiler.pipeline import build
from mcp_compiler.targets import get_target


def _phases(path) -> dict[str, str]:
    """import, normalized (after the first infer-shapes: folding, cleanup), final."""
    model = load_onnx(path).model
    out = {"import": print_model(model)}
    dumps: list[str] = []
    pm = build(get_target("triton-v1.12"), PipelineOptions())
    pm.instruments.append(PrintIR({"infer-shapes"}, sink=lambda name, text: dumps.append(text.split("\n", 1)[1])))
    pm.run(model)
    out["normalized"], out["final"] = dumps[0], print_model(model)
    return out


@pytest.mark.parametrize("folder", golden_dirs(), ids=lambda p: p.name)
def test_golden_ir(folder, update_golden):
    got = _phases(folder / "model.onnx")
    ir = folder / "ir"
    if update_golden:
        ir.mkdir(exist_ok=True)
        for phase, text in got.items():
            (ir / f"{phase}.txt").write_text(text)
    for phase, text in got.items():
        want = ir / f"{phase}.txt"
        assert want.is_file(), f"{want} is missing: run pytest {__file__} --update-golden"
        assert text == want.read_text(), f"{folder.name}: the IR {phase} changed; if that is intended, " \
                                         "rerun with --update-golden and review the diff"


@pytest.mark.parametrize("folder", golden_dirs(), ids=lambda p: p.name)
def test_printed_ir_reads_back(folder):
    """print -> parse -> print is the same text, for every phase's dump (weights of more than 8
    elements are printed without values: they read back as zeros)."""
    from mcp_compiler.ir.parser import parse_model

    for phase in ("import", "normalized", "final"):
        text = (folder / "ir" / f"{phase}.txt").read_text()
        assert print_model(parse_model(text, missing_weights="zeros")) == text, f"{folder.name} {phase}"


@pytest.mark.parametrize("text,message", [
    ("", "no IR"),
    ("model (opsets ai.onnx:17)\ngraph g(%x: float[2])\n  %y: float[2] = Relu(%z)\n  return %y\n",
     "line 3: %z is used before it is defined"),
    ("model (opsets ai.onnx:17)\ngraph g(%x: float[2])\n  weight %w: float[2]\n  return %x\n",
     "line 3: weight w has no values"),
    ("model (opsets ai.onnx:17)\ngraph g(%x: floaty[2])\n  return %x\n", "line 2: unknown element type 'floaty'"),
    ("model (opsets ai.onnx:17)\ngraph g(%x: float[2])\n  %y: float[2] = Relu(%x)\n", "has no return"),
    ("model (opsets ai.onnx:17)\ngraph g(%x: float[2])\n  weight %w: float[3] = [1.0, 2.0]\n  return %x\n",
     "line 3: weight w has 2 values for shape [3]"),
])
def test_ir_parse_errors_name_the_line(text, message):
    from mcp_compiler.ir.parser import IRSyntaxError, parse_model

    with pytest.raises(IRSyntaxError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_model(text)
