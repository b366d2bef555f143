"""The measurement commands: bench (a served model under load, cold starts) and tune (the
serving settings within a p99 SLO)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from mcp_compiler.cli.common import Choice, DebugOpt, JsonOpt, parse_dims, reporter, run
from mcp_compiler.errors import UsageError
from mcp_compiler.report import one_line

from .commands_common import TRITON_PORTS, ConnectionFlags, command, with_connection


def _numbers(text: str | None, flag: str, kind: type) -> list:
    if text is None:
        return []
    out = []
    for piece in text.split(","):
        try:
            v = kind(piece.strip()) if piece.strip().isascii() else None   # int() takes '٣' as 3
        except ValueError:
            v = None
        if v is None or v <= 0 or (kind is float and v != v) or v > 1e6:
            raise UsageError(f"{flag}: expected positive numbers separated by commas, got {piece.strip()!r}")
        out.append(v)
    return out


def _loads(concurrency: str | None, rate: str | None, default: str | None = "1,8,32") -> list:
    from .loadgen import Load

    loads = [Load(concurrency=c) for c in _numbers(concurrency, "--concurrency", int)]
    loads += [Load(rate=r) for r in _numbers(rate, "--rate", float)]
    if not loads and default:
        loads = [Load(concurrency=c) for c in _numbers(default, "--concurrency", int)]
    return loads


def _cold(rep, target: str, remote, runs: int, metrics_url: Optional[str], inputs, dims, json_out: bool) -> None:  # noqa: ANN001
    from .bench import served
    from .cold import cold

    say = _progress(rep)
    with served(target, remote, inputs=inputs, dims=parse_dims(dims)) as s:
        url, guessed = metrics_url, False
        if url is None and s.server is not None:
            url = f"http://{s.server.metrics_url}/metrics"
        elif url is None:   # as `status --metrics`: the --url's host, Triton's metrics port
            url, guessed = f"http://{s.conn.url.rpartition(':')[0]}:{TRITON_PORTS['metrics']}/metrics", True
        r = cold(s, runs, url, guessed=guessed, progress=lambda k, run: say(
            f"cold start {k + 1} of {runs}: READY in {run.load_s:.2f} s, first request {run.first_ms:.1f} ms"))
    rep.json({"cold": r.to_dict()})
    if json_out:
        return
    rep.out.print(f"cold start of {r.model} on {r.url} ({len(r.runs)} runs; load: the load request until READY)",
                  markup=False)
    head = (f"{'run':<5}{'load s':>8}{'import s':>9}{'read s':>8}{'session s':>10}{'other s':>9}{'first ms':>10}"
            f"{'server ms q/in/infer/out':>28}{'warm-up ms':>12}{'p50 ms':>9}{'p99 ms':>9}")
    rep.out.print(head, markup=False)

    def f(v, fmt: str) -> str:  # noqa: ANN001
        return "-" if v is None else format(v, fmt)

    for k, c in enumerate(r.runs, 1):
        rt = c.runtime_s or {}
        sv = c.server_ms
        split = f"{sv['queue']:.1f}/{sv['input']:.1f}/{sv['infer']:.1f}/{sv['output']:.1f}"
        rep.out.print(f"{k:<5}{c.load_s:>8.3f}{f(rt.get('import'), '.3f'):>9}{f(rt.get('read'), '.3f'):>8}"
                      f"{f(rt.get('session'), '.3f'):>10}{f(c.other_s, '.3f'):>9}{c.first_ms:>10.2f}{split:>28}"
                      f"{c.warmup_ms:>12.2f}{c.steady_p50_ms:>9.2f}{c.steady_p99_ms:>9.2f}", markup=False)
    med = r.to_dict()["median"]
    rep.out.print(f"median: load {med['load_s']:.3f} s, first request {med['first_ms']:.2f} ms "
                  f"(warm-up {med['warmup_ms']:.2f} ms over the steady p50 {med['steady_p50_ms']:.2f} ms)", markup=False)
    for note in r.notes:
        rep.out.print(f"note: {note}", markup=False)


def _progress(rep):  # noqa: ANN001, ANN202
    def say(line: str) -> None:
        if not rep.json_mode:
            rep.err.print(line, markup=False)
    return say


@command("bench", "mcp-cli bench model_repository/model",
         "mcp-cli bench repo/model --concurrency 1,8,32 --batch-size 4 --json",
         "mcp-cli bench repo/model --rate 200,800 --seconds 10 --csv points.csv",
         "mcp-cli bench mymodel --url grpc://127.0.0.1:8001 --concurrency 16")
@with_connection("A running Triton's gRPC address, grpc://HOST:PORT or HOST:PORT (default: start a local one "
                 "for DIR/NAME).", grpc_only=True)
def bench(
    target: str = typer.Argument(..., help="DIR/NAME: a repository entry (a local Triton is started for it); "
                                 "or NAME with --url: a model a running server has.", show_default=False),
    concurrency: Optional[str] = typer.Option(None, "--concurrency", "-c", metavar="N[,N...]",
                                              help="Closed loop: N clients, each sending when its last "
                                                   "request returns (default: 1,8,32)."),
    rate: Optional[str] = typer.Option(None, "--rate", metavar="R[,R...]",
                                       help="Open loop: Poisson arrivals at R requests/s."),
    batch_size: int = typer.Option(1, "--batch-size", "-b", min=1, help="Rows per request (batching models)."),
    seconds: Optional[float] = typer.Option(None, "--seconds", min=0.1, help="Measure each point for this long "
                                            "(default: 2 s windows until three agree within 10%)."),
    window_s: float = typer.Option(2.0, "--window-s", min=0.1, help="Measurement window, seconds."),
    max_windows: int = typer.Option(10, "--max-windows", min=3, max=10_000, help="Windows before giving up on stability."),
    inputs: Optional[Path] = typer.Option(None, "--inputs", help="The request: the first sample of this .npz "
                                          "(or folder of them), arrays named like the inputs."),
    dims: Optional[str] = typer.Option(None, "--dims", metavar="NAME=SIZE[,...]",
                                       help="Request sizes: the model's symbols (DIR/NAME), or INPUT.AXIS / '*' "
                                            "for a remote model's -1 dims (default: free dims at 128)."),
    slo_p99_ms: Optional[float] = typer.Option(None, "--slo-p99-ms", help="Also report each point's SLO "
                                               "attainment: the fraction of requests within this latency."),
    sequence_length: Optional[int] = typer.Option(None, "--sequence-length", min=1, max=1_000_000,
                                                  help="A stateful model: each client streams sequences of N "
                                                       "requests (one correlation ID each; default 1)."),
    cold_start: bool = typer.Option(False, "--cold", help="Measure cold starts instead: N times unload, load "
                                    "(to READY), first request, steady state; with the runtime's load phases."),
    cold_runs: int = typer.Option(3, "--cold-runs", min=1, max=100, help="--cold: how many cold starts."),
    metrics_url: Optional[str] = typer.Option(None, "--metrics-url", help="--cold with --url: the server's "
                                              "metrics endpoint, for the runtime's load phases (default: the "
                                              "--url's host, port 8002, as `status --metrics`)."),
    csv_path: Optional[Path] = typer.Option(None, "--csv", dir_okay=False, help="Also write the points as CSV."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --csv file."),
    prompt_words: int = typer.Option(96, "--prompt-words", min=1, max=100_000, rich_help_panel="LLM",
                                     help="LLM entry: words of each request's own prompt."),
    output_tokens: int = typer.Option(64, "--output-tokens", min=1, max=100_000, rich_help_panel="LLM",
                                      help="LLM entry: tokens each stream generates (past the end token)."),
    shared_prefix: int = typer.Option(0, "--shared-prefix", min=0, max=100_000, rich_help_panel="LLM",
                                      help="LLM entry: words every prompt starts with (a dialogue's history: "
                                      "the prefix cache's load)."),
    requests_per_client: int = typer.Option(2, "--requests-per-client", min=1, max=10_000, rich_help_panel="LLM",
                                            help="LLM entry: streams each client runs, one after the other."),
    conn: ConnectionFlags = None, json_out: bool = JsonOpt, debug: bool = DebugOpt,
) -> None:
    """Measure a served model under load: throughput, p50/p90/p99 latency, errors, and the server's
    own split (queue vs compute, average batch) from Triton's statistics, per load point.

    An LLM generation entry is measured as streams instead: at each --concurrency, clients each
    running --requests-per-client streams of --output-tokens; time to first token and between
    tokens (p50/p99), tokens/s a stream and in all, the prefix hit rate, and the pool's peak
    blocks (from the server's metrics: --metrics-url for a --url server).

    The request is what the model accepts, as verify makes it, with free dims (a sequence length,
    an image side) at 128 unless --dims says otherwise; its shapes are printed first. An open-loop
    point that serves under 95% of the requests it issued (or issues short of the rate beyond
    Poisson noise), or whose p99 passes the queue timeout, is marked saturated. The client
    is tritonclient's asyncio gRPC client in this process; its CPU use is reported, so a saturated
    client shows. Exit 1 when the server cannot be reached or lacks the statistics extension; exit
    2 for bad flags.
    """
    rep = reporter(json_out)

    def body() -> None:
        from mcp_compiler.files import check_output

        from .bench import bench as run_bench

        if metrics_url is not None:
            from .metrics import metrics_url as checked_url

            checked_url(metrics_url)
        if cold_start:
            ignored = [f for f, v in (("--concurrency", concurrency), ("--rate", rate), ("--csv", csv_path),
                                      ("--seconds", seconds), ("--slo-p99-ms", slo_p99_ms),
                                      ("--sequence-length", sequence_length)) if v is not None]
            if ignored:
                raise UsageError(f"{ignored[0]} does not go with --cold (a cold start is measured with "
                                 "sequential requests; --cold-runs sets how many)")
            return _cold(rep, target, conn.connection(required=False), cold_runs, metrics_url, inputs, dims, json_out)
        remote = conn.connection(required=False)
        if _generation(target, remote):
            if rate is not None or sequence_length is not None or batch_size != 1 or inputs is not None:
                raise UsageError("an LLM generation entry is measured with --concurrency, --prompt-words, "
                                 "--output-tokens and --shared-prefix (not --rate, --batch-size, --inputs or "
                                 "--sequence-length)")
            return _bench_llm(rep, target, remote, concurrency, metrics_url, json_out, csv_path, force,
                              prompt_words=prompt_words, output_tokens=output_tokens, shared_prefix=shared_prefix,
                              per_client=requests_per_client)
        if metrics_url is not None:
            raise UsageError("--metrics-url goes with --cold (or an LLM entry)")
        loads = _loads(concurrency, rate)
        if csv_path is not None:
            check_output(csv_path, "--csv", force=force)
        if slo_p99_ms is not None and not 0 < slo_p99_ms < float("inf"):
            raise UsageError(f"--slo-p99-ms must be a positive number, got {slo_p99_ms}")
        say = _progress(rep)

        def shown(shapes: dict, notes: list[str]) -> None:
            say(f"request: {_shapes_text(shapes)}")

        r = run_bench(target, loads, remote, batch_size=batch_size, window_s=window_s, max_windows=max_windows,
                      seconds=seconds, inputs=inputs, dims=parse_dims(dims), slo_ms=slo_p99_ms, on_inputs=shown,
                      sequence_length=sequence_length,
                      progress=lambda k, n, load: say(f"point {k + 1} of {n}: {load.label}"),
                      window_progress=lambda k, rate, p99: say(
                          f"  window {k}: {rate:.1f} req/s, p99 {'-' if p99 is None else f'{p99:.2f}'} ms"))
        if csv_path is not None:
            _write_csv(csv_path, [p.to_dict() for p in r.points])
        rep.json(r.to_dict())
        if not json_out:
            _bench_table(rep, r)
        if r.points and all(p.throughput == 0 and p.errors > 0 for p in r.points):
            from .bench import BenchFailedError

            sample = next((p.error_sample for p in r.points if p.error_sample), None)
            raise BenchFailedError(f"every request failed at every load point ({sum(p.errors for p in r.points)} "
                                   f"errors){f': {sample}' if sample else ''}")
        empty = [p for p in r.points if p.requests == 0 and p.errors == 0]
        if empty:   # nothing completed and nothing failed: a request outlasts the windows
            from .bench import BenchFailedError

            p = empty[0]
            raise BenchFailedError(f"load point {p.load} completed no request in {p.seconds:.1f} s (none failed "
                                   "either: one request takes longer than the measurement); give --seconds or "
                                   "--window-s longer than a request takes")

    run(rep, debug, body)


def _generation(target: str, remote) -> bool:  # noqa: ANN001 - client.Connection or None
    """Whether the target is an LLM generation entry (its config, local or the server's)."""
    from .bench import is_entry
    from .entry import read_config
    from .lifecycle import remote_config
    from .runtime import params as P

    if is_entry(target):
        return P.GENERATION in read_config(target).parameters
    if remote is None:
        return False
    from mcp_compiler.errors import McpError

    try:
        return P.GENERATION in remote_config(remote, str(target)).parameters
    except McpError:   # unreachable, unknown model: bench's own path reports it as it always has
        return False


def _bench_llm(rep, target: str, remote, concurrency: str | None, metrics_url: str | None, json_out: bool,  # noqa: ANN001
               csv_path: Path | None, force: bool, **kw) -> None:
    from mcp_compiler.cli.common import parse_ints
    from mcp_compiler.files import check_output

    from .bench import BenchFailedError, served
    from .llm_bench import HEADERS, measure_llm, table_rows

    levels = parse_ints(concurrency, "--concurrency") if concurrency else [1, 8]
    if any(n < 1 or n > 1024 for n in levels):
        raise UsageError("--concurrency: each level must be from 1 to 1024 streams")
    if csv_path is not None:
        check_output(csv_path, "--csv", force=force)
    if metrics_url is not None:
        from .metrics import metrics_url as checked_url

        checked_url(metrics_url)
    say = _progress(rep)
    with served(target, remote) as s:
        url = metrics_url or (f"http://{s.server.metrics_url}" if s.server is not None else None)
        points = measure_llm(s.conn, s.name, levels, metrics_url=url, progress=say, **kw)
        where = s.conn.describe()
    out = {"model": s.name, "url": where, "kind": "llm", "settings": kw, "points": [p.to_dict() for p in points],
           "notes": [] if url else ["no --metrics-url: the pool's peak is not measured"]}
    if csv_path is not None:
        _write_csv(csv_path, out["points"])
    rep.json(out)
    if not json_out:
        prefix = f" after a shared {kw['shared_prefix']}-word prefix" if kw["shared_prefix"] else ""
        rep.out.print(f"{s.name} on {where}: {kw['output_tokens']} tokens a stream, {kw['prompt_words']} words of "
                      f"prompt{prefix}", markup=False)
        rows = [HEADERS, *table_rows(points)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(HEADERS))]
        for r in rows:
            rep.out.print("  ".join(v.rjust(w) for v, w in zip(r, widths)), markup=False)
        rep.out.print("N streams; ttft/tbt: time to first token / between tokens in ms (p50, p99); tok/s 1: a "
                      "stream's; hits: prompt tokens the prefix cache held; blocks: the pool's peak / total",
                      markup=False)
        for n in out["notes"]:
            rep.out.print(f"note: {n}", markup=False)
    if points and all(p.errors == p.requests for p in points):
        raise BenchFailedError(f"every stream failed: {points[0].first_error}")


def _write_csv(path: Path, rows: list[dict]) -> None:
    import csv
    import io
    import os

    buf = io.StringIO()
    keys = [k for k in rows[0] if k != "notes"] if rows else []
    w = csv.DictWriter(buf, fieldnames=keys, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(buf.getvalue(), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _shapes_text(shapes: dict[str, dict]) -> str:
    """bench.shapes_of() as a line: `input_ids int64[1, 128], mask int64[1, 128]`."""
    return ", ".join(f"{k} {v['dtype']}[{', '.join(map(str, v['shape']))}]" for k, v in shapes.items())


def _bench_table(rep, r) -> None:  # noqa: ANN001 - bench.BenchReport
    def f(v, fmt: str = "{:.2f}") -> str:  # noqa: ANN001
        return "-" if v is None else fmt.format(v)

    rep.out.print(f"{r.model} on {r.url}, batch {r.batch_size}; request {_shapes_text(r.inputs)}", markup=False)
    slo = any(p.slo_attainment is not None for p in r.points)
    head = f"{'load':<18}{'req/s':>10}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'errors':>8}{'queue ms':>10}" \
           f"{'compute ms':>12}{'batch':>7}{'client cpu':>12}{'stable':>8}{'saturated':>11}" + (f"{'in SLO':>8}" if slo else "")
    rep.out.print(head, markup=False)
    for p in r.points:
        stable = "yes" if p.stable else (f"no cv {p.cv:.0%}" if p.cv is not None else "no") if p.stable is False else "-"
        rep.out.print(f"{p.load:<18}{p.throughput:>10.1f}{f(p.p50_ms):>9}{f(p.p90_ms):>9}{f(p.p99_ms):>9}"
                      f"{p.errors:>8}{f(p.queue_ms):>10}{f(p.compute_ms):>12}{f(p.avg_batch):>7}"
                      f"{p.client_cpu:>11.0%} {stable:>7}{('YES' if p.saturated else 'no'):>11}"
                      + (f"{f(p.slo_attainment, '{:.1%}'):>8}" if slo else ""), markup=False)
        if p.error_sample:
            rep.out.print(f"  first error: {p.error_sample}", markup=False)
        for note in p.notes:
            rep.out.print(f"  note: {note}", markup=False)
    for note in r.notes:
        rep.out.print(f"note: {note}", markup=False)


class Objective(Choice):
    throughput = "throughput"
    latency = "latency"


@command("tune", "mcp-cli tune repo/model --slo-p99-ms 20 --concurrency 16",
         ("mcp-cli tune repo/model --slo-p99-ms 5 --rate 500 --budget-s 300",
          "  --report r.json --plot p.png"),
         "mcp-cli tune repo/model --slo-p99-ms 10 --objective latency --apply")
def tune(
    entry: Path = typer.Argument(..., help="The repository entry to tune: DIR/NAME."),
    slo_p99_ms: float = typer.Option(..., "--slo-p99-ms", help="The latency SLO: p99 in milliseconds."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", "-c", min=1,
                                              help="The load: N clients in closed loop (default 8)."),
    rate: Optional[float] = typer.Option(None, "--rate", help="The load: R requests/s, Poisson arrivals."),
    objective: Objective = typer.Option(Objective.throughput, "--objective", case_sensitive=False,
                                        help="throughput: the most req/s whose p99 meets the SLO; latency: "
                                             "the lowest p99 at this load."),
    budget_s: float = typer.Option(120.0, "--budget-s", help="Time for the whole search, seconds."),
    window_s: float = typer.Option(1.0, "--window-s", min=0.1, help="Measurement window, seconds."),
    inputs: Optional[Path] = typer.Option(None, "--inputs", help="The request: the first sample of this .npz."),
    dims: Optional[str] = typer.Option(None, "--dims", metavar="NAME=SIZE[,...]",
                                       help="Request sizes by the model's symbols (default: free dims at 128)."),
    pairs: int = typer.Option(5, "--confirm-pairs", min=3, max=50,
                              help="Pairs of baseline/best re-measurements that confirm the best."),
    margin: float = typer.Option(0.05, "--margin", min=0.0, max=10.0,
                                 help="The confirmed gain must exceed 1 + margin at the interval's lower end."),
    report_path: Optional[Path] = typer.Option(None, "--report", dir_okay=False, help="Write the report as JSON."),
    plot_path: Optional[Path] = typer.Option(None, "--plot", dir_okay=False,
                                             help="Write p99 vs throughput of every trial as a PNG."),
    apply_best: bool = typer.Option(False, "--apply", help="Rewrite the entry's config.pbtxt with the best setting, "
                                    "when the pairs confirm it beat the baseline beyond noise."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing --report / --plot files."),
    kv_memory: Optional[str] = typer.Option(None, "--kv-memory", metavar="BYTES", rich_help_panel="LLM",
                                            help="LLM entry: the memory the KV-cache pool may take (e.g. 1GiB; "
                                            "default: the entry's pool, else 512MiB)."),
    prompt_words: int = typer.Option(64, "--prompt-words", min=1, max=100_000, rich_help_panel="LLM",
                                     help="LLM entry: words of each stream's prompt."),
    output_tokens: int = typer.Option(32, "--output-tokens", min=1, max=100_000, rich_help_panel="LLM",
                                      help="LLM entry: tokens each stream generates."),
    json_out: bool = JsonOpt, debug: bool = DebugOpt,
) -> None:
    """Choose the serving parameters (dynamic batching and queue delay, instances and threads,
    batch sizes) that give the most throughput within a p99 latency SLO, measured on a local Triton.

    The entry's own config is the baseline; each trial reloads the model with a config override.
    The best is then re-measured against the baseline in alternating pairs: --apply writes it only
    when the median paired ratio's 90% interval is above 1 + --margin (otherwise: "no configuration
    beat the baseline beyond noise", config untouched, exit 0). Progress goes to stderr. Exit 1 when no trial meets the SLO (naming the
    best p99 seen; the report and plot are still written); exit 2 for bad flags or a budget too small
    for one trial. Ctrl-C reloads the original config and stops the server.

    An LLM generation entry is tuned for a p99 time between tokens (--slo-p99-ms) instead: the
    sequences run at once (max_concurrent_requests) and the pool within --kv-memory, under
    --concurrency streams (default 16), confirmed in pairs the same way.
    """
    rep = reporter(json_out)

    def body() -> None:
        from mcp_compiler.files import check_output

        if _generation(str(entry), None):
            return _tune_llm(rep, entry, slo_p99_ms, concurrency, kv_memory, budget_s, pairs, margin, apply_best,
                             report_path, force, json_out, prompt_words=prompt_words, output_tokens=output_tokens)
        if kv_memory is not None:
            raise UsageError("--kv-memory goes with an LLM entry")

        from .loadgen import Load
        from .tune import SloNotMetError, apply, write_report
        from .tune import tune as run_tune
        from .tune_plot import plot

        if concurrency is not None and rate is not None:
            raise UsageError("give one load: --concurrency or --rate")
        if rate is not None and not rate > 0:
            raise UsageError(f"--rate must be positive, got {rate}")
        if not slo_p99_ms > 0:
            raise UsageError(f"--slo-p99-ms must be positive, got {slo_p99_ms}")
        for path, flag in ((report_path, "--report"), (plot_path, "--plot")):
            if path is not None:
                check_output(path, flag, force=force, inputs=(entry / "config.pbtxt",))
        if plot_path is not None:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise UsageError("--plot needs matplotlib: pip install 'mcp-cli[serve]'") from None
        load = Load(rate=rate) if rate is not None else Load(concurrency=concurrency or 8)
        r = run_tune(entry, load, slo_p99_ms, budget_s=budget_s, objective=str(objective), window_s=window_s,
                     inputs=inputs, progress=_progress(rep), dims=parse_dims(dims), pairs=pairs, margin=margin)
        if apply_best and r.confirmed:
            r.applied = str(apply(entry, r.best.setting, r.config))
        if r.best is not None and r.best.confirmation is not None:
            r.best.confirmation["applied"] = bool(r.applied)
        if report_path is not None:
            write_report(r, report_path)
        if plot_path is not None:
            plot(r, plot_path)
        rep.json(r.to_dict())
        for n in r.notes:   # (why a stage was not searched, why it stopped): on stderr too, not only the report
            rep.err.print(f"note: {one_line(n)}", markup=False)
        if not json_out:
            _tuned(rep, r, apply_best)
        if r.best is None:
            from .tune import describe as _short

            t = _closest_trial(r)
            best_p99 = (f"{t.point.p99_ms} ms ({_short(t.setting)}, {t.point.throughput:.1f} req/s)" if t
                        else "none (every trial failed)")
            raise SloNotMetError(f"no trial met p99 <= {slo_p99_ms:g} ms at {r.load} without errors; "
                                 f"the best p99 seen: {best_p99}")

    run(rep, debug, body)


def _tune_llm(rep, entry: Path, slo: float, clients: int | None, kv_memory: str | None, budget_s: float,  # noqa: ANN001
              pairs: int, margin: float, apply_best: bool, report_path: Path | None, force: bool,
              json_out: bool, **load) -> None:
    import json

    from mcp_compiler.files import check_output

    from .flags import parse_bytes
    from .llm_tune import apply_llm, tune_llm
    from .tune import SloNotMetError

    if not slo > 0:
        raise UsageError(f"--slo-p99-ms must be positive, got {slo}")
    budget = parse_bytes(kv_memory, "--kv-memory") if kv_memory is not None else None
    if report_path is not None:
        check_output(report_path, "--report", force=force, inputs=(entry / "config.pbtxt",))
    r = tune_llm(entry, slo, clients=clients or 16, memory_budget=budget, pairs=pairs, margin=margin,
                 budget_s=budget_s, progress=_progress(rep), **load)
    if apply_best and r.confirmed and r.best is not None:
        r.applied = str(apply_llm(entry, r.best))
    out = r.to_dict()
    if report_path is not None:
        report_path.write_text(json.dumps(out, indent=2), encoding="utf-8")
    rep.json(out)
    if not json_out:
        rep.out.print(f"{r.model}: {r.clients} streams, SLO p99 time between tokens {slo:g} ms, pool within "
                      f"{r.memory_budget / 2**20:.0f} MiB: {len(r.trials)} trials in {r.spent_s:.0f} s", markup=False)
        for t in r.trials:
            mark = "ok " if t.meets_slo else "   "
            errs = f", {t.errors} errors" if t.errors else ""
            rep.out.print(f"  {mark}{t.max_running:>3} at once: {t.aggregate_tps:7.1f} tok/s, tbt p99 {t.tbt_p99_ms:.1f} "
                          f"ms, ttft p99 {t.ttft_p99_ms:.0f} ms{errs}", markup=False)
        if r.best is not None:
            rep.out.print(f"  best: max_concurrent_requests {r.best.max_running}", markup=False)
        if r.confirmation:
            rep.out.print(f"  confirmation ({len(r.confirmation['pairs'])} pairs): {r.confirmation['verdict']}",
                          markup=False)
        if r.applied:
            rep.out.print(f"  applied to {r.applied}", markup=False)
        elif apply_best:
            why = ("the entry's own setting is the best" if r.best and not r.confirmation
                   else "no setting beat the entry's beyond noise" if r.best else "no setting met the SLO")
            rep.out.print(f"  not applied: {why}", markup=False)
        for n in r.notes:
            rep.out.print(f"  note: {n}", markup=False)
    if r.best is None:
        low = min(r.trials, key=lambda t: t.tbt_p99_ms) if r.trials else None
        raise SloNotMetError(f"no setting met p99 time between tokens <= {slo:g} ms with {r.clients} streams"
                             + (f"; the lowest: {low.tbt_p99_ms} ms ({low.max_running} at once)" if low else ""))


def _tuned(rep, r, apply_best: bool) -> None:  # noqa: ANN001 - tune.TuneReport
    from .tune import describe as _short

    b, best = r.baseline, r.best
    rep.out.print(f"{r.model} at {r.load}, SLO p99 {r.slo_p99_ms:g} ms: {len(r.trials)} trials in {r.spent_s:.0f} s",
                  markup=False)
    if b.point is not None:
        rep.out.print(f"  baseline  {_short(b.setting)}: {b.point.throughput:.1f} req/s, p99 {b.point.p99_ms} ms",
                      markup=False)
    if best is not None:
        gain = f" ({best.point.throughput / b.point.throughput:.2f}x the baseline)" if b.point and b.point.throughput else ""
        rep.out.print(f"  best      {_short(best.setting)}: {best.point.throughput:.1f} req/s, p99 {best.point.p99_ms} ms"
                      f"{gain}", markup=False)
    if r.timeout_trial is not None and r.timeout_trial.point is not None:
        t = r.timeout_trial.to_dict()
        rep.out.print(f"  with inference_timeout_ms {r.timeout_trial.setting.inference_timeout_ms}: "
                      f"{t['rejected_fraction']:.1%} of requests rejected, p99 {t['p99_ms']} ms", markup=False)
    c = best.confirmation if best is not None else None
    if c is not None:
        rep.out.print(f"  confirmation ({len(c['pairs'])} alternating pairs): {c['verdict']}", markup=False)
    if r.applied:
        rep.out.print(f"  applied to {r.applied}", markup=False)
    elif apply_best:
        why = (_closest(r) if best is None
               else "the baseline is the best" if c is None and best.setting == b.setting
               else "no configuration beat the baseline beyond noise" if c is not None
               else "the best was not confirmed")
        rep.out.print(f"  {why}: config.pbtxt left as it is", markup=False)


def _closest_trial(r):  # noqa: ANN001, ANN202 - tune.TuneReport -> its Trial with the lowest p99, or None
    measured = [t for t in r.trials if t.point is not None and t.point.p99_ms is not None]
    return min(measured, key=lambda x: x.point.p99_ms) if measured else None


def _closest(r) -> str:  # noqa: ANN001 - tune.TuneReport
    """No trial met the SLO: which came closest (the lowest p99), and what it gave."""
    from .tune import describe as _short

    t = _closest_trial(r)
    if t is None:
        return "no trial met the SLO (every trial failed)"
    return (f"no trial met the SLO; the closest was {_short(t.setting)}: p99 {t.point.p99_ms} ms, "
            f"{t.point.throughput:.1f} req/s")
