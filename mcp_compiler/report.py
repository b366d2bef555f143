"""Rendering for the CLI: rich tables on a terminal, plain lines otherwise, JSON with --json."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:   # the report renders them; importing them would load onnx at start-up
    from .api import CompileReport
    from .summary import ModelSummary


_RICH_STRIPS = dict.fromkeys((7, 8, 11, 12, 13))   # the control characters rich's Text drops


class _Stream:
    """stdout or stderr. On a terminal (or where the environment asks for one: TTY_COMPATIBLE,
    FORCE_COLOR) it is a rich Console; on a pipe or a file plain lines are written straight to the
    stream, as that Console would write them, without importing rich (17 ms of every command)."""

    def __init__(self, *, stderr: bool) -> None:
        self.stderr = stderr
        self._console = None

    @property
    def file(self):  # noqa: ANN202 - a text stream
        return sys.stderr if self.stderr else sys.stdout

    @property
    def console(self):  # noqa: ANN202 - rich.console.Console
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=self.stderr, soft_wrap=True, highlight=False, emoji=False)
        return self._console

    @property
    def is_terminal(self) -> bool:
        if self._console is None and not _terminal_wanted(self.file):
            return False
        return self.console.is_terminal

    def print(self, obj: Any = "", *, markup: bool | None = None) -> None:
        if self._console is None and isinstance(obj, str) and markup is False and not _terminal_wanted(self.file):
            f = self.file
            f.write(obj.translate(_RICH_STRIPS) + "\n")
            f.flush()   # as rich does after every print: a piped `serve` shows its lines as they come
            return
        self.console.print(obj, markup=markup)


def _terminal_wanted(stream) -> bool:  # noqa: ANN001 - a text stream
    if "TTY_COMPATIBLE" in os.environ or "FORCE_COLOR" in os.environ:
        return True
    try:
        return stream.isatty()
    except (AttributeError, ValueError):   # no isatty, or a closed stream
        return False


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(32), 127)} | {10: "\\n", 13: "\\r", 9: "\\t"}


def one_line(message: str) -> str:
    """A message as one line: control characters (a newline in a value the user gave) escaped."""
    return message.translate(_CONTROL)


class Reporter:
    """The one place the CLI writes to the user: results to stdout, errors to stderr."""

    def __init__(self, *, json_mode: bool = False) -> None:
        self.json_mode = json_mode
        self.out = _Stream(stderr=False)
        self.err = _Stream(stderr=True)
        self.payload: dict[str, Any] = {}   # the --json object, printed once by finish()/fail()
        self.done = False

    @property
    def rich(self) -> bool:
        return self.out.is_terminal and not self.json_mode

    def json(self, payload: dict[str, Any]) -> None:
        """Add to the --json object (one envelope per command: {"ok": ..., **payload})."""
        self.payload.update(payload)

    def _emit(self, envelope: dict[str, Any]) -> None:
        if self.json_mode and not self.done:
            sys.stdout.write(json.dumps(envelope, indent=2, sort_keys=False) + "\n")
            sys.stdout.flush()
        self.done = True

    def finish(self, ok: bool = True) -> None:
        """The command ended without an error (ok: its own verdict, e.g. no zoo model failed)."""
        self._emit({"ok": ok, **{k: v for k, v in self.payload.items() if k != "ok"}})

    def fail(self, kind: str, message: str, exit_code: int) -> None:
        """One error line on stderr; with --json the error envelope (and what was known) on stdout."""
        message = one_line(message)
        self.err.print(f"error: {message}", markup=False)
        self._emit({"ok": False, "error": {"type": kind, "message": message, "exit_code": exit_code},
                    **{k: v for k, v in self.payload.items() if k != "ok"}})

    def warning(self, message: str) -> None:
        self.err.print(f"warning: {one_line(message)}", markup=False)

    def status(self, message: str):  # noqa: ANN201 - a context manager
        """A spinner on a terminal; nothing otherwise (CI logs stay clean)."""
        if self.err.is_terminal and not self.json_mode:
            return self.err.console.status(message)
        import contextlib

        return contextlib.nullcontext()

    # -- convert ------------------------------------------------------------------------------
    def converted(self, r: CompileReport, verbose: bool = False) -> None:
        if self.json_mode:
            self.json(r.to_dict())
            return
        verifying = set((r.verification or {}).get("warnings", ()))   # printed with the check below
        for w in r.warnings:
            if w not in verifying:
                self.warning(w)
        for n in r.notes:
            self.err.print(f"note: {n}", markup=False)
        secs = sum(r.seconds.values())
        self.out.print(f"wrote {r.output}: {r.nodes} nodes, {r.weights} weights "
                       f"({_mb(r.weight_bytes)}), {_mb(r.output_bytes)} on disk, {secs:.2f} s",
                       markup=False)
        if r.passes:
            changed = [p for p in r.passes if p["modified"]]
            skipped = sum(p.get("skipped", False) for p in r.passes)
            delta = r.passes[0]["nodes_before"] - r.passes[-1]["nodes_after"]
            more = f" ({skipped} more skipped: the model unchanged since their last run)" if skipped else ""
            self.out.print(f"passes: {len(r.passes) - skipped} run{more}, {len(changed)} changed the model, "
                           f"{abs(delta)} nodes {'removed' if delta >= 0 else 'added'}", markup=False)
            if verbose:
                self._pass_table(r.passes)
            self._explained(r.passes)
        if r.quantization:
            self._quantization(r.quantization, verbose)
        if r.target:
            for f in r.files:
                self.out.print(f"  {f}", markup=False)
        if r.verification and r.verification.get("kind") == "llm":
            from .llm.verify import LLMVerifyReport

            v = dict(r.verification)
            v.pop("ok", None)
            self.verified(LLMVerifyReport(**v))
        elif r.verification:
            from .reference import OutputCheck, VerifyReport

            v = dict(r.verification)
            v.pop("ok", None)
            v["outputs"] = [OutputCheck(**o) for o in v["outputs"]]
            self.verified(VerifyReport(**v))

    def _llm_verified(self, r) -> None:  # noqa: ANN001 - llm.verify.LLMVerifyReport
        self.out.print(f"verify {r.repository} (decoder LLM, {r.prompts} prompt(s), {r.steps} greedy steps each, "
                       f"against {r.reference}; prompt logits within atol {r.atol:g} and cosine >= {r.cosine}, "
                       "tokens identical):", markup=False)
        for x in r.results:
            state = "ok" if x["ok"] else f"FAILED: {x['why']}"
            first = "identical" if x["first_difference"] is None else f"first difference at step {x['first_difference']}"
            self.out.print(f"  prompt {x['index']} ({x['prompt_tokens']} tokens): logits max abs {x['logits_max_abs']:.3g}, "
                           f"cosine {x['logits_cosine']:.6f}; {x['steps']} tokens {first}  {state}", markup=False)
        for w in r.warnings:
            self.warning(w)

    def _explained(self, passes: list[dict]) -> None:
        """--explain-pass: the candidate sites where no rule fired, and why."""
        for p in passes:
            misses = p["stats"].get("not_fired")
            if misses is None:
                continue
            self.out.print(f"{p['name']}: {p['stats'].get('fired', 0)} fired, {len(misses)} candidate site(s) "
                           "did not:", markup=False)
            for m in misses:
                self.out.print(f"  {m['node']} ({m['op']}): {'; '.join(m['why'])}", markup=False)

    def _quantization(self, q: dict, verbose: bool) -> None:
        ratio = f"{q['compression']:.2f}x smaller" if q.get("compression") else "no change"
        what = "nodes (weights and activations)" if q["mode"] == "int8" else "weights"
        self.out.print(f"quantized {q['mode']}: {len(q['quantized'])} {what}, {len(q['skipped'])} skipped; "
                       f"weights {_mb(q['weight_bytes_before'])} -> {_mb(q['weight_bytes_after'])} "
                       f"({ratio})" + (f"; opset {q['opset']['from']} -> {q['opset']['to']}" if q.get("opset") else ""),
                       markup=False)
        reasons: dict[str, int] = {}
        for row in q["skipped"]:
            key = row["reason"].split(" (")[0] if row["reason"].startswith("too small") else row["reason"]
            reasons[key] = reasons.get(key, 0) + 1
        for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
            self.out.print(f"  skipped {count}: {reason}", markup=False)
        i8 = q.get("int8")
        if i8:
            measured = ", ".join(f"{m} {c:.6f}" for m, c in i8["methods"].items())
            self.out.print(f"  int8: {i8['method']} calibration on {i8['calibration_samples']} samples, "
                           f"{i8['activations']} activations (closeness to the float model on "
                           f"{i8['selection_samples']} selection samples: {measured})", markup=False)
            if i8["kept_nodes"]:
                self.out.print(f"  kept in float by the selection: {len(i8['kept_nodes'])} nodes "
                               f"(runs {', '.join(str(k + 1) for k in i8['kept_segments'])} of {i8['segments']}; "
                               f"{', '.join(i8['kept_nodes'][:6])}{' ...' if len(i8['kept_nodes']) > 6 else ''})",
                               markup=False)
        sel = q.get("selection")
        if sel and sel["kept"]:
            alone = sel["sensitivity"]
            self.out.print(f"  auto-exclude: {len(sel['kept'])} of {sel['layers']} layers kept in float "
                           f"(1 - cosine all quantized {sel['worst_1_minus_cos_all_quantized']:.3g} -> "
                           f"{sel['worst_1_minus_cos_selected']:.3g}; {_mb(sel['bytes_kept_in_float'])} not saved): "
                           + ", ".join(f"{k} ({alone[k]:.3g} alone)" for k in sel["kept"][:8])
                           + (" ..." if len(sel["kept"]) > 8 else ""), markup=False)
        if verbose:
            for row in q["quantized"]:
                rtn = f" (round to nearest: {row['rel_error_rtn']:.4f})" if "rel_error_rtn" in row else ""
                self.out.print(f"  {row['node'] or row['weight']} ({row['op']} {row['shape']}): "
                               f"{row['format']}, weight rel. error {row['rel_error']:.4f}{rtn}", markup=False)
        acc = q.get("accuracy")
        if acc:
            self.out.print(f"accuracy vs onnxruntime on the original, {acc['inputs']}:", markup=False)
            for o in acc["outputs"]:
                if o.get("exact_match") is not None:
                    self.out.print(f"  {o['name']}: {o['exact_match']:.4f} of its elements equal the original's "
                                   f"(an integer output: judged by match)", markup=False)
                    continue
                top1 = f", top-1 agreement {o['top1_agreement']:.4f}" if o["top1_agreement"] is not None else ""
                sl = (f", worst slice ({o['worst_slice']}) rel. error {o['slice_rel_error']:.4g}"
                      if o.get("slice_rel_error") is not None else "")
                self.out.print(f"  {o['name']}: cosine {o['cosine']:.6f}, max abs {o['max_abs']:.4g}, "
                               f"rel. error {o['rel_error']:.4g}{top1}{sl}", markup=False)

    def _pass_table(self, passes: list[dict]) -> None:
        if self.rich:
            from rich.table import Table

            t = Table(title="passes", title_justify="left")
            for c in ("pass", "round", "modified", "ms", "nodes", "stats"):
                t.add_column(c)
            for p in passes:
                t.add_row(p["name"], str(p["iteration"]), _modified(p),
                          f"{p['seconds'] * 1e3:.1f}", f"{p['nodes_before']} -> {p['nodes_after']}",
                          ", ".join(f"{k}={v}" for k, v in p["stats"].items()))
            self.out.print(t)
            return
        for p in passes:
            stats = ", ".join(f"{k}={v}" for k, v in p["stats"].items())
            self.out.print(f"  {p['name']} (round {p['iteration']}): "
                           f"{_modified(p, 'modified', 'unchanged')}, {p['seconds'] * 1e3:.1f} ms, "
                           f"nodes {p['nodes_before']} -> {p['nodes_after']} {stats}", markup=False)

    # -- verify -------------------------------------------------------------------------------
    def verified(self, r) -> None:  # noqa: ANN001 - verify.VerifyReport
        if self.json_mode:
            self.json(r.to_dict())
            return
        if getattr(r, "kind", None) == "llm":
            self._llm_verified(r)
            return
        ref = "" if getattr(r, "reference", "onnxruntime") == "onnxruntime" else f", original run by {r.reference}"
        inp = r.inputs or {}
        how = (f", inputs from {inp['from']}" if "from" in inp else
               f", sizes {', '.join(f'{k}={v}' for k, v in inp['sizes'].items())}" if inp.get("sizes") else "")
        what = (f"{r.quantization_level} model" if r.quantization_level not in ("", "none") else
                "its precision")
        judged = (f"{what} judged by the budget {', '.join(f'{k}={v:g}' for k, v in r.budget.items())} "
                  "(worst sample)" if getattr(r, "budget", None) else f"atol {r.atol}, rtol {r.rtol}")
        served = getattr(r, "execution", "onnxruntime/f32")
        served = "" if served == "onnxruntime/f32" else f", served with {served}"
        self.out.print(f"verify {r.repository} ({r.backend} backend{served}, {r.samples} sample(s){how}, "
                       f"{judged}{ref}):", markup=False)
        if getattr(r, "budget", None) and "from" not in inp:
            self.out.print(f"  note: judged on {r.samples} random samples drawn apart from those the conversion "
                           "chose by (its layer selection, its execution)", markup=False)
        if getattr(r, "pinned_random", 0):
            self.out.print(f"  note: the model is stochastic: its {r.pinned_random} random node(s) were seeded alike in "
                           "both models for this check (the served model keeps its randomness)", markup=False)
        for note in inp.get("notes", []):
            self.out.print(f"  note: {note}", markup=False)
        for o in r.outputs:
            state = "ok" if o.ok else "FAILED"
            if o.ok and not o.exercised:
                state = "ok, NOT EXERCISED (within atol of zero or constant on every sample: give --inputs)"
            if getattr(o, "shape", ""):
                self.out.print(f"  {o.name}: shape {o.shape}  FAILED", markup=False)
                continue
            if getattr(o, "exact_match", None) is not None:
                self.out.print(f"  {o.name}: {o.exact_match:.4f} of its elements equal the original's  {state}",
                               markup=False)
                continue
            sl = (f", worst slice ({o.worst_slice}) rel {o.slice_rel_error:.3g}"
                  if getattr(o, "slice_rel_error", None) is not None else "")
            self.out.print(f"  {o.name}: max abs {o.max_abs:.3g}, max rel {o.max_rel:.3g}, "
                           f"cosine {o.cosine:.6f}{sl}  {state}", markup=False)
        for w in getattr(r, "warnings", None) or ():
            self.warning(w)
        for o in getattr(r, "at_basic_level", None) or ():
            self.out.print(f"  {o['name']} against onnxruntime's basic optimization (its extended fusions off; QDQ weights "
                           f"dequantized by its constant folding): max abs {o['max_abs']:.3g}, max rel {o['max_rel']:.3g}, "
                           f"cosine {o['cosine']:.6f}  (reported, not judged)", markup=False)

    # -- zoo ----------------------------------------------------------------------------------
    def zoo_progress(self):  # noqa: ANN201 - a context manager yielding the progress callback
        import contextlib

        @contextlib.contextmanager
        def manager():  # noqa: ANN202
            if self.rich and self.err.is_terminal:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

                with Progress(TextColumn("zoo"), BarColumn(), MofNCompleteColumn(),
                              TextColumn("{task.description}"), console=self.err.console) as p:
                    task = p.add_task("", total=None)

                    def cb(r, done, total):  # noqa: ANN001, ANN202
                        p.update(task, completed=done, total=total, description=f"{r.name}: {r.status}")
                    yield cb
                return

            def plain(r, done, total):  # noqa: ANN001, ANN202
                if not self.json_mode:
                    # a failure's reason is printed once, as an error line at the end
                    why = f": {r.reason}" if r.reason and r.status != "failed" else ""
                    self.out.print(f"[{done}/{total}] {r.name}: {r.status} ({r.seconds:.2f} s){why}", markup=False)
            yield plain

        return manager()

    def zoo_done(self, summary: dict, results) -> None:  # noqa: ANN001 - zoo.summary(), ZooResults
        counts, wall = summary["counts"], summary["seconds"]
        if self.json_mode:
            self.json(summary)
            return
        self.out.print(f"zoo: {len(results)} models in {wall:.2f} s: {counts['converted']} converted, "
                       f"{counts['cached']} cached, {counts['failed']} failed", markup=False)
        for r in results:
            if r.status == "failed":
                self.err.print(f"error: {r.name}: {r.reason}", markup=False)

    # -- inspect ------------------------------------------------------------------------------
    def summary(self, s: ModelSummary, path: str) -> None:
        if self.json_mode:
            self.json({"path": path, **s.to_dict()})
            return
        opsets = ", ".join(f"{d or 'ai.onnx'}:{v}" for d, v in s.opsets.items())
        head = [f"{path} ({s.format}, ir_version {s.ir_version}, producer {s.producer or '-'})",
                f"opsets: {opsets}",
                f"nodes: {s.nodes} (in {s.subgraphs} subgraphs too)" if s.subgraphs else f"nodes: {s.nodes}",
                f"weights: {s.weights} tensors, {_mb(s.weight_bytes)} "
                + "(" + ", ".join(f"{k} {_mb(v)}" for k, v in s.weight_bytes_by_dtype.items()) + ")",
                f"symbols: {', '.join(s.symbols) or '-'}"]
        if s.functions:
            head.append(f"functions: {', '.join(s.functions)}")
        for line in head:
            self.out.print(line, markup=False)
        for title, vals in (("inputs", s.inputs), ("outputs", s.outputs)):
            if self.rich:
                from rich.table import Table

                t = Table(title=title, title_justify="left")
                for c in ("name", "dtype", "shape", "layout"):
                    t.add_column(c)
                for v in vals:
                    t.add_row(v.name, v.dtype or v.type, _shape(v.shape), v.layout)
                self.out.print(t)
            else:
                self.out.print(f"{title}:", markup=False)
                for v in vals:
                    served = (" (a scalar: a Triton entry declares it [1], clients send one element)"
                              if v.served_shape else "")
                    self.out.print(f"  {v.name}: {v.dtype or v.type} {_shape(v.shape)} layout={v.layout}{served}",
                                   markup=False)
        ops = ", ".join(f"{k} {n}" for k, n in s.op_histogram.items())
        self.out.print(f"ops: {ops}", markup=False)
        for title, lines in (("shape conflicts", s.shape_conflicts),
                             ("shape assumptions (dims the ops need equal)", s.shape_assumptions)):
            if lines:
                self.out.print(f"{title}:", markup=False)
                for line in lines:
                    self.out.print(f"  {line}", markup=False)
        if s.input_sizes.get("error"):
            self.out.print(f"input sizes: none found: {s.input_sizes['error']}", markup=False)
        elif s.input_sizes:
            self.out.print("input sizes checks use (verify, deploy's smoke test, warm-up):", markup=False)
            for sym, info in s.input_sizes.items():
                self.out.print(f"  {sym} = {info['size']}", markup=False)
                for c in info["constraints"][:6]:
                    self.out.print(f"    needs {c}", markup=False)
                if len(info["constraints"]) > 6:
                    self.out.print(f"    and {len(info['constraints']) - 6} more", markup=False)
        if s.llm:
            m = s.llm
            per = m.get("cache_bytes_per_token")
            self.out.print(f"decoder LLM: {m.get('architecture') or '?'}, {m['layers']} layers, {m.get('heads') or '?'} heads, "
                           f"{m.get('kv_heads') or '?'} KV heads of size {m.get('head_size') or '?'}, context "
                           f"{m.get('context') or '?'}, vocab {m.get('vocab') or '?'}", markup=False)
            if per:
                full = f", {per * m['context'] / 2**20:.0f} MiB at the full context" if m.get("context") else ""
                self.out.print(f"  KV cache: {per:,} bytes a token in float32 ({per * 1024 / 2**20:.1f} MiB per 1024 "
                               f"tokens{full})", markup=False)
        if s.state_pairs:
            self.out.print("state (an input the model reads its state from -> the output of the next state):",
                           markup=False)
            for p in s.state_pairs:
                self.out.print(f"  {p['input']} -> {p['output']} ({p['kind']}: {p['why']})", markup=False)
        for p in getattr(s, "state_proposed", None) or ():
            self.out.print(f"state, proposed (not used): {p['input']} -> {p['output']} ({p['why']}); "
                           f"--state {p['input']}={p['output']} serves it so", markup=False)
        if s.no_shape_rule:
            self.out.print("ops without a shape rule (declared dims kept): "
                           + ", ".join(f"{k} {n}" for k, n in s.no_shape_rule.items()), markup=False)
        if s.values is not None:
            self.out.print("values:", markup=False)
            for v in s.values:
                self.out.print(f"  {v.name}: {v.dtype or v.type} {_shape(v.shape)}", markup=False)


def _shape(shape: list | None) -> str:
    from .ir.dims import format_shape  # (the IR imports numpy: only when a shape is printed)

    return format_shape(None if shape is None else tuple(shape))


def _mb(n: int) -> str:
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1024 * 1024):.1f} MiB"


def _modified(p: dict, yes: str = "yes", no: str = "no") -> str:
    """A pass record's outcome: changed the model, did not, or was not run (skipped)."""
    return "skipped" if p.get("skipped") else yes if p["modified"] else no
