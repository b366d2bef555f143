"""The pass framework: Pass, PassResult, PassContext, PassManager (ir-py's shape, TVM's context)."""

from __future__ import annotations

import abc
import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from mcp_compiler.errors import McpError
from mcp_compiler.ir import Graph, Model

if TYPE_CHECKING:
    from mcp_compiler.targets.base import Target

    from .quantize.options import QuantizeOptions


def _ir_log():  # noqa: ANN202 - logging.Logger (logging is imported when something is printed)
    """The logger --print-ir-after and --time-passes write to (the CLI sends it to stderr)."""
    import logging

    return logging.getLogger("mcp_compiler.ir")


class Property(enum.Enum):
    """Facts about a model that passes need or establish."""

    NO_CONSTANT_NODES = "no-constant-nodes"
    NO_DEAD_CODE = "no-dead-code"
    TARGET_LEGAL = "target-legal"
    SHAPES_INFERRED = "shapes-inferred"
    LAYOUT_NHWC = "layout-nhwc"
    UNIQUE_WEIGHTS = "unique-weights"


ALL = frozenset(Property)
# What a local rewrite (a fusion) keeps: it makes no Constant node, its results keep their
# shapes, the interface keeps its layout. Not kept: dead code (what it leaves), legality (new
# ops), unique weights (new constants).
REWRITES = frozenset({Property.NO_CONSTANT_NODES, Property.SHAPES_INFERRED, Property.LAYOUT_NHWC})


class PassError(McpError):
    """A pass failed; names the pass and the ones that ran before it."""

    exit_code = 1

    def __init__(self, name: str, previous: Sequence[str], cause: BaseException) -> None:
        self.pass_name, self.previous, self.cause = name, list(previous), cause
        after = f" (after {', '.join(previous)})" if previous else ""
        super().__init__(f"pass {name} failed{after}: {type(cause).__name__}: {cause}")


class ContractError(McpError):
    """A pass broke what it claims (--verify-each): a property it establishes does not hold."""

    exit_code = 1


class PipelineError(McpError):
    """The pipeline is ill-formed: a pass needs a property no earlier pass establishes."""

    exit_code = 2


@dataclass(frozen=True)
class PassResult:
    model: Model
    modified: bool
    stats: Mapping[str, Any] = field(default_factory=dict)
    details: Sequence[Mapping[str, Any]] = ()   # per-node records (e.g. what quantization did to each)
    warnings: Sequence[str] = ()                # for the user: the conversion report's warnings


@dataclass
class PassContext:
    """Options every pass may read; no globals, no environment variables."""

    verify_each: bool = False
    disabled: set[str] = field(default_factory=set)
    target: Target | None = None     # what legalization and the target-legal property ask
    fold_size_limit: int | None = None   # bytes a folded tensor may reach (None: no net growth of the weights)
    quantize: QuantizeOptions | None = None   # for the quantize-* passes, validated once here
    calibration: list[dict] | None = None   # input samples (name -> array) for activation ranges
    budget: dict[str, float] | None = None   # --accuracy-budget for the quantize passes' layer selection
    samples: list[dict] | None = None       # the inputs that selection measures on
    min_opset: int | None = None     # upgrade-opset: the ai.onnx opset to raise the model to
    print_ir_after: set[str] = field(default_factory=set)   # pass names (or "all"): IR to the log
    explain: set[str] = field(default_factory=set)          # rule passes that list why sites did not fire
    time_passes: bool = False        # --time-passes: each pass's time, slowest first, after the pipeline

    def __post_init__(self) -> None:
        if self.quantize is not None:
            self.quantize.validate()   # a bad option is one UsageError before any pass runs


class Pass(abc.ABC):
    """A pass declares its contract: the properties it `requires` before it runs, those it
    `establishes` (checked after it with --verify-each), and those a run that modifies the
    model `preserves`; every other property is dropped (MLIR's rule)."""

    name: ClassVar[str]
    requires: ClassVar[frozenset[Property]] = frozenset()
    establishes: ClassVar[frozenset[Property]] = frozenset()
    preserves: ClassVar[frozenset[Property]] = frozenset()

    # A run leaves a fixed point: run again on the model it left, the pass changes nothing. The
    # manager then skips it while no pass has changed the model since (LLVM's preserved analyses).
    idempotent: ClassVar[bool] = False
    # Passes whose fixed point a run of this one keeps: the model it changed is one they would
    # still not change (deduplicate-weights merges initializers equal in dtype, dims and bytes: shape
    # inference finds what it found before). The manager goes on skipping them; --verify-each runs
    # each of them again to check the claim.
    keeps_fixed_points: ClassVar[frozenset[str]] = frozenset()

    @abc.abstractmethod
    def run(self, model: Model, ctx: PassContext) -> PassResult:
        """Rewrite `model` in place."""

    def left_fixed_point(self, result: PassResult) -> bool:
        """Whether this run left a model the pass would not change (idempotent passes)."""
        return self.idempotent

    def broken_claims(self, model: Model, ctx: PassContext) -> list[str]:
        """What the pass claims about the model after it ran and does not hold: each property
        it establishes, checked (rule passes add: no rule fires any more)."""
        from .properties import violations

        return [f"{prop.value}: {v}" for prop in sorted(self.establishes, key=lambda p: p.value)
                for v in violations(prop, model, ctx)[:5]]


@dataclass
class PassRecord:
    name: str
    modified: bool
    seconds: float
    nodes_before: int
    nodes_after: int
    stats: dict[str, Any]
    iteration: int = 0
    details: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    skipped: bool = False   # not run: the model is the one its last run left (an idempotent pass)


def count_nodes(model: Model) -> int:
    return _count(model.graph)


def _count(g: Graph) -> int:
    """The nodes of g and its subgraphs (what graph.walk() yields, without a yield per node)."""
    return sum(len(sub.nodes) for sub in g.graphs())


class Repeat:
    """Run a group of passes until none modifies the model (at most `max_steps` rounds)."""

    def __init__(self, passes: Sequence[Pass], max_steps: int = 4) -> None:
        self.passes = list(passes)
        self.max_steps = max_steps


class PassInstrument:
    """Hooks around every pass a PassManager runs (TVM's PassInstrument, MLIR's
    PassInstrumentation): checks, dumps and timers are plug-ins, not switches in the manager."""

    def before(self, p: Pass, model: Model, pm: PassManager) -> None:
        """Called before `p` runs on `model`."""

    def after(self, p: Pass, model: Model, result: PassResult, record: PassRecord,
              pm: PassManager) -> None:
        """Called after `p` ran; `pm.properties` still holds what was known before it."""

    def finish(self, model: Model, records: list[PassRecord], pm: PassManager) -> None:
        """Called once the pipeline has run."""


class TimePasses(PassInstrument):
    """--time-passes (LLVM's -time-passes): each pass's wall time over the pipeline, summed over
    its runs, slowest first, to `sink` (default: the mcp_compiler.ir logger, stderr). The time is
    the pass's own: measured around `run`, not the other instruments."""

    def __init__(self, sink: Any = None) -> None:
        self.sink = sink
        self.totals: dict[str, list[float]] = {}

    def after(self, p: Pass, model: Model, result: PassResult, record: PassRecord, pm: PassManager) -> None:
        self.totals.setdefault(p.name, []).append(record.seconds)

    def report(self, skipped: int = 0) -> str:
        total = sum(sum(t) for t in self.totals.values()) or 1e-12
        rows = sorted(self.totals.items(), key=lambda kv: -sum(kv[1]))
        more = f" ({skipped} skipped: the model unchanged since their last run)" if skipped else ""
        lines = [f"// pass times: {total:.3f} s in {sum(len(t) for t in self.totals.values())} runs{more}",
                 f"//   {'seconds':>8} {'share':>6} {'runs':>4}  pass"]
        lines += [f"//   {sum(t):8.3f} {100 * sum(t) / total:5.1f}% {len(t):4d}  {name}" for name, t in rows]
        return "\n".join(lines)

    def finish(self, model: Model, records: list[PassRecord], pm: PassManager) -> None:
        text = self.report(sum(r.skipped for r in records))
        if self.sink is None:
            _ir_log().info("%s", text)
        else:
            self.sink(text)


class WeightGrowth(PassInstrument):
    """Which passes made the weights bigger: after each pass that changed the model, the growth of
    its initializers' bytes (every graph's: what folding and fusing store; a walk of a dict, where
    the whole model's tensors took 60 ms a pass at 50k nodes) is put on its record's stats
    (`weight_growth_bytes`), so a warning can name the pass."""

    def __init__(self, model: Model) -> None:
        self.last = self.initializer_bytes(model)

    @staticmethod
    def initializer_bytes(model: Model) -> int:
        return sum(v.const.nbytes for g in model.all_graphs() for v in g.initializers.values() if v.const is not None)

    def after(self, p: Pass, model: Model, result: PassResult, record: PassRecord, pm: PassManager) -> None:
        if not record.modified:
            return
        now = self.initializer_bytes(model)
        if now > self.last:
            record.stats["weight_growth_bytes"] = record.stats.get("weight_growth_bytes", 0) + now - self.last
        self.last = now


class PrintIR(PassInstrument):
    """The IR after the named passes ("all": every pass), one line per node, to `sink`
    (default: the mcp_compiler.ir logger that --print-ir-after writes to stderr)."""

    def __init__(self, names: set[str], sink: Any = None) -> None:
        self.names, self.sink = set(names), sink

    def after(self, p: Pass, model: Model, result: PassResult, record: PassRecord, pm: PassManager) -> None:
        if not self.names & {p.name, "all"}:
            return
        from mcp_compiler.ir.printer import print_model

        head = f"// IR after {p.name}{'' if result.modified else ' (unchanged)'}"
        if self.sink is None:
            _ir_log().info("%s\n%s", head, print_model(model))
        else:
            self.sink(p.name, f"{head}\n{print_model(model)}")


class VerifyEach(PassInstrument):
    """--verify-each: after every pass, the IR's invariants, that the pass worked on the model it
    was given (a new model object would lose its work), each property it establishes, each
    property it preserves that held before it (when it changed the model), and that a pass that
    says its run left a fixed point changes nothing when run again."""

    def after(self, p: Pass, model: Model, result: PassResult, record: PassRecord, pm: PassManager) -> None:
        from mcp_compiler.ir.verify import verify

        from .properties import violations

        if result.model is not model:
            raise ContractError(f"pass {p.name} returned another model object than it was given: "
                                "a pass changes the model in place")
        verify(model)
        broken = p.broken_claims(model, pm.ctx)
        if not result.modified and count_nodes(model) != record.nodes_before:
            broken.append(f"it said it did not modify the model, and the node count went from "
                          f"{record.nodes_before} to {count_nodes(model)}")
        if result.modified:
            kept = sorted((pm.properties & set(p.preserves)) - set(p.establishes), key=lambda q: q.value)
            broken += [f"{q.value} (preserved): {v}" for q in kept for v in violations(q, model, pm.ctx)[:5]]
        if result.modified and p.left_fixed_point(result):   # the manager skips it until the model changes
            again = p.run(model, pm.ctx)
            if again.modified:
                broken.append(f"it left a fixed point (it is skipped while the model is unchanged), and a "
                              f"second run changed the model again ({_changed(again)})")
        if result.modified:
            for q in pm.fixed_points_kept(p):   # still skipped after this run: still at their fixed point
                again = q.run(model, pm.ctx)
                if again.modified:
                    broken.append(f"it keeps {q.name}'s fixed point (which is then skipped), and {q.name} "
                                  f"changed the model after it ({_changed(again)})")
        if broken:
            raise ContractError(f"pass {p.name} claims what does not hold after it ran: {'; '.join(broken[:5])}"
                                + (f" (and {len(broken) - 5} more)" if len(broken) > 5 else ""))


def _changed(result: PassResult) -> Any:
    return {k: v for k, v in result.stats.items() if isinstance(v, int) and v} or "modified=True"


class PassManager:
    # Instruments every manager gets (the tests attach VerifyEach here: every pipeline run
    # in-process checks the IR and each pass's claims).
    global_instruments: ClassVar[list[PassInstrument]] = []

    def __init__(self, steps: Sequence[Pass | Repeat], ctx: PassContext | None = None,
                 initial: frozenset[Property] = frozenset(),
                 instruments: Sequence[PassInstrument] | None = None) -> None:
        self.ctx = ctx or PassContext()
        # the context's switches are instruments too (--verify-each, --print-ir-after)
        self.instruments = [*self.global_instruments, *(instruments or [])]
        if self.ctx.verify_each and not any(isinstance(i, VerifyEach) for i in self.instruments):
            self.instruments.append(VerifyEach())
        if self.ctx.print_ir_after and not any(isinstance(i, PrintIR) for i in self.instruments):
            self.instruments.append(PrintIR(self.ctx.print_ir_after))
        if self.ctx.time_passes and not any(isinstance(i, TimePasses) for i in self.instruments):
            self.instruments.append(TimePasses())
        self.steps = [s for s in steps if not (isinstance(s, Pass) and s.name in self.ctx.disabled)]
        for s in self.steps:
            if isinstance(s, Repeat):
                s.passes = [p for p in s.passes if p.name not in self.ctx.disabled]
        self.initial = initial
        self._check_plan(initial)

    def _flat(self) -> list[Pass]:
        return [p for s in self.steps for p in (s.passes if isinstance(s, Repeat) else [s])]

    def _check_plan(self, have: frozenset[Property]) -> None:
        props = set(have)
        for p in self._flat():
            missing = p.requires - props
            if missing:
                from . import PASSES

                givers = sorted({q.name for q in PASSES.values() if q.establishes & missing})
                hint = f" (put {' or '.join(givers)} before it)" if givers else ""
                raise PipelineError(f"pass {p.name} requires {', '.join(m.value for m in missing)}, "
                                    f"which no earlier pass establishes{hint}")
            props &= set(p.preserves)
            props |= p.establishes

    def run(self, model: Model) -> tuple[Model, list[PassRecord]]:
        """Run the steps; `self.properties` then holds what the model is known to have."""
        self.properties: set[Property] = set(self.initial)
        self._version = 0   # how many runs have changed the model
        # an idempotent pass -> (the version its last run left, the pass)
        self._fixed: dict[tuple, tuple[int, Pass]] = {}
        self._kept_by: dict[tuple, list[str]] = {}   # the passes that changed the model since, keeping it
        records: list[PassRecord] = []
        done: list[str] = []
        for step in self.steps:
            if isinstance(step, Pass):
                self._one(step, model, records, done, 0)
                continue
            for it in range(step.max_steps):
                if not any([self._one(p, model, records, done, it) for p in step.passes]):
                    break
        for inst in self.instruments:
            inst.finish(model, records, self)
        return model, records

    def _one(self, p: Pass, model: Model, records: list[PassRecord], done: list[str], it: int) -> bool:
        # the count after the last pass stands until a pass changes the model (one walk per change)
        before = records[-1].nodes_after if records else count_nodes(model)
        key = _pass_key(p)
        fixed = self._fixed.get(key)
        if fixed is not None and fixed[0] == self._version:
            keepers = self._kept_by.get(key)
            why = ("the model is unchanged since its last run" if not keepers else
                   f"the model changed since its last run only by {', '.join(keepers)}, which keep its fixed point")
            records.append(PassRecord(p.name, False, 0.0, before, before, {"skipped": why}, it, skipped=True))
            return False
        for inst in self.instruments:
            inst.before(p, model, self)
        t0 = time.perf_counter()
        try:
            result = p.run(model, self.ctx)
            if not isinstance(result, PassResult):
                raise TypeError(f"returned {type(result).__name__}, not PassResult")
        except McpError:
            raise
        except Exception as e:
            raise PassError(p.name, done, e) from e
        record = PassRecord(p.name, result.modified, round(time.perf_counter() - t0, 6),
                            before, count_nodes(model) if result.modified else before, dict(result.stats), it,
                            [dict(d) for d in result.details], list(result.warnings))
        for inst in self.instruments:
            inst.after(p, model, result, record, self)
        if result.modified:
            self.properties &= set(p.preserves)
            kept = self._kept(p)
            self._version += 1
            for k in kept:
                self._fixed[k] = (self._version, self._fixed[k][1])
                keepers = self._kept_by.setdefault(k, [])
                if p.name not in keepers:
                    keepers.append(p.name)
        self.properties |= p.establishes
        if p.left_fixed_point(result):
            self._fixed[key] = (self._version, p)
            self._kept_by.pop(key, None)
        records.append(record)
        done.append(p.name)
        return result.modified

    def fixed_points_kept(self, p: Pass) -> list[Pass]:
        """The passes now at their fixed point (skipped if run next) that a run of `p` that
        changes the model says it keeps there."""
        return [self._fixed[k][1] for k in self._kept(p)]

    def _kept(self, p: Pass) -> list[tuple]:
        return [k for k, (version, q) in self._fixed.items()
                if version == self._version and q.name in p.keeps_fixed_points]


def _pass_key(p: Pass) -> tuple:
    """Two instances of a pass with the same settings are the same pass for skipping."""
    return (type(p), repr(sorted(vars(p).items())))
