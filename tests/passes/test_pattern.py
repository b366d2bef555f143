"""The pattern matcher the fusion rules are written in."""

from __future__ import annotations

import numpy as np

from mcp_compiler.ir import Node, Tensor, Value
from mcp_compiler.passes._pattern import Const, Op, Or, Var, match


def _const(name, v):
    return Value(name, const=Tensor.from_numpy(name, np.array(v, np.float32)))


def _graph():
    """y = (x * 0.5) + Neg(x); also z = Neg(x) * 2 when `shared`."""
    x, half = Value("x"), _const("half", 0.5)
    m = Node("Mul", [half, x], [Value("m")])
    n = Node("Neg", [x], [Value("n")])
    a = Node("Add", [n.outputs[0], m.outputs[0]], [Value("y")])
    return x, m, n, a


def test_commutative_operands_and_shared_variables():
    x, m, n, a = _graph()
    p = Op("Add", Op("Mul", Var("x"), Const(0.5)), Op("Neg", Var("x")))
    got = match(p, a, outputs=set())
    assert got is not None and got["x"] is x and got.nodes[-1] is a and {id(k) for k in got.nodes} == {id(m), id(n), id(a)}
    assert match(Op("Add", Op("Mul", Var("x"), Const(0.25)), Op("Neg", Var("x"))), a, set()) is None
    # the same name must be the same value
    assert match(Op("Add", Op("Mul", Var("x"), Const(0.5)), Op("Neg", Var("other"))), a, set()) is not None
    assert match(Op("Add", Op("Mul", Var("x"), Const(0.5)), Op("Neg", Op("Neg", Var("x")))), a, set()) is None


def test_alternatives_and_named_nodes():
    x, m, n, a = _graph()
    p = Op("Add", Or(Op("Div", Var("x"), Const(2.0)), Op("Mul", Var("x"), Const(name="k"))), Op("Neg", Var("x"), name="neg"))
    got = match(p, a, set())
    assert got is not None and got.node("neg") is n and got.scalar("k") == 0.5


def test_inner_values_used_outside_or_graph_outputs_refuse_the_match():
    x, m, n, a = _graph()
    p = Op("Add", Op("Mul", Var("x"), Const(0.5)), Op("Neg", Var("x")))
    Node("Relu", [n.outputs[0]], [Value("z")])          # n's output now has a second use
    assert match(p, a, set()) is None
    x, m, n, a = _graph()
    assert match(p, a, outputs={id(m.outputs[0])}) is None
    assert match(p, a, outputs={id(a.outputs[0])}) is not None   # the root's own output may be one


def test_broadcast_check_counts_constant_ranks():
    x, m, n, a = _graph()
    got = match(Op("Add", Op("Mul", Var("x"), Const(0.5)), Op("Neg", Var("x"))), a, set())
    assert got.broadcasts_like(x)       # x's rank unknown: a 0-d constant adds no dims
    x, m, n, a = _graph()
    m.set_input(0, _const("half2", [[0.5]]))
    got = match(Op("Add", Op("Mul", Var("x"), Const(0.5)), Op("Neg", Var("x"))), a, set())
    assert got is not None and not got.broadcasts_like(x)   # a [1, 1] constant could add dims


def test_a_widely_shared_constant_keeps_exact_use_lists():
    """40 chains Relu -> Min(., six) -> Max(., zero) share `six` and `zero` (more users than the
    driver unlinks one by one): after fuse-clip their use lists name exactly the live nodes (the
    global VerifyEach checks use lists too)."""
    import numpy as np

    from mcp_compiler.ir import Graph, Model, Node, Tensor, TensorType, Value
    from mcp_compiler.ir.types import DataType
    from mcp_compiler.passes import PassManager
    from mcp_compiler.passes.normalize import FuseClipPass, IdentityEliminationPass

    g = Graph("g")
    t = TensorType(DataType.FLOAT, (2,))
    x = Value("x", t)
    g.inputs.append(x)
    consts = {}
    for name, v in (("six", 6.0), ("zero", 0.0)):
        consts[name] = Value(name, TensorType(DataType.FLOAT, ()), const=Tensor.from_numpy(name, np.array(v, np.float32)))
        g.initializers[name] = consts[name]
    for i in range(40):
        r, m, y = Value(f"r{i}", t), Value(f"m{i}", t), Value(f"y{i}", t)
        g.nodes += [Node("Relu", [x], [r], name=f"relu{i}"), Node("Min", [r, consts["six"]], [m], name=f"min{i}"),
                    Node("Max", [m, consts["zero"]], [y], name=f"max{i}")]
        g.outputs.append(y)
    model = Model(g, {"": 17})
    _, records = PassManager([FuseClipPass(), IdentityEliminationPass()]).run(model)
    assert records[0].stats["chains_merged"] == 40 and len(g.nodes) == 40
    live = {id(n) for n in g.nodes}
    for v in consts.values():
        assert all(id(u) in live for u, _ in v.uses), v.name
    assert all(n.op_type == "Clip" for n in g.nodes)


def test_possible_says_which_patterns_the_graphs_ops_rule_out():
    from mcp_compiler.passes._pattern import possible

    p = Op("Mul", Var("x"), Or(Op("HardSigmoid", Var("x")), Op("Div", Op("Clip", Var("x")), Const(6.0))))
    assert possible(p, {"Mul", "HardSigmoid"}) and possible(p, {"Mul", "Div", "Clip"})
    assert not possible(p, {"Mul", "Div"}) and not possible(p, {"HardSigmoid", "Div", "Clip"})
    assert possible(Const(1.0), set()) and possible(Var("x"), set())


def test_a_rule_its_round_makes_possible_fires_in_that_round():
    """Rule `abs` turns Neg into Abs, an op the graph did not have; `relu-of-abs` needs one. The
    worklist starts from the output: the Relu is visited first, while no Abs exists (the rule is
    not tried), and again after the rewrite made one (asked again: it fires)."""
    from mcp_compiler.ir import Graph, Model, TensorType
    from mcp_compiler.ir.types import DataType
    from mcp_compiler.passes import PassManager
    from mcp_compiler.passes._rules import Rule, RuleSetPass

    t = TensorType(DataType.FLOAT, (2,))
    g = Graph("g")
    x, a, y = Value("x", t), Value("a", t), Value("y", t)
    g.inputs.append(x)
    g.nodes += [Node("Neg", [x], [a], name="neg"), Node("Relu", [a], [y], name="relu")]
    g.outputs.append(y)
    tried = []

    def check(m, model):
        tried.append(m.nodes[-1].op_type)

    class AbsFirst(RuleSetPass):
        name = "abs-first"
        reverse = True
        rounds = ((Rule("abs", Op("Neg", Var("x")), lambda m, rc, y: [Node("Abs", [m["x"]], [y])], check),
                   Rule("relu_of_abs", Op("Relu", Op("Abs", Var("x"))),
                        lambda m, rc, y: [Node("Abs", [m["x"]], [y])], check)),)

    _, records = PassManager([AbsFirst()]).run(Model(g, {"": 17}))
    assert records[0].stats["abs"] == 1 and records[0].stats["relu_of_abs"] == 1
    assert [n.op_type for n in g.nodes] == ["Abs"] and g.nodes[0].inputs[0] is x and g.nodes[0].outputs[0] is y
    assert tried == ["Neg", "Relu"]
