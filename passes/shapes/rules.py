"""Shape rules of the ONNX ops: output shapes (and the values of small integer tensors) from inputs.

A rule gets a Site (the node, its inputs' shapes and known integer values) and returns one shape
per output, a tuple of dims, or None where it cannot tell; unknown dims inside a shape are None.
`VALUE_RULES` track the contents of shape tensors (Shape -> Gather -> Concat -> Reshape), which is
how a batch symbol survives a Reshape whose target is computed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from mcp_compiler.ir import Attribute, Node, TensorType
from mcp_compiler.ir.dims import Dim

from . import algebra as A

Shape = tuple[Dim, ...]
BIG = 1 << 29   # Slice ends at or above this mean "to the end": past any real dim (INT_MAX, 1e9 from tf2onnx)


class Site:
    """One node under inference, with what is known of its inputs."""

    def __init__(self, node: Node, shapes: list[Shape | None], values: list[tuple | None],
                 opset: int, facts: Facts) -> None:
        self.node, self.shapes, self.values, self.opset, self.facts = node, shapes, values, opset, facts

    def attr(self, name: str, default=None):  # noqa: ANN001, ANN201
        a: Attribute | None = self.node.attributes.get(name)
        if a is None:
            return default
        v = a.value
        return v.decode() if isinstance(v, bytes) else v

    def shape(self, i: int) -> Shape | None:
        return self.shapes[i] if i < len(self.shapes) else None

    def ints(self, i: int) -> list[int] | None:
        """Input i's contents when it is a known list of plain integers."""
        v = self.values[i] if i < len(self.values) else None
        if v is None or not all(isinstance(d, int) for d in v):
            return None
        return list(v)

    def floats(self, i: int) -> list[float] | None:
        """Input i's contents when it is a small constant (initializer or Constant node)."""
        ins = self.node._inputs
        inp = ins[i] if i < len(ins) else None
        t = None if inp is None else inp.const
        if inp is not None and t is None and inp.producer is not None and inp.producer.op_type == "Constant":
            a = inp.producer.attributes.get("value")
            t = a.value if a is not None and hasattr(a.value, "dims") else None
        if t is None or t.numel > 64:
            return None
        try:
            return [float(x) for x in t.numpy().reshape(-1)]
        except (TypeError, ValueError):
            return None

    def has(self, i: int) -> bool:
        ins = self.node._inputs   # (the list itself: Node.inputs makes a tuple per call)
        return i < len(ins) and ins[i] is not None

    def rank(self, i: int = 0) -> int | None:
        s = self.shape(i)
        return None if s is None else len(s)


class Facts:
    """What inference learned on the way: conflicts (the model cannot run as declared) and
    assumptions (two dims taken as equal because the op needs them equal)."""

    def __init__(self) -> None:
        self.conflicts: list[str] = []
        self.assumptions: dict[str, None] = {}
        # What the op needs of the input sizes, as (lhs, op, rhs, where) with op "==", ">" or
        # ">=": equal dims, a reflect Pad's dim above its pad, a window no larger than its input.
        # mcp_compiler.inputs solves them to choose sizes the model accepts.
        self.requires: list[tuple[Dim, str, Dim, str]] = []

    def require(self, site: Site, lhs: Dim, op: str, rhs: Dim, what: str) -> None:
        if lhs is None or rhs is None or (isinstance(lhs, int) and isinstance(rhs, int)):
            return
        self.requires.append((lhs, op, rhs, f"{site.node.op_type} {site.node.name!r}: {what}"))

    def unify(self, site: Site, dims: Sequence[Dim], what: str) -> Dim:
        """Dims an op needs equal (broadcast where not 1, contraction, concat side): the one
        value they must share, a conflict when two constants differ."""
        known = [d for d in dims if d is not None]
        if len(known) < len(dims) and not known:
            return None
        consts = sorted({d for d in known if isinstance(d, int)})
        if len(consts) > 1:
            self.conflicts.append(f"{site.node.op_type} node {site.node.name!r}: {what} "
                                  f"{' vs '.join(map(str, consts))}")
            return consts[0]
        if consts:
            for d in known:   # a symbolic dim an op needs equal to a constant is that constant
                if not isinstance(d, int):
                    self.require(site, d, "==", consts[0], what)
            return consts[0]
        first = known[0]
        for d in known[1:]:
            if d != first:
                self.assumptions.setdefault(f"{first} == {d} ({site.node.op_type} {site.node.name!r})")
                self.require(site, first, "==", d, what)
        return first if len(known) == len(dims) else None


def broadcast(site: Site, shapes: Sequence[Shape | None]) -> Shape | None:
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(rank):
        dims = [s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0]
        real = [d for d in dims if d != 1]
        # one dim not 1 on the axis (the usual case) is what unify would give back
        out.append(1 if not real else real[0] if len(real) == 1 else
                   site.facts.unify(site, real, f"broadcast axis {axis}"))
    return tuple(out)


def _axis(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


def same(site: Site) -> list:
    return [site.shape(0)] * len(site.node.outputs)


def elementwise(site: Site) -> list:
    return [broadcast(site, [s for v, s in zip(site.node._inputs, site.shapes) if v is not None])]


def _window(site: Site, spatial: Sequence[Dim], kernel: Sequence[int], transposed: bool = False) -> list[Dim]:
    n = len(kernel)
    strides = site.attr("strides") or [1] * n
    dil = site.attr("dilations") or [1] * n
    pads = site.attr("pads") or [0] * (2 * n)
    auto = site.attr("auto_pad", "NOTSET")
    ceil = bool(site.attr("ceil_mode", 0))
    out = []
    for i, d in enumerate(spatial):
        eff = dil[i] * (kernel[i] - 1) + 1
        if transposed:
            if auto in ("SAME_UPPER", "SAME_LOWER"):
                out.append(A.mul(d, strides[i]))
                continue
            opad = (site.attr("output_padding") or [0] * n)[i]
            total = 0 if auto == "VALID" else pads[i] + pads[i + n]
            out.append(A.add(A.mul(A.sub(d, 1), strides[i]), opad + eff - total))
        elif auto in ("SAME_UPPER", "SAME_LOWER"):
            out.append(A.ceil_div(d, strides[i]))
        else:
            total = 0 if auto == "VALID" else pads[i] + pads[i + n]
            site.facts.require(site, A.add(d, total), ">=", eff, f"window of {eff} on spatial axis {i}")
            span = A.add(d, total - eff)
            out.append(A.add((A.ceil_div if ceil else A.floor_div)(span, strides[i]), 1))
    return out


def conv(site: Site) -> list:
    x, w = site.shape(0), site.shape(1)
    if x is None or w is None or len(x) < 3:
        return [None]
    kernel = site.attr("kernel_shape") or list(w[2:])
    if not all(isinstance(k, int) for k in kernel):
        return [None]
    if site.node.op_type == "ConvTranspose":
        given = site.attr("output_shape")
        spatial = list(given) if given else _window(site, x[2:], kernel, transposed=True)
        ch = A.mul(w[1], site.attr("group", 1))
    else:
        spatial, ch = _window(site, x[2:], kernel), w[0]
    return [(x[0], ch, *spatial)]


def pool(site: Site) -> list:
    x = site.shape(0)
    if x is None or len(x) < 3:
        return [None] * len(site.node.outputs)
    out = (x[0], x[1], *_window(site, x[2:], site.attr("kernel_shape")))
    return [out] * len(site.node.outputs)


def global_pool(site: Site) -> list:
    x = site.shape(0)
    return [None if x is None else (*x[:2], *([1] * (len(x) - 2)))]


def matmul(site: Site) -> list:
    a, b = site.shape(0), site.shape(1)
    if a is None or b is None or not a or not b:
        return [None]
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    site.facts.unify(site, [a2[-1], b2[-2]], "contraction")
    batch = broadcast(site, [a2[:-2], b2[:-2]])
    out = (*batch, a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return [out]


def gemm(site: Site) -> list:
    a, b = site.shape(0), site.shape(1)
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return [None]
    m = a[1] if site.attr("transA", 0) else a[0]
    n = b[0] if site.attr("transB", 0) else b[1]
    return [(m, n)]


def matmul_nbits(site: Site) -> list:
    a = site.shape(0)
    return [None if a is None else (*a[:-1], site.attr("N"))]


def transpose(site: Site) -> list:
    x = site.shape(0)
    if x is None:
        return [None]
    perm = site.attr("perm") or list(range(len(x)))[::-1]
    return [tuple(x[p] for p in perm)]


def _axes(site: Site, attr_until: int, index: int = 1) -> list[int] | None:
    """Axes from the attribute (opsets below attr_until) or from input `index`."""
    if site.opset < attr_until:
        return site.attr("axes")
    return site.ints(index) if site.has(index) else []


def squeeze(site: Site) -> list:
    x = site.shape(0)
    axes = _axes(site, 13)
    if x is None or axes is None:
        return [None]
    if not axes:
        if not all(isinstance(d, int) for d in x):
            return [None]
        return [tuple(d for d in x if d != 1)]
    drop = {_axis(a, len(x)) for a in axes}
    return [tuple(d for i, d in enumerate(x) if i not in drop)]


def unsqueeze(site: Site) -> list:
    x = site.shape(0)
    axes = _axes(site, 13)
    if x is None or not axes:
        return [None]
    rank = len(x) + len(axes)
    ins = {_axis(a, rank) for a in axes}
    rest = iter(x)
    return [tuple(1 if i in ins else next(rest) for i in range(rank))]


def flatten(site: Site) -> list:
    x = site.shape(0)
    if x is None:
        return [None]
    axis = _axis(site.attr("axis", 1), len(x))
    return [(A.product(x[:axis]), A.product(x[axis:]))]


def reshape(site: Site) -> list:
    x, target = site.shape(0), site.values[1]
    if target is None:
        return [None]
    allowzero = site.attr("allowzero", 0)
    out: list[Dim] = []
    for i, d in enumerate(target):
        out.append(x[i] if d == 0 and not allowzero and x is not None and i < len(x)
                   else (None if d == -1 else d))
    if -1 in target:
        if x is None:
            return [tuple(out)]
        num = list(x)
        den = []
        for d in out:
            if d is None:
                continue
            if d in num:
                num.remove(d)
            else:
                den.append(d)
        out[list(target).index(-1)] = A.floor_div(A.product(num), A.product(den))
    return [tuple(out)]


def concat(site: Site) -> list:
    shapes = [site.shape(i) for i in range(len(site.node.inputs)) if site.has(i)]
    if any(s is None for s in shapes) or not shapes:
        return [None]
    rank = len(shapes[0])
    axis = _axis(site.attr("axis", 0), rank)
    out = []
    for i in range(rank):
        dims = [s[i] for s in shapes]
        out.append(sum_dims(dims) if i == axis
                   else site.facts.unify(site, dims, f"concat side axis {i}"))
    return [tuple(out)]


def sum_dims(dims: Sequence[Dim]) -> Dim:
    out: Dim = 0
    for d in dims:
        out = A.add(out, d)
    return out


def split(site: Site) -> list:
    x = site.shape(0)
    k = len(site.node.outputs)
    if x is None:
        return [None] * k
    axis = _axis(site.attr("axis", 0), len(x))
    sizes = site.ints(1) if site.opset >= 13 and site.has(1) else site.attr("split")
    if not sizes:
        d = x[axis]
        if isinstance(d, int) and d % k:    # opset 18 num_outputs: ceil for all but the last
            part = -(-d // k)
            sizes = [part] * (k - 1) + [d - part * (k - 1)]
        else:
            sizes = [A.floor_div(d, k)] * k
    return [(*x[:axis], s, *x[axis + 1:]) for s in sizes]


def _slice_len(d: Dim, start: int, end: int, step: int) -> Dim:
    """Length of d[start:end:step]; for a symbolic d, bounds are taken as inside the dim."""
    if isinstance(d, int):
        return len(range(*slice(start, end, step).indices(d)))
    if d is None:
        return None
    if step < 0:   # only the whole dim reversed
        return A.ceil_div(d, -step) if (start == -1 or start >= BIG) and end <= -BIG else None
    lo = A.add(d, start) if start < 0 else start
    hi = d if end >= BIG else (A.add(d, end) if end < 0 else A.dmin(d, end))
    return A.sub(hi, lo) if step == 1 else A.ceil_div(A.sub(hi, lo), step)


def _slice_args(site: Site, rank: int):  # noqa: ANN202
    if site.opset < 10:
        starts, ends = site.attr("starts"), site.attr("ends")
        axes, steps = site.attr("axes"), None
    else:
        starts, ends = site.ints(1), site.ints(2)
        axes = site.ints(3) if site.has(3) else None
        steps = site.ints(4) if site.has(4) else None
    if starts is None or ends is None:
        return None
    axes = [_axis(a, rank) for a in (axes if axes is not None else range(len(starts)))]
    return starts, ends, axes, steps or [1] * len(starts)


def slice_(site: Site) -> list:
    x = site.shape(0)
    if x is None:
        return [None]
    args = _slice_args(site, len(x))
    if args is None:
        return [(None,) * len(x)]
    out = list(x)
    for s, e, a, st in zip(*args):
        out[a] = _slice_len(x[a], s, e, st)
    return [tuple(out)]


def gather(site: Site) -> list:
    x, idx = site.shape(0), site.shape(1)
    if x is None or idx is None:
        return [None]
    axis = _axis(site.attr("axis", 0), len(x))
    return [(*x[:axis], *idx, *x[axis + 1:])]


def expand(site: Site) -> list:
    target = site.values[1]
    return [None if target is None else broadcast(site, [site.shape(0), tuple(target)])]


def tile(site: Site) -> list:
    x, reps = site.shape(0), site.ints(1)
    if x is None or reps is None:
        return [None]
    return [tuple(A.mul(d, r) for d, r in zip(x, reps))]


def pad(site: Site) -> list:
    x = site.shape(0)
    pads = site.attr("pads") if site.opset < 11 else site.ints(1)
    if x is None or pads is None:
        return [None]
    axes = site.ints(3) if site.opset >= 18 and site.has(3) else list(range(len(x)))
    if axes is None:
        return [None]
    out, n = list(x), len(axes)
    mode = site.attr("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    for i, a in enumerate(axes):
        a = _axis(a, len(x))
        if mode == "reflect" and max(pads[i], pads[i + n]) > 0:
            site.facts.require(site, x[a], ">", max(pads[i], pads[i + n]), f"reflect pad of axis {a}")
        elif mode in ("edge", "wrap") and max(pads[i], pads[i + n]) > 0:
            site.facts.require(site, x[a], ">=", 1, f"{mode} pad of axis {a}")
        out[a] = A.add(out[a], pads[i] + pads[i + n])
    return [tuple(out)]


def resize(site: Site) -> list:
    x = site.shape(0)
    if x is None or site.attr("axes") is not None:
        return [None]
    if site.node.op_type == "Upsample":
        scales = site.attr("scales") if site.opset < 9 else site.floats(1)
        sizes = None
    else:
        si, zi = (1, None) if site.opset < 11 else (2, 3)
        sizes = site.values[zi] if zi is not None and site.has(zi) else None
        scales = site.floats(si) if site.has(si) else None
    if sizes is not None and len(sizes) == len(x):
        return [tuple(sizes)]
    if not scales or len(scales) != len(x):
        return [None]
    out = []
    for d, s in zip(x, scales):
        if s == int(s):
            out.append(A.mul(d, int(s)))
        elif isinstance(d, int):
            out.append(int(np.floor(d * s)))
        else:
            out.append(None)
    return [tuple(out)]


def reduce(site: Site) -> list:
    x = site.shape(0)
    if x is None:
        return [None]
    op = site.node.op_type
    from_input = site.opset >= 18 or (op == "ReduceSum" and site.opset >= 13)
    axes = (site.ints(1) if site.has(1) else []) if from_input else site.attr("axes")
    if axes is None:
        return [None]
    if not axes:
        if site.attr("noop_with_empty_axes", 0):
            return [x]
        axes = list(range(len(x)))
    axes = {_axis(a, len(x)) for a in axes}
    keep = site.attr("keepdims", 1)
    return [tuple(1 if i in axes else d for i, d in enumerate(x) if keep or i not in axes)]


def arg_reduce(site: Site) -> list:
    x = site.shape(0)
    if x is None:
        return [None]
    axis = _axis(site.attr("axis", 0), len(x))
    keep = site.attr("keepdims", 1)
    return [tuple(1 if i == axis else d for i, d in enumerate(x) if keep or i != axis)]


def topk(site: Site) -> list:
    x = site.shape(0)
    k = site.ints(1) if site.opset >= 10 else [site.attr("k")]
    if x is None or not k:
        return [None, None]
    axis = _axis(site.attr("axis", -1), len(x))
    out = (*x[:axis], k[0], *x[axis + 1:])
    return [out, out]


def space_depth(site: Site) -> list:
    x = site.shape(0)
    b = site.attr("blocksize")
    if x is None or len(x) != 4:
        return [None]
    n, c, h, w = x
    if site.node.op_type == "DepthToSpace":
        return [(n, A.floor_div(c, b * b), A.mul(h, b), A.mul(w, b))]
    return [(n, A.mul(c, b * b), A.floor_div(h, b), A.floor_div(w, b))]


def layer_norm(site: Site) -> list:
    x = site.shape(0)
    if x is None:
        return [None] * len(site.node.outputs)
    axis = _axis(site.attr("axis", -1), len(x))
    stat = (*x[:axis], *([1] * (len(x) - axis)))
    return [x, stat, stat][:len(site.node.outputs)]


def rnn(site: Site) -> list:
    """LSTM, GRU, RNN (and onnxruntime's DynamicQuantizeLSTM): Y [seq, dirs, batch, hidden],
    Y_h / Y_c [dirs, batch, hidden]; with layout=1 batch first: [batch, seq, dirs, hidden] and
    [batch, dirs, hidden]."""
    x, hidden = site.shape(0), site.attr("hidden_size")
    if x is None or len(x) != 3 or hidden is None:
        return [None] * len(site.node.outputs)
    dirs = 2 if site.attr("direction", "forward") == "bidirectional" else 1
    # X's feature dim is W's last ([dirs, gates x hidden, input_size]): a model whose input is
    # [d0, d1] into the RNN takes only d1 = input_size (the size is in its weights alone)
    w = site.shape(1) if site.has(1) else None
    if w is not None and len(w) == 3:
        site.facts.unify(site, [x[2], w[2]], "input size (W's last dim)")
    batch_at = 0 if site.attr("layout", 0) == 1 else 1
    for i, name in ((5, "initial_h"), (6, "initial_c")):   # [dirs, batch, hidden] (layout 1: [batch, dirs, hidden])
        h = site.shape(i) if site.has(i) and i < len(site.node.inputs) else None
        if h is not None and len(h) == 3:
            site.facts.unify(site, [x[batch_at], h[0 if batch_at == 0 else 1]], f"{name}'s batch")
    if site.attr("layout", 0) == 1:
        batch, seq = x[0], x[1]
        return [(batch, seq, dirs, hidden), (batch, dirs, hidden), (batch, dirs, hidden)][:len(site.node.outputs)]
    seq, batch = x[0], x[1]
    return [(seq, dirs, batch, hidden), (dirs, batch, hidden), (dirs, batch, hidden)][:len(site.node.outputs)]


def shape_of(site: Site) -> list:
    x = site.shape(0)
    if x is None:
        return [None]
    return [(len(_shape_slice(site, x)),)]


def _shape_slice(site: Site, x: Shape) -> Shape:
    start, end = site.attr("start", 0), site.attr("end")
    return x[slice(start, end)]


def constant_of_shape(site: Site) -> list:
    v = site.values[0]
    return [None if v is None else tuple(v)]


def range_(site: Site) -> list:
    s, e, d = site.ints(0), site.ints(1), site.ints(2)
    if s and e and d and d[0]:
        return [(max(0, -(-(e[0] - s[0]) // d[0])),)]
    return [(None,)]


def _constant_tensor(site: Site):  # noqa: ANN202 - the Tensor of a Constant's `value`, or None
    a = site.node.attributes.get("value")
    return a.value if a is not None and hasattr(a.value, "dims") else None


def constant(site: Site) -> list:
    t = _constant_tensor(site)
    if t is not None:
        return [tuple(t.dims)]
    for name in ("value_float", "value_int", "value_string"):
        if name in site.node.attributes:
            return [()]
    for name in ("value_floats", "value_ints", "value_strings"):
        if name in site.node.attributes:
            return [(len(site.node.attributes[name].value),)]
    return [None]


def einsum(site: Site) -> list:
    """Einsum: each output letter's size is the size the inputs give that letter (unified across
    the inputs that share it: a batch letter in the output keeps the batch symbol); `...` stands
    for the broadcast of the inputs' leading dims. Without `->` the output is the letters used
    once, in alphabetical order (ONNX's implicit mode)."""
    eq = str(site.attr("equation", "")).replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len([v for v in site.node._inputs]):
        return [None]
    sizes: dict[str, list[Dim]] = {}
    ellipses: list[Shape] = []
    for k, term in enumerate(terms):
        shape = site.shape(k)
        if shape is None:
            return [None]
        head, dots, tail = term.partition("...")
        n_ell = len(shape) - len(head) - len(tail) if dots else 0
        if n_ell < 0 or (not dots and len(term) != len(shape)):
            return [None]
        for letter, d in zip(head, shape[:len(head)]):
            sizes.setdefault(letter, []).append(d)
        for letter, d in zip(tail, shape[len(shape) - len(tail):]):
            sizes.setdefault(letter, []).append(d)
        if dots:
            ellipses.append(tuple(shape[len(head):len(head) + n_ell]))
    if not arrow:
        counts: dict[str, int] = {}
        for term in terms:
            for letter in term.replace("...", ""):
                counts[letter] = counts.get(letter, 0) + 1
        out = ("..." if ellipses else "") + "".join(sorted(c for c, n in counts.items() if n == 1))
    ell = broadcast(site, ellipses) if ellipses else ()
    if ell is None:
        return [None]
    result: list[Dim] = []
    head, dots, tail = out.partition("...")
    for letter in head:
        if letter not in sizes:
            return [None]
        result.append(_letter(site, letter, sizes[letter]))
    if dots:
        result += list(ell)
    for letter in tail:
        if letter not in sizes:
            return [None]
        result.append(_letter(site, letter, sizes[letter]))
    return [tuple(result)]


def _letter(site: Site, letter: str, dims: list[Dim]) -> Dim:
    real = [d for d in dims if d != 1]
    if not real:
        return 1
    return real[0] if len(real) == 1 else site.facts.unify(site, real, f"einsum letter {letter!r}")


SHAPE_RULES: dict[str, Callable[[Site], list]] = {
    "Einsum": einsum,
    **{op: same for op in (
        "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "BitwiseNot", "Cast", "CastLike",
        "Ceil", "Celu", "Clip", "Cos", "Cosh", "CumSum", "DequantizeLinear", "Dropout", "Elu", "Erf",
        "Exp", "Floor", "Gelu", "GroupNormalization", "HardSigmoid", "HardSwish", "Hardmax", "Identity",
        "InstanceNormalization", "IsInf", "IsNaN", "LeakyRelu", "Log", "LogSoftmax", "LpNormalization",
        "LRN", "MeanVarianceNormalization", "Mish", "Neg", "Not", "QuantizeLinear", "Reciprocal",
        "Relu", "Round", "Selu", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh", "Softmax", "Softplus",
        "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu", "Trilu", "Swish")},
    **{op: elementwise for op in (
        "Add", "And", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Div", "Equal", "Greater",
        "GreaterOrEqual", "Less", "LessOrEqual", "Max", "Mean", "Min", "Mod", "Mul", "Or", "Pow",
        "PRelu", "Sub", "Sum", "Where", "Xor")},
    "BatchNormalization": lambda site: [site.shape(0)] + [None] * (len(site.node.outputs) - 1),
    "Conv": conv, "ConvTranspose": conv, "ConvInteger": conv,
    "AveragePool": pool, "MaxPool": lambda site: pool(site)[:1] + [None] * (len(site.node.outputs) - 1),
    "LpPool": pool,
    "GlobalAveragePool": global_pool, "GlobalMaxPool": global_pool, "GlobalLpPool": global_pool,
    "MatMul": matmul, "MatMulInteger": matmul, "Gemm": gemm, "com.microsoft.MatMulNBits": matmul_nbits,
    "Transpose": transpose, "Squeeze": squeeze, "Unsqueeze": unsqueeze, "Flatten": flatten,
    "Reshape": reshape, "Concat": concat, "Split": split, "Slice": slice_, "Gather": gather,
    "GatherElements": lambda site: [site.shape(1)], "Expand": expand, "Tile": tile, "Pad": pad,
    "Resize": resize, "Upsample": resize,
    **{op: reduce for op in ("ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum",
                             "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp")},
    "ArgMax": arg_reduce, "ArgMin": arg_reduce, "TopK": topk,
    "DepthToSpace": space_depth, "SpaceToDepth": space_depth,
    "LayerNormalization": layer_norm,
    "LSTM": rnn, "GRU": rnn, "RNN": rnn, "com.microsoft.DynamicQuantizeLSTM": rnn,
    # onnxruntime's dynamic quantization: the activation quantized per call, its scale and zero point scalars
    "DynamicQuantizeLinear": lambda site: [site.shape(0), (), ()],
    "com.microsoft.DynamicQuantizeMatMul": matmul, "com.microsoft.MatMulIntegerToFloat": matmul,
    "Shape": shape_of, "Size": lambda site: [()], "ConstantOfShape": constant_of_shape,
    "Range": range_, "Constant": constant, "NonZero": lambda site: [(site.rank(), None) if site.rank() is not None else None],
}


# --- the values of small integer tensors --------------------------------------------------

def _v_shape(site: Site) -> tuple | None:
    x = site.shape(0)
    return None if x is None else _shape_slice(site, x)


def _v_gather(site: Site) -> tuple | None:
    v, idx = site.values[0], site.ints(1)
    if v is None or idx is None or site.attr("axis", 0) != 0 or site.rank(0) != 1:
        return None
    try:
        return tuple(v[i] for i in idx)
    except IndexError:
        return None


def _v_concat(site: Site) -> tuple | None:
    vs = [site.values[i] for i in range(len(site.node.inputs)) if site.has(i)]
    if any(v is None for v in vs):
        return None
    return tuple(d for v in vs for d in v)


def _v_slice(site: Site) -> tuple | None:
    v = site.values[0]
    if v is None:
        return None
    args = _slice_args(site, 1)
    if args is None or len(args[0]) != 1:
        return None
    s, e, _, st = (a[0] for a in args)
    return tuple(v[slice(s, min(e, BIG), st)])


def _operands(site: Site) -> tuple[tuple, tuple] | None:
    """The two operands' values broadcast to one length (a one-element one repeated), or None."""
    a, b = site.values[0], site.values[1] if len(site.values) > 1 else None
    if a is None or b is None or (len(a) != len(b) and 1 not in (len(a), len(b))):
        return None
    n = max(len(a), len(b))
    return (a * n if len(a) == 1 else a), (b * n if len(b) == 1 else b)


def _v_arith(fn: Callable[[Dim, Dim], Dim]) -> Callable[[Site], tuple | None]:
    def rule(site: Site) -> tuple | None:
        ab = _operands(site)
        return None if ab is None else tuple(fn(x, y) for x, y in zip(*ab))
    return rule


def _int_cast(site: Site) -> tuple | None:
    to = site.attr("to")
    return site.values[0] if to in (6, 7) else None   # INT32, INT64


def _v_constant_of_shape(site: Site) -> tuple | None:
    """A 1-D ConstantOfShape of known length filled with an integer (the ones torch's expand
    compares its target with)."""
    n = site.values[0]
    if n is None or len(n) != 1 or not isinstance(n[0], int) or not 0 <= n[0] <= 64:
        return None
    t = site.attr("value")
    fill = initial_values(None, t) if t is not None else (0,)
    return None if fill is None or len(fill) != 1 else fill * n[0]


def _v_equal(site: Site) -> tuple | None:
    """1/0 per element where it is known: equal ints, or a dim (>= 0) against a negative constant."""
    ab = _operands(site)
    if ab is None:
        return None
    out = []
    for x, y in zip(*ab):
        if isinstance(x, int) and isinstance(y, int):
            out.append(int(x == y))
        elif (isinstance(x, int) and x < 0) or (isinstance(y, int) and y < 0):
            out.append(0)   # a dim is never negative
        else:
            return None
    return tuple(out)


def _v_where(site: Site) -> tuple | None:
    c, a, b = (site.values[i] if i < len(site.values) else None for i in range(3))
    if c is None or a is None or b is None or not all(isinstance(x, int) for x in c):
        return None
    n = max(len(c), len(a), len(b))
    if any(len(v) not in (1, n) for v in (c, a, b)):
        return None
    c, a, b = (v * n if len(v) == 1 else v for v in (c, a, b))
    return tuple(x if k else y for k, x, y in zip(c, a, b))


def _v_constant(site: Site) -> tuple | None:
    attrs = site.node.attributes
    if "value_int" in attrs:
        return (int(attrs["value_int"].value),)
    if "value_ints" in attrs:
        return tuple(int(x) for x in attrs["value_ints"].value)
    return initial_values(None, _constant_tensor(site))


VALUE_RULES: dict[str, Callable[[Site], tuple | None]] = {
    "Constant": _v_constant,
    "Shape": _v_shape,
    "Size": lambda site: None if site.shape(0) is None else (A.product(site.shape(0)),),
    "Gather": _v_gather, "Concat": _v_concat, "Slice": _v_slice,
    "Unsqueeze": lambda site: site.values[0], "Squeeze": lambda site: site.values[0],
    "Identity": lambda site: site.values[0], "Cast": _int_cast, "Reshape": lambda site: site.values[0],
    "Add": _v_arith(A.add), "Sub": _v_arith(A.sub), "Mul": _v_arith(A.mul), "Div": _v_arith(A.floor_div),
    "Max": _v_arith(A.dmax), "Min": _v_arith(A.dmin),
    "ConstantOfShape": _v_constant_of_shape, "Equal": _v_equal, "Where": _v_where,
}


def initial_values(t: TensorType | None, const) -> tuple | None:  # noqa: ANN001 - a Tensor
    """The contents of a small integer constant (a shape, axes, a Slice bound)."""
    from mcp_compiler.ir import DataType

    if const is None or getattr(const, "dtype", None) not in (DataType.INT64, DataType.INT32) \
            or const.numel > 64 or len(const.dims) > 1:
        return None
    return tuple(int(x) for x in const.numpy().reshape(-1))
