"""State pairs: an input a model reads its state from and the output it gives the next state in.

Streaming models carry state from one call to the next: a VAD's or an enhancer's LSTM state
(`h0`/`c0` in, `hN`/`cN` out), an FSMN's caches (`in_cache0` in, `out_cache0` out), a decoder's
past keys and values (`past_key_values.0.key` in, `present.0.key` out, one step longer). A pair is
found when an input and an output have the same element type and rank, the output depends on the
input, and one of these holds:

- rnn: the input feeds an LSTM/GRU/RNN's initial_h or initial_c and the output is that node's Y_h
  or Y_c, each through ops that only move values (Squeeze, Unsqueeze, Reshape, Slice, Concat,
  Split, Gather, Transpose, Identity, Cast);
- names: their names pair up (in/out, input/output, past/present, prev/next, h0/hn, c0/cn, old/new,
  or a suffix: state/stateN, h/h_out) and their shapes agree as far as they are known (no static
  dim differs: an If's output may have dims inference cannot see);
- kv: past/present names and the shapes are equal but for one axis (the sequence the cache grows
  along: `grows_axis`).

The rest of the state work (Triton's sequence batcher, the state kept on the server) builds on
this; `mcp-cli inspect` lists the pairs and why each was taken.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from .ir import Model, TensorType, Value

_MOVE = {"Squeeze", "Unsqueeze", "Reshape", "Slice", "Concat", "Split", "Gather", "Transpose", "Identity", "Cast",
         "Flatten"}
_RNN = {"LSTM", "GRU", "RNN", "DynamicQuantizeLSTM"}
# (input word, output word): a name with the first becomes the second
_WORDS = [("past_key_values", "present"), ("past", "present"), ("input", "output"), ("in", "out"),
          ("prev", "next"), ("previous", "next"), ("old", "new"), ("h0", "hn"), ("c0", "cn"), ("hx", "hy"),
          ("cx", "cy"), ("state_in", "state_out"), ("init", "final")]


@dataclass(frozen=True)
class StatePair:
    input: str
    output: str
    kind: str                 # rnn | names | kv
    why: str
    grows_axis: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _shape(v: Value) -> tuple | None:
    t = v.type
    return tuple(t.shape) if isinstance(t, TensorType) and t.shape is not None else None


def _dtype(v: Value) -> int | None:
    return v.type.elem_type if isinstance(v.type, TensorType) else None


def _reach(v: Value, step, depth: int = 12) -> list[Value]:  # noqa: ANN001 - step: Value -> values
    """The values reached from `v` through `step`, at most `depth` steps away."""
    out, todo, seen = [], [(v, 0)], set()
    while todo:
        x, d = todo.pop()
        if id(x) in seen or d > depth:
            continue
        seen.add(id(x))
        out.append(x)
        todo += [(y, d + 1) for y in step(x)]
    return out


def _sources(v: Value) -> set[int]:
    """The graph inputs `v` is made from through value-moving ops only."""
    def up(x: Value) -> list[Value]:
        p = x.producer
        if p is None or p.op_type not in _MOVE or not p.inputs or p.inputs[0] is None:
            return []
        return [i for i in p.inputs[:1 if p.op_type != "Concat" else None] if i is not None]

    return {id(x) for x in _reach(v, up) if x.producer is None}


def _sinks(v: Value, outputs: set[int]) -> set[int]:
    """The graph outputs `v` reaches through value-moving ops only."""
    def down(x: Value) -> list[Value]:
        return [o for n, _ in x.uses if n.op_type in _MOVE for o in n.outputs]

    return {id(x) for x in _reach(v, down) if id(x) in outputs}


def _depends(out: Value, inp: Value) -> bool:
    """Whether `out` is computed from `inp`, through If/Loop/Scan bodies too (a body reads the
    values around it without listing them as the node's inputs)."""
    todo, seen = [out], set()
    while todo:
        x = todo.pop()
        if x is inp:
            return True
        if id(x) in seen or x.producer is None:
            continue
        seen.add(id(x))
        p = x.producer
        todo += [i for i in p.inputs if i is not None]
        for body in p.subgraphs():
            for g in body.graphs():
                for n in g.nodes:
                    todo += [i for i in n.inputs if i is not None]
                todo += list(g.outputs)
    return False


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])|(?<=[A-Za-z])(?=\d)", name) if t]


def _renamed(name: str) -> set[str]:
    """The output names `name` pairs with: one word of it replaced by its output word, or a
    suffix added (`state` -> `stateN`, `h` -> `h_out`, `hidden` -> `hidden_next`)."""
    low = name.lower()
    if any(low == a for a, _ in _WORDS) or low in ("x", "data", "images", "image", "audio", "speech"):
        return set()   # the model's main input (`input` -> `output`) is no state
    out = {low + sfx for sfx in ("n", "_n", "_out", "out", "_next", "_new", "_1")}
    for a, b in _WORDS:
        for m in re.finditer(rf"(?<![a-z]){re.escape(a)}(?![a-z])", low):
            out.add(low[:m.start()] + b + low[m.end():])
    return out


def find_state_pairs(model: Model) -> list[StatePair]:
    """The state pairs of `model`'s main graph (see the module docstring)."""
    g = model.graph
    inputs = [v for v in g.inputs if v.const is None]
    outputs = list(g.outputs)
    out_ids = {id(o): o for o in outputs}
    pairs: dict[str, StatePair] = {}
    # rnn: initial_h / initial_c in, Y_h / Y_c out
    for n in g.nodes:
        if n.op_type not in _RNN:
            continue
        for i_in, i_out, what in ((5, 1, "initial_h -> Y_h"), (6, 2, "initial_c -> Y_c")):
            if len(n.inputs) <= i_in or n.inputs[i_in] is None or len(n.outputs) <= i_out:
                continue
            srcs = _sources(n.inputs[i_in])
            sinks = _sinks(n.outputs[i_out], set(out_ids))
            for v in inputs:
                if id(v) not in srcs or v.name in pairs:
                    continue
                for oid in sinks:
                    o = out_ids[oid]
                    if _dtype(o) == _dtype(v) and _shape(o) is not None and _shape(o) == _shape(v):
                        pairs[v.name] = StatePair(v.name, o.name, "rnn", f"{n.op_type} {n.name!r}: {what}")
                        break
    taken = {p.output for p in pairs.values()}
    for v in inputs:
        if v.name in pairs:
            continue
        names = _renamed(v.name)
        for o in outputs:
            if o.name in taken or o.name.lower() not in names or _dtype(o) != _dtype(v):
                continue
            a, b = _shape(v), _shape(o)
            if a is None or b is None or len(a) != len(b) or not _depends(o, v):
                continue
            diff = [k for k, (x, y) in enumerate(zip(a, b)) if x != y]
            clash = [k for k in diff if isinstance(a[k], int) and isinstance(b[k], int)]
            kv = any(w in v.name.lower() for w in ("past", "key", "value"))
            if kv and len(diff) == 1:
                pairs[v.name] = StatePair(v.name, o.name, "kv", f"past/present names, grows along axis {diff[0]}",
                                          grows_axis=diff[0])
            elif not diff:
                pairs[v.name] = StatePair(v.name, o.name, "names", "names pair up, same type and shape")
            elif not clash:
                # an output inference cannot see into (an If's): its dims are unknown, none contradicts
                pairs[v.name] = StatePair(v.name, o.name, "names", "names pair up, same type and rank, no dim "
                                          f"disagrees (axes {', '.join(map(str, diff))} unknown on one side)")
            else:
                continue
            taken.add(o.name)
            break
    return list(pairs.values())


_GATES = {"Sigmoid", "Tanh"}


def proposed_pairs(model: Model, pairs: list[StatePair] | None = None) -> list[StatePair]:
    """Pairs by shape alone, proposed and never used (issue 59: an unrolled-LSTM denoiser with its
    state in [1, 2, 128, 2] and out under another name was served stateless with no hint): an
    input and an output outside `pairs`, of the same element type and the same fully static shape
    of rank 2 or more (a state, not a flag), the output computed from the input through a
    recurrent cell's gates (a Sigmoid or Tanh between them, as an unrolled LSTM/GRU has), neither
    the model's first input nor its first output (its main tensors). `--state IN=OUT` serves one."""
    g = model.graph
    pairs = find_state_pairs(model) if pairs is None else pairs
    used_in, used_out = {p.input for p in pairs}, {p.output for p in pairs}
    inputs = [v for v in g.inputs if v.const is None]
    main_in, main_out = (inputs[0] if inputs else None), (g.outputs[0] if g.outputs else None)
    out, taken = [], set(used_out)
    for v in inputs:
        a = _shape(v)
        if v is main_in or v.name in used_in or a is None or len(a) < 2 or not all(isinstance(d, int) for d in a):
            continue
        after = _after(v)
        for o in g.outputs:
            if o is main_out or o.name in taken or _dtype(o) != _dtype(v) or _shape(o) != a:
                continue
            gates = sorted({n.op_type for n in _between(o, after) if n.op_type in _GATES})
            if gates:
                out.append(StatePair(v.name, o.name, "shape", f"same type and shape {list(a)}, computed from it "
                                     f"through {' and '.join(gates)} gates (a recurrent cell)"))
                taken.add(o.name)
                break
    return out


def _after(v: Value) -> set[int]:
    """The ids of the nodes of the main graph computed from `v`."""
    seen: set[int] = set()
    todo = [v]
    while todo:
        x = todo.pop()
        for n, _ in x.uses:
            if id(n) not in seen:
                seen.add(id(n))
                todo += [o for o in n.outputs if o is not None]
    return seen


def _between(out: Value, after: set[int]) -> list:
    """The nodes `out` is computed from that are themselves computed from the input (`after`)."""
    found, seen, todo = [], set(), [out]
    while todo:
        x = todo.pop()
        p = x.producer
        if p is None or id(p) in seen:
            continue
        seen.add(id(p))
        if id(p) in after:
            found.append(p)
        todo += [i for i in p.inputs if i is not None]
    return found
