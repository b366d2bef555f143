"""Inputs a model accepts: sizes per symbol from its shape contracts, values within what it indexes.

Everything that feeds a model (verify, convert --verify, the quantization accuracy report,
deploy's smoke inference, model_warmup, the benchmarks) takes its inputs from here:

- one size per **symbol**, the same in every input (a state `[2, batch, 128]` and an input
  `[batch, T]` share `batch`); unnamed dims are the fresh symbols `inspect` shows (`x_d2`);
- what symbolic shape inference found the ops need: a symbol an op needs equal to a constant is
  that constant, dims an op needs equal are equal (a detector's H and W end up multiples of its
  stride), a reflect Pad's dim exceeds its pad, a Conv/pool window fits its input; sizes are
  searched in a fixed order of candidates until every requirement holds;
- integer inputs that index something (Gather's indices, OneHot's) stay below the indexed dim,
  inputs compared for equality with constants take those constants (a sample rate `sr`
  compared with 16000), masks (cast to bool, `Where`/`And`/`Or`/`Not` operands, names with
  "mask") are 0/1; other integers are drawn from [0, 3), floats from N(0, 1) (and, where that
  gives a non-finite output, from U(0, 1), U(1, 10), whole numbers 1..8 or U(10, 1000), the
  first that gives finite outputs, said in a note);
- `probe(run)`: when the original still fails (a requirement inference cannot see) or gives
  non-finite outputs, the next sizes in the search order are tried, a bounded number of times,
  before an error that says what was tried and what failed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import InvalidModelError, UsageError
from .ir import DataType, Model, TensorType, Value

INPUT_LIMIT = 4 << 30    # bytes of one generated input: a static dim of 2**40 is an error, not a MemoryError
PROBE_LIMIT = 256 << 20  # bytes of one whole sample while searching sizes: larger ones are not tried
BATCH_SIZES = (2, 1, 3, 4, 8)
# Other sizes, the first choice first; the probe also tries them growing together (32, 64, 128, ...).
OTHER_SIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16, 96, 160, 224, 320, 576, 640)
_COMBOS = 20000          # assignments the static search looks at
PROBES = 12              # sizes the probe tries on the original before giving up
REQUEST_LENGTH = 128     # a free axis's size in the request clients send (bench's default length)
# How float inputs may be drawn, and how the report says it. When N(0, 1) gives a non-finite
# output (a log or a square root of a scalar parameter, a pitch model's fmin/fmax), the others are
# tried in this order at the same sizes before other sizes are.
FLOAT_DRAWS = {"normal": "N(0, 1)", "uniform": "U(0, 1)", "positive": "U(1, 10)",
               "integral": "whole numbers 1..8", "large": "U(10, 1000)", "wide": "N(0, 16)"}
_REDRAWS = ("uniform", "positive", "integral", "large")
# Ops whose output holds the same values as an input (reshaped, cast, moved): integer domains
# follow them to the op that reads the values.
_PASS = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Transpose", "Slice",
         "Expand", "Tile", "Concat", "Split", "CastLike"}
_LOGICAL = {"And", "Or", "Not", "Xor"}   # operands read as booleans (and Where's condition, input 0)


@dataclass
class InputPlan:
    """Sizes per symbol and value domains per input, with the reasons."""

    sizes: dict[str, int] = field(default_factory=dict)
    constraints: dict[str, list[str]] = field(default_factory=dict)   # symbol -> what it must satisfy
    domains: dict[str, str] = field(default_factory=dict)             # input -> how its values are drawn
    tried: list[dict[str, int]] = field(default_factory=list)         # assignments the probe ran
    floats: str = "normal"      # how float inputs are drawn: FLOAT_DRAWS' keys
    notes: list[str] = field(default_factory=list)
    free: list[str] = field(default_factory=list)     # symbols no op ties to a size (lengths, spatial dims)
    shapes: dict[str, tuple] = field(default_factory=dict, repr=False)    # input -> dims over the symbols
    _values: dict[str, tuple] = field(default_factory=dict, repr=False)   # input -> ("range", lo, hi) | ("choice", vals)
    _order: list[dict[str, int]] = field(default_factory=list, repr=False)
    _requires: list = field(default_factory=list, repr=False)   # the shape contracts: (lhs, op, rhs, where)

    def zero_ok(self, name: str) -> bool:
        """0 is a value input `name` may take (an index range from 0, a set holding 0)."""
        how = self._values[name]
        return (how[0] == "range" and how[1] == 0) or (how[0] == "choice" and 0 in how[1])

    def sizes_at(self, sizes: dict[str, int] | None = None, batch: int | None = None) -> dict[str, int]:
        """The plan's sizes (or `sizes`), the axis-0 symbols at `batch` (the batch is the symbol at
        axis 0, everywhere it appears; static dims stay)."""
        out = dict(self.sizes if sizes is None else sizes)
        if batch is not None:
            out.update({d[0]: batch for d in self.shapes.values() if d and isinstance(d[0], str)})
        return out

    def values_at(self, name: str, sizes: dict[str, int]) -> tuple:
        """How input `name`'s values are drawn at `sizes`: a range below a symbol's size, as chosen."""
        how = self._values.get(name, ("normal",))
        if how[0] == "range" and isinstance(how[2], str):
            return ("range", how[1], max(1, sizes.get(how[2], 1)))
        return how

    def request(self, batch: int | None = None, length: int = REQUEST_LENGTH) -> dict[str, dict]:
        """Each input's shape at the plan's sizes (the axis-0 symbols at `batch`) and how its values
        are drawn, as JSON: what a client that has only the served config needs to send a request
        the model accepts ("values": ["range", lo, hi] | ["choice", [v, ...]] | [float draw]).
        "free" lists the axes a client may size: a free symbol's, where the shape contracts hold
        with it at `length` (a recognizer whose height must come to 1 after its strides is not
        free, though no op ties it to one size)."""
        sizes = self.sizes_at(batch=batch)
        free = {s for s in self.free if _holds(self._requires, {**sizes, s: length})}
        out = {}
        for name, dims in self.shapes.items():
            how = self.values_at(name, sizes)
            if how[0] == "range":
                values = ["range", int(how[1]), int(how[2])]
            elif how[0] == "choice":
                values = ["choice", [v.item() if hasattr(v, "item") else v for v in how[1]]]
            else:
                values = [self.floats]
            out[name] = {"shape": [d if isinstance(d, int) else sizes.get(d, 1) for d in dims], "values": values,
                         # axes of a free symbol (a length, an image side; not the batch): a client may size them
                         "free": [a for a, d in enumerate(dims) if a and isinstance(d, str) and d in free]}
        return out

    def to_dict(self) -> dict:
        return {"sizes": self.sizes, "constraints": self.constraints, "domains": self.domains,
                "floats": self.floats, "tried": self.tried, "notes": self.notes}


def interface(model: Model) -> list[Value]:
    return [v for v in model.graph.inputs if v.const is None]


def plan(model: Model, dims: dict[str, int] | None = None, *, fold: bool = True,
         flag: str = "--dims") -> InputPlan:
    """Sizes and value domains for `model`. `dims` fixes sizes; an unknown symbol in it is a
    UsageError. With `fold`, constant subgraphs are folded first (in place: the interface stays
    as it is), so that computed pads and shapes (torch exports build them from Constant, Concat,
    Reshape, Slice chains) become constants inference can read."""
    from .passes.shapes.symbolic_shapes import Inference, model_symbols

    if fold:
        _fold(model)
    from .llm.spec import decoder_sizes

    dims = dict(dims or {})
    dims.update(decoder_sizes(model, dims))   # a decoder's lengths are tied: the mask's = past + new
    inf = Inference(model.graph, model.onnx_opset, taken=model_symbols(model))
    inf.run()
    shapes = {v.name: _shape(v, inf.shapes.get(id(v))) for v in interface(model)}
    symbols = list(dict.fromkeys(d for s in shapes.values() for d in s if isinstance(d, str)))
    aliases = _aliases(model, shapes)
    unknown = [k for k in dims if k not in symbols and k not in aliases]
    if unknown:
        raise UsageError(f"{flag}: the model has no symbol {unknown[0]!r}; its input symbols: "
                         f"{', '.join(symbols) or 'none (every input dim is static)'}")
    fixed = {aliases.get(k, k): v for k, v in dims.items()}
    p = InputPlan()
    requires = [r for r in inf.facts.requires if _symbols_of(r[0]) | _symbols_of(r[2]) <= set(symbols)]
    # a minimum every size meets (a padded 3x3 window) says nothing: left out of the report
    ones = dict.fromkeys(symbols, 1)
    requires = [r for r in requires if r[1] == "==" or not _holds([r], ones)]
    for lhs, op, rhs, where in requires:
        for s in sorted(_symbols_of(lhs) | _symbols_of(rhs)):
            p.constraints.setdefault(s, []).append(f"{str(lhs)} {op} {str(rhs)} ({where})")
    candidates = {}
    for s in symbols:
        tied = sorted({r[2] for r in requires if r[1] == "==" and r[0] == s and isinstance(r[2], int)})
        if s in fixed:
            candidates[s] = [fixed[s]]
        elif len(tied) > 1:
            where = [r[3] for r in requires if r[1] == "==" and r[0] == s and isinstance(r[2], int)]
            raise UsageError(f"symbol {s!r} must equal both {tied[0]} and {tied[1]} ({'; '.join(where[:2])}): "
                             "no input size satisfies the model")
        elif tied:
            candidates[s] = tied
        else:
            candidates[s] = list(BATCH_SIZES if _batch_like(s, shapes) else OTHER_SIZES)
    p.free = [s for s in symbols if s not in fixed and candidates[s][0] == OTHER_SIZES[0]]
    p._order = _assignments(symbols, candidates, requires, grow=p.free)
    if not p._order:
        raise UsageError("no input sizes satisfy what the model's ops need: "
                         + "; ".join(f"{str(a)} {op} {str(b)} ({w})" for a, op, b, w in requires[:3])
                         + "; give sizes with --dims")
    p.sizes = dict(p._order[0])
    p._requires = requires
    for v in interface(model):
        p._values[v.name], p.domains[v.name] = _domain(v, inf.shapes, set(symbols))
    p.shapes = shapes
    return p


def _fold(model: Model) -> None:
    from .passes import PassContext, PassManager
    from .passes.normalize import ConstantToInitializerPass, FoldConstantsPass

    try:
        PassManager([ConstantToInitializerPass(), FoldConstantsPass()], PassContext()).run(model)
    except Exception:  # noqa: BLE001 - folding only helps the search; the probe still decides
        pass


def _shape(v: Value, inferred) -> tuple:  # noqa: ANN001
    t = v.type
    if not isinstance(t, TensorType) or t.shape is None:
        raise UsageError(f"input {v.name!r} has no tensor shape; give inputs with --inputs")
    shape = inferred if inferred is not None and len(inferred) == len(t.shape) else t.shape
    return tuple(d if isinstance(d, (int, str)) else None for d in shape)


def _aliases(model: Model, shapes: dict[str, tuple]) -> dict[str, str]:
    """Names a user may also size a dim by: the declared name of a dim inference renamed
    (`?` for an unnamed one, the model's own symbol)."""
    out = {}
    for v in interface(model):
        declared = v.type.shape if isinstance(v.type, TensorType) and v.type.shape else ()
        for d, ours in zip(declared, shapes[v.name]):
            if isinstance(d, str) and isinstance(ours, str) and d != ours:
                out.setdefault(d, ours)
    return out


def _symbols_of(d) -> set[str]:  # noqa: ANN001
    from .ir.dims import dim_symbols

    return set(dim_symbols(d)) if d is not None and not isinstance(d, int) else set()


def _holds(requires: list, env: dict[str, int]) -> bool:
    from .passes.shapes import algebra as A

    for lhs, op, rhs, _ in requires:
        a, b = A.evaluate(lhs, env), A.evaluate(rhs, env)
        if a is None or b is None:
            continue
        if (op == "==" and a != b) or (op == ">" and not a > b) or (op == ">=" and not a >= b):
            return False
    return True


def _batch_like(s: str, shapes: dict[str, tuple]) -> bool:
    """A symbol at axis 0 of an input, or the one free dim of an input whose other dims are fixed
    (a recurrent state [layers, batch, hidden])."""
    for sh in shapes.values():
        free = [d for d in sh if not isinstance(d, int)]
        if sh and (sh[0] == s or (len(sh) >= 3 and free == [s] and sh[-1] != s)):
            return True
    return False


def _assignments(symbols: list[str], candidates: dict[str, list[int]], requires: list,
                 grow: list[str] = ()) -> list[dict[str, int]]:
    """Assignments of sizes to symbols that meet every requirement, preferred ones first: each
    symbol's first choice; the `grow` symbols doubling together (a length some op needs to be
    long enough, whatever op that is); then the smallest sums of candidate ranks."""
    out: list[dict[str, int]] = []

    def add(env: dict[str, int]) -> None:
        if env not in out and _holds(requires, env):
            out.append(env)

    first = {s: candidates[s][0] for s in symbols}
    add(first)
    for step in range(1, 9):
        add({**first, **{s: candidates[s][min(step, 8)] for s in grow}})
    lists = [candidates[s] for s in symbols]
    while math.prod(len(c) for c in lists) > _COMBOS:
        longest = max(range(len(lists)), key=lambda i: len(lists[i]))
        lists[longest] = lists[longest][:-1]
    ranked = sorted(itertools.product(*[range(len(c)) for c in lists]), key=lambda ix: (sum(ix), ix))
    for ix in ranked:
        if len(out) >= PROBES:
            break
        add({s: lists[i][k] for i, (s, k) in enumerate(zip(symbols, ix))})
    return out[:PROBES]


def _const(v: Value | None) -> np.ndarray | None:
    if v is None:
        return None
    if v.const is not None and v.const.string_data is None and not v.const.dtype.packed:
        try:
            return v.const.numpy()
        except Exception:  # noqa: BLE001 - an exotic dtype: no constant to read
            return None
    n = v.producer
    if n is not None and n.op_type == "Constant" and "value" in n.attributes:
        t = n.attributes["value"].value
        try:
            return t.numpy()
        except Exception:  # noqa: BLE001
            return None
    return None


def _indexed(data: Value | None, axis: int, inferred: dict, symbols: set[str]):  # noqa: ANN202
    """The size of `data`'s `axis` as inference knows it: an int, a symbol of the interface (the
    index is then bounded by whatever size the plan picks for it), or None."""
    if data is None:
        return None
    shape = (tuple(data.const.dims) if data.const is not None else inferred.get(id(data))
             or (data.type.shape if isinstance(data.type, TensorType) else None))
    if not shape or not -len(shape) <= axis < len(shape):
        return None
    d = shape[axis]
    return d if isinstance(d, int) or (isinstance(d, str) and d in symbols) else None


def _domain(v: Value, inferred: dict | None = None, symbols: set[str] | None = None) -> tuple[tuple, str]:
    """How the input's values are drawn, and why (for the report). An index input is drawn below
    the size of the axis it indexes, a symbol's size included."""
    inferred, symbols = inferred or {}, symbols or set()
    t = v.type
    dt = DataType(t.elem_type)
    if dt == DataType.UNDEFINED:
        raise InvalidModelError(None, f"input {v.name!r} has element type UNDEFINED: no value can be made for it")
    integer = dt == DataType.BOOL or np.issubdtype(dt.numpy_dtype, np.integer)
    if "mask" in v.name.lower():
        return ("choice", (0, 1)), "mask (by its name): 0/1"
    bounds, choices, boolish = [], set(), False
    seen, frontier = set(), [v]
    while frontier:
        x = frontier.pop()
        for n, i in x.uses:
            if id(n) in seen:
                continue
            seen.add(id(n))
            op = n.op_type if n.is_onnx() else ""
            if op in ("Gather", "GatherElements", "ScatterElements") and i == 1:
                axis = n.attributes["axis"].value if "axis" in n.attributes else 0
                size = _indexed(n.inputs[0], axis, inferred, symbols)
                if size is not None:
                    bounds.append((size, f"{op} {n.name!r} indexes {size} rows"))
            elif op in ("GatherND", "ScatterND") and i == 1:
                b = n.attributes["batch_dims"].value if "batch_dims" in n.attributes else 0
                k = x.type.shape[-1] if isinstance(x.type, TensorType) and x.type.shape else None
                sizes = [_indexed(n.inputs[0], a, inferred, symbols) for a in range(b, b + k)] if isinstance(k, int) else []
                if sizes and all(s is not None for s in sizes):
                    ints = [s for s in sizes if isinstance(s, int)]
                    size = min(ints) if ints else sizes[0]
                    bounds.append((size, f"{op} {n.name!r} indexes dims of {', '.join(map(str, sizes))}"))
            elif op == "OneHot" and i == 0:
                depth = _const(n.inputs[1])
                if depth is not None and depth.size == 1:
                    bounds.append((int(depth.reshape(-1)[0]), f"OneHot {n.name!r} depth"))
            elif op in ("Equal",):
                other = _const(n.inputs[1 - i])
                if other is not None and other.size <= 8:
                    choices.update(other.reshape(-1).tolist())
            elif op in _LOGICAL or (op == "Where" and i == 0) or (op == "Cast" and n.attributes.get("to") is not None
                                    and n.attributes["to"].value == DataType.BOOL):
                boolish = True
            elif op in _PASS and n.outputs:
                frontier.extend(n.outputs)
    if choices and (integer or all(float(c).is_integer() for c in choices)):
        vals = tuple(sorted(choices))
        return ("choice", vals), f"compared with {', '.join(map(str, vals))}: one of them"
    if boolish:
        return ("choice", (0, 1)), "used as a condition: 0/1"
    if bounds and integer:
        fixed = [b for b in bounds if isinstance(b[0], int)]
        hi, why = min(fixed) if fixed else bounds[0]   # a symbol's bound: the size the plan picks for it
        return ("range", 0, hi), f"indices below {hi} ({why})"
    if integer:
        return ("range", 0, 3), "integers in [0, 3) (the default)"
    return ("normal",), "N(0, 1)"


def make(model: Model, p: InputPlan, rng: np.random.Generator, *, sizes: dict[str, int] | None = None,
         batch: int | None = None, limit: int = INPUT_LIMIT, flag: str = "--dims") -> dict[str, np.ndarray]:
    """One sample for `model` at the plan's sizes (or `sizes`), the axis-0 symbols at `batch`;
    an input over `limit` bytes is a UsageError naming `flag`."""
    sizes = p.sizes_at(sizes, batch)
    feeds = {}
    for v in interface(model):
        shape = _shape_at(p, v, sizes)
        dt = DataType(v.type.elem_type)
        size = dt.nbytes(math.prod(shape))
        if size > limit:
            raise UsageError(f"input {v.name!r} at shape {shape} would be {size} bytes, over the "
                             f"{limit >> 20} MiB limit for generated inputs; give smaller sizes with {flag}")
        feeds[v.name] = draw(dt.numpy_dtype, shape, p.values_at(v.name, sizes), rng, v.name, p.floats)
    return feeds


def _shape_at(p: InputPlan, v: Value, sizes: dict[str, int]) -> list[int]:
    """Input `v`'s shape with its symbols at `sizes` (an unknown one at 1)."""
    return [d if isinstance(d, int) else sizes.get(d, 1) for d in p.shapes[v.name]]


def _sample_bytes(model: Model, p: InputPlan, sizes: dict[str, int]) -> int:
    return sum(DataType(v.type.elem_type).nbytes(math.prod(_shape_at(p, v, sizes))) for v in interface(model))


def draw(npdt: np.dtype, shape: list[int], how: tuple, rng: np.random.Generator, name: str = "",
         floats: str = "normal") -> np.ndarray:
    """Random values for one input of numpy type `npdt`, drawn as `how` says (("range", lo, hi),
    ("choice", values), or anything else: the float draw `floats`): always an ndarray, a 0-d one
    at rank 0 (numpy's generators return a numpy scalar for shape (), which onnxruntime and
    tritonclient refuse). Also what bench draws from an entry's recorded request."""
    npdt = np.dtype(npdt)
    return np.asarray(_values(npdt, list(shape), tuple(how), rng, name, floats), dtype=npdt)


def _values(npdt: np.dtype, shape: list[int], how: tuple, rng: np.random.Generator, name: str,
            floats: str) -> np.ndarray | np.generic:
    # drawn at the width of the result (float32, not float64 then cast: half the peak memory)
    if how[0] == "choice":
        return np.asarray(how[1])[rng.integers(0, len(how[1]), shape, dtype=np.int32)].astype(npdt, copy=False)
    if npdt == np.bool_:
        return rng.integers(0, 2, shape, dtype=np.int8).astype(bool)
    if how[0] == "range":
        return rng.integers(how[1], how[2], shape, dtype=np.int64).astype(npdt, copy=False)
    if np.issubdtype(npdt, np.floating):
        wide = npdt if npdt == np.float64 else np.float32
        if floats == "uniform":
            return rng.random(shape, dtype=wide).astype(npdt, copy=False)
        if floats in ("positive", "large"):
            lo, hi = (1.0, 10.0) if floats == "positive" else (10.0, 1000.0)
            return (lo + (hi - lo) * rng.random(shape, dtype=wide)).astype(npdt, copy=False)
        if floats == "integral":
            return rng.integers(1, 9, shape, dtype=np.int32).astype(npdt)
        a = rng.standard_normal(shape, dtype=wide)
        if floats == "wide":
            a *= 4.0
        return a.astype(npdt, copy=False)
    raise UsageError(f"input {name!r}: cannot make random {npdt} data; give inputs with --inputs")


def probe(model: Model, p: InputPlan, run: Callable[[dict], list], rng_seed: int = 0) -> InputPlan:
    """Run the original on the plan's sizes; when it fails or returns non-finite values, try the
    next sizes of the search (at most PROBES). Keeps the first sizes that work; raises a
    UsageError naming what was tried otherwise."""
    errors = []
    for sizes in p._order:
        if _sample_bytes(model, p, sizes) > PROBE_LIMIT and p.tried:
            continue   # the search never draws samples this large (24 GB of RSS was seen)
        feeds = make(model, p, np.random.default_rng(rng_seed), sizes=sizes)
        p.tried.append(dict(sizes))
        try:
            outs = run(feeds)
        except TimeoutError:   # a bounded run that did not end: not a size that fails
            raise
        except Exception as e:  # noqa: BLE001 - onnxruntime raises many kinds
            errors.append(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
            continue
        bad = [i for i, o in enumerate(outs) if _float(o) and not np.isfinite(np.asarray(o)).all()]
        if bad and p.floats == "normal":
            redrawn = _redraw(model, p, run, rng_seed, bad[0])
            if redrawn is not None:
                outs, bad = redrawn, []
        if bad and len(p._order) > len(p.tried):
            errors.append(f"non-finite output {bad[0]}")
            continue
        p.sizes = dict(sizes)
        if len(p.tried) > 1:
            p.notes.append(f"sizes {p.tried[0]} failed ({errors[0][:200]}); using {sizes}")
        _prefer_exercising(model, p, run, outs, rng_seed)
        return p
    raise UsageError(f"the original model fails on every input size tried ({len(p.tried)}: "
                     f"{', '.join(map(str, p.tried[:3]))}{' ...' if len(p.tried) > 3 else ''}): "
                     f"{errors[-1][:300]}; give sizes with --dims or your own inputs with --inputs")


def _redraw(model: Model, p: InputPlan, run: Callable[[dict], list], rng_seed: int, bad: int) -> list | None:
    """Float inputs drawn from the other ranges of FLOAT_DRAWS, in order, at the same sizes: the
    outputs of the first that gives finite outputs everywhere (p.floats and a note say which), or
    None (p.floats back at normal)."""
    if not any(np.issubdtype(DataType(v.type.elem_type).numpy_dtype, np.floating)
               for v in interface(model) if p._values[v.name][0] == "normal"):
        return None
    for kind in _REDRAWS:
        p.floats = kind
        try:
            outs = run(make(model, p, np.random.default_rng(rng_seed)))
        except TimeoutError:   # a bounded run that did not end: not a size that fails
            raise
        except Exception:  # noqa: BLE001 - this range does not suit the model
            continue
        if all(np.isfinite(np.asarray(o)).all() for o in outs if _float(o)):
            p.notes.append(f"float inputs drawn from {FLOAT_DRAWS[kind]}: from N(0, 1) output {bad} was not "
                           "finite (NaN or inf)")
            return outs
    p.floats = "normal"
    return None


def exercised(a, atol: float = 1e-4) -> bool:  # noqa: ANN001
    """An output the sample exercises: not everywhere within atol of zero, not constant."""
    a = np.asarray(a)
    if a.dtype.kind not in "fc" or a.size == 0:
        return True
    f = a[np.isfinite(a)].astype(np.float64)
    return bool(f.size) and bool(np.abs(f).max() > atol) and (f.size == 1 or bool(np.ptp(f) > 0))


def _prefer_exercising(model: Model, p: InputPlan, run: Callable[[dict], list], outs: list,
                       rng_seed: int) -> None:
    """When N(0, 1) inputs leave an output unexercised (a detector's probabilities all ~1e-7),
    try U(0, 1) and N(0, 16) and keep the one that exercises the most outputs."""
    best = sum(map(exercised, outs))
    if best == len(outs) or p.floats != "normal":   # (a range chosen for finite outputs stays)
        return
    chosen = "normal"
    for kind in ("uniform", "wide"):
        p.floats = kind
        try:
            got = run(make(model, p, np.random.default_rng(rng_seed)))
        except TimeoutError:   # a bounded run that did not end: not a size that fails
            raise
        except Exception:  # noqa: BLE001 - this distribution does not suit the model
            continue
        score = sum(map(exercised, got))
        if score > best and all(np.isfinite(np.asarray(o)).all() for o in got if _float(o)):
            best, chosen = score, kind
    p.floats = chosen
    if p.floats != "normal":
        p.notes.append(f"float inputs drawn from {FLOAT_DRAWS[p.floats]}: "
                       "N(0, 1) left an output unexercised")


def _float(a) -> bool:  # noqa: ANN001
    a = np.asarray(a)
    return a.dtype.kind in "fc"


def load_inputs(path: str | Path, model: Model, flag: str = "--inputs") -> list[dict[str, np.ndarray]]:
    """User samples: one .npz, or a folder of them (sorted by name), arrays named like the inputs;
    names, dtypes and ranks checked against the model's interface."""
    from .files import check_regular_input

    path = Path(path)
    files = sorted(path.glob("*.npz")) if path.is_dir() else [path]
    if not files:
        raise UsageError(f"{flag} {path}: no .npz files in the folder")
    want = {v.name: v for v in interface(model)}
    samples = []
    for f in files:
        check_regular_input(f, flag)
        try:
            with np.load(f, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except Exception as e:  # noqa: BLE001 - zip or npy format errors of many kinds
            raise UsageError(f"{flag} {f}: not a readable .npz ({type(e).__name__}: {e})") from None
        missing = sorted(set(want) - set(arrays))
        extra = sorted(set(arrays) - set(want))
        if missing:
            raise UsageError(f"{flag} {f}: no array {missing[0]!r} (the model's inputs: {', '.join(want)})")
        if extra:
            raise UsageError(f"{flag} {f}: array {extra[0]!r} is not an input of the model "
                             f"(its inputs: {', '.join(want)})")
        for name, a in arrays.items():
            t = want[name].type
            dt = DataType(t.elem_type)
            if a.dtype != dt.numpy_dtype:
                raise UsageError(f"{flag} {f}: array {name!r} is {a.dtype}, the input is {dt.name}")
            if t.shape is not None and a.ndim != len(t.shape):
                raise UsageError(f"{flag} {f}: array {name!r} has rank {a.ndim}, the input has {len(t.shape)}")
            for axis, (got, d) in enumerate(zip(a.shape, t.shape or ())):
                if isinstance(d, int) and d != got:
                    raise UsageError(f"{flag} {f}: array {name!r} has {got} at axis {axis}, the input needs {d}")
        samples.append(arrays)
    return samples
