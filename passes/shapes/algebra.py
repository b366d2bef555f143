"""Arithmetic on symbolic dims that keeps them in one normal form, so equal dims compare equal.

A dim is read as a linear form: a constant plus integer multiples of atoms, where an atom is a
symbol or an expression the form cannot open up (a product of two symbolic dims, a floor division
whose remainder is not exact, a min/max). `(2*H + 2) // 2` becomes `H + 1`, `H - H` becomes 0,
`((H + 1) // 2) * 2 // 2` becomes `(H + 1) // 2`. Unknown (None) in, unknown out.
"""

from __future__ import annotations

from functools import lru_cache

from mcp_compiler.ir.dims import Dim, ShapeExpr

# The operations are pure and dims are values (a ShapeExpr's hash is kept): the same sums come
# back in every run of shape inference on a model (four a conversion) and at every layer of a
# network, and are worked out once. Bounded: a long-lived process converts many models.
_memo = lru_cache(maxsize=1 << 14, typed=True)

# A linear form: (constant, ((atom, coefficient), ...)) with atoms sorted by their text.
Linear = tuple[int, tuple[tuple[Dim, int], ...]]


def _key(atom: Dim) -> str:
    return str(atom)


def linear(d: Dim) -> Linear:
    if isinstance(d, int):
        return d, ()
    if isinstance(d, str):
        return 0, ((d, 1),)
    assert isinstance(d, ShapeExpr)
    if d.op in ("add", "sub"):
        return _combine(linear(d.lhs), linear(d.rhs), 1 if d.op == "add" else -1)
    if d.op == "mul" and isinstance(d.rhs, int):
        return _scale(linear(d.lhs), d.rhs)
    return 0, ((d, 1),)


def _combine(a: Linear, b: Linear, sign: int) -> Linear:
    terms: dict[str, tuple[Dim, int]] = {_key(t): (t, c) for t, c in a[1]}
    for t, c in b[1]:
        k = _key(t)
        total = terms.get(k, (t, 0))[1] + sign * c
        if total:
            terms[k] = (t, total)
        else:
            terms.pop(k, None)
    return a[0] + sign * b[0], tuple(terms[k] for k in sorted(terms))


def _scale(a: Linear, k: int) -> Linear:
    if k == 0:
        return 0, ()
    return a[0] * k, tuple((t, c * k) for t, c in a[1])


def build(form: Linear) -> Dim:
    """The dim a linear form stands for, written as positive terms first: `2*H + W - 1`."""
    const, terms = form
    out: Dim = None
    for atom, coef in sorted(terms, key=lambda tc: tc[1] < 0):
        if out is None:
            out = atom if coef == 1 else ShapeExpr("mul", atom, coef)
        elif coef > 0:
            out = ShapeExpr("add", out, atom if coef == 1 else ShapeExpr("mul", atom, coef))
        else:
            out = ShapeExpr("sub", out, atom if coef == -1 else ShapeExpr("mul", atom, -coef))
    if out is None:
        return const
    if const > 0:
        out = ShapeExpr("add", out, const)
    elif const < 0:
        out = ShapeExpr("sub", out, -const)
    if isinstance(out, ShapeExpr):
        object.__setattr__(out, "_normal", True)   # norm() need not work it out again
    return out


def norm(d: Dim) -> Dim:
    if d is None or type(d) is int or type(d) is str or "_normal" in d.__dict__:   # already normal (most dims)
        return d
    return build(linear(d))


@_memo
def add(a: Dim, b: Dim) -> Dim:
    if a is None or b is None:
        return None
    return build(_combine(linear(a), linear(b), 1))


@_memo
def sub(a: Dim, b: Dim) -> Dim:
    if a is None or b is None:
        return None
    return build(_combine(linear(a), linear(b), -1))


def _factors(atom: Dim) -> list[Dim]:
    if isinstance(atom, ShapeExpr) and atom.op == "mul" and not isinstance(atom.rhs, int):
        return _factors(atom.lhs) + _factors(atom.rhs)
    return [atom]


def _monomial(factors: list[Dim]) -> Dim:
    ordered = sorted(factors, key=_key)
    out = ordered[0]
    for f in ordered[1:]:
        out = ShapeExpr("mul", out, f)
    return out


@_memo
def mul(a: Dim, b: Dim) -> Dim:
    """a * b, multiplied out: (H + 1) * W = H*W + W, with the factors of a product sorted."""
    if a is None or b is None:
        return None
    la, lb = linear(a), linear(b)
    const = la[0] * lb[0]
    terms: Linear = (const, ())
    for (ta, ca) in la[1]:
        terms = _combine(terms, (0, ((ta, ca * lb[0]),)), 1)
        for (tb, cb) in lb[1]:
            terms = _combine(terms, (0, ((_monomial(_factors(ta) + _factors(tb)), ca * cb),)), 1)
    for (tb, cb) in lb[1]:
        terms = _combine(terms, (0, ((tb, cb * la[0]),)), 1)
    return build(terms)


@_memo
def floor_div(a: Dim, b: Dim) -> Dim:
    """floor(a / b); for a constant b > 0 the multiples of b come out of the division."""
    if a is None or b is None:
        return None
    if isinstance(b, int) and b > 0:
        a = norm(a)
        if isinstance(a, ShapeExpr) and a.op == "floor_div" and isinstance(a.rhs, int) and a.rhs > 0:
            return floor_div(a.lhs, a.rhs * b)   # floor(floor(x / k) / b) = floor(x / (k * b))
        const, terms = linear(a)
        whole = [(t, c // b) for t, c in terms if c % b == 0]
        rest: Linear = (const, tuple((t, c) for t, c in terms if c % b))
        if b == 1:
            return build(linear(a))
        if not rest[1]:
            return build((rest[0] // b, tuple(whole)))
        # floor((b*X + r) / b) = X + floor(r / b) for integer X; r keeps the constant
        inner = ShapeExpr("floor_div", build(rest), b)
        return build(_combine((0, tuple(whole)), (0, ((inner, 1),)), 1))
    if isinstance(a, int) and isinstance(b, int) and b != 0:
        return a // b
    if norm(a) == norm(b):
        return 1
    return ShapeExpr("floor_div", norm(a), norm(b))


@_memo
def ceil_div(a: Dim, b: Dim) -> Dim:
    """ceil(a / b)."""
    if a is None or b is None:
        return None
    if isinstance(b, int) and b > 0:
        return floor_div(add(a, b - 1), b)   # integer a: ceil(a / b) = floor((a + b - 1) / b)
    return ShapeExpr("ceil_div", norm(a), norm(b))


def dmin(a: Dim, b: Dim) -> Dim:
    if a is None or b is None:
        return None
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    diff = sub(a, b)
    if isinstance(diff, int):
        return b if diff >= 0 else a
    lo, hi = sorted((norm(a), norm(b)), key=_key)
    return ShapeExpr("min", lo, hi)


def dmax(a: Dim, b: Dim) -> Dim:
    if a is None or b is None:
        return None
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    diff = sub(a, b)
    if isinstance(diff, int):
        return a if diff >= 0 else b
    lo, hi = sorted((norm(a), norm(b)), key=_key)
    return ShapeExpr("max", lo, hi)


def product(dims) -> Dim:  # noqa: ANN001 - any iterable of dims
    out: Dim = 1
    for d in dims:
        out = mul(out, d)
    return out


def substitute(d: Dim, names: dict[str, Dim]) -> Dim:
    """`d` with symbols replaced by `names[symbol]` (renormalized)."""
    if isinstance(d, str):
        return names.get(d, d)
    if not isinstance(d, ShapeExpr):
        return d
    lhs, rhs = substitute(d.lhs, names), substitute(d.rhs, names)
    if lhs is d.lhs and rhs is d.rhs:
        return d
    return _OPS[d.op](lhs, rhs)


_OPS = {"add": add, "sub": sub, "mul": mul, "floor_div": floor_div, "ceil_div": ceil_div,
        "min": dmin, "max": dmax, "mod": lambda a, b: None if a is None or b is None else (
            a % b if isinstance(a, int) and isinstance(b, int) and b else ShapeExpr("mod", norm(a), norm(b)))}


def evaluate(d: Dim, env: dict[str, int]) -> int | None:
    """The integer a dim takes when its symbols take the values in `env` (None: unknown)."""
    if d is None or isinstance(d, int):
        return d
    if isinstance(d, str):
        return env.get(d)
    a, b = evaluate(d.lhs, env), evaluate(d.rhs, env)
    if a is None or b is None:
        return None
    if d.op in ("floor_div", "ceil_div", "mod") and b == 0:
        return None
    return {"add": a + b, "sub": a - b, "mul": a * b, "floor_div": a // b if b else 0,
            "ceil_div": -(-a // b) if b else 0, "mod": a % b if b else 0,
            "min": min(a, b), "max": max(a, b)}[d.op]
