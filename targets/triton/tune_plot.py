"""tune --plot: the trials (p99 vs throughput, the Pareto front, the SLO) and the confirmation pairs."""

from __future__ import annotations

import os

from .tune import TuneReport, label


def plot(report: TuneReport, path: str | os.PathLike) -> None:
    """Left: p99 vs throughput of every trial, numbered, with a key of each number's setting
    (`label`), throughput and p99; the Pareto front drawn over the points; the SLO line (or, when it
    is far above every trial, an arrow saying so, so the points are not squashed); baseline (open
    square) and best (star) apart; both axes start at zero. Right: the confirmation pairs (baseline
    and best throughput per pair, the median ratio and its interval), or why there are none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    numbered = [(k, t) for k, t in enumerate(report.trials) if t.point and t.point.p99_ms is not None]
    fig = plt.figure(figsize=(14, 5.6), dpi=110)
    grid = fig.add_gridspec(1, 3, width_ratios=[3.2, 1.7, 2.4])
    ax, kx, cx = fig.add_subplot(grid[0]), fig.add_subplot(grid[1]), fig.add_subplot(grid[2])
    top = max([t.point.p99_ms for _, t in numbered], default=report.slo_p99_ms) * 1.35
    slo_shown = report.slo_p99_ms <= top * 1.5
    top = max(top, report.slo_p99_ms * 1.1) if slo_shown else top
    if numbered:
        xs, ys = [t.point.throughput for _, t in numbered], [t.point.p99_ms for _, t in numbered]
        ax.scatter(xs, ys, s=30, color="#95a5a6", zorder=2, label="trials (numbers: see the key)")
        for (k, _), x, y in zip(numbered, xs, ys):
            ax.annotate(str(k), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8, color="#2c3e50", zorder=8)
        front, best_y = [], float("inf")
        for x, y in sorted(zip(xs, ys), key=lambda p: (-p[0], p[1])):   # most throughput first
            if y < best_y:
                front.append((x, y))
                best_y = y
        front.sort()
        ax.plot([x for x, _ in front], [y for _, y in front], "-", color="#2980b9", linewidth=2.5, alpha=0.9,
                zorder=4, label="Pareto front (nothing both faster and lower p99)")
        ax.scatter([x for x, _ in front], [y for _, y in front], s=50, facecolors="none", edgecolors="#2980b9",
                   linewidths=1.5, zorder=4)
    if slo_shown:
        ax.axhline(report.slo_p99_ms, color="#c0392b", linestyle="--", linewidth=1.2, zorder=1,
                   label=f"SLO p99 {report.slo_p99_ms:g} ms")
    else:
        ax.annotate(f"SLO p99 {report.slo_p99_ms:g} ms: above this range", xy=(0.98, 0.99), xycoords="axes fraction",
                    xytext=(0.98, 0.88), ha="right", fontsize=8, color="#c0392b",
                    arrowprops={"arrowstyle": "->", "color": "#c0392b"})
    base, best = report.baseline, report.best
    if base.point is not None and base.point.p99_ms is not None:
        ax.scatter([base.point.throughput], [base.point.p99_ms], marker="s", s=170, facecolors="none",
                   edgecolors="#8e44ad", linewidths=2.2, zorder=6, label="baseline (0)")
    if best is not None and best.point is not None and best.point.p99_ms is not None:
        word = "confirmed" if report.confirmed else "NOT confirmed" if best.confirmation else "unconfirmed"
        ax.scatter([best.point.throughput], [best.point.p99_ms], marker="*", s=280, color="#27ae60",
                   edgecolors="black", linewidths=0.6, zorder=7,
                   label=f"best ({report.trials.index(best)}), {word}")
    ax.set_xlim(0, max([t.point.throughput for _, t in numbered], default=1) * 1.12)
    ax.set_ylim(0, top)
    ax.set_xlabel("throughput (requests/s; axis from 0)")
    ax.set_ylabel("p99 latency (ms; axis from 0)")
    ax.set_title(f"{report.model} at {report.load}: {len(report.trials)} trials", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    kx.set_axis_off()
    kx.set_title("key", fontsize=10)
    rows = [f"{k:>2}  {label(t.setting):<22} {t.point.throughput:>7.0f}/s {t.point.p99_ms:>6.2f} ms"
            for k, t in numbered]
    kx.text(0, 1, "\n".join(rows[:30]) + ("\n..." if len(rows) > 30 else ""), family="monospace", fontsize=7,
            va="top", transform=kx.transAxes)
    kx.text(0, 0, "bN max batch, dNus queue delay,\nnb no dynamic batching, pN preferred,\n"
            "iN instances, tN threads (tall: all cores)", fontsize=7, color="#7f8c8d", transform=kx.transAxes)
    _confirmation_panel(cx, report)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _confirmation_panel(cx, report: TuneReport) -> None:  # noqa: ANN001 - a matplotlib Axes
    c = report.best.confirmation if report.best is not None else None
    cx.set_title("confirmation: baseline vs best, alternating pairs", fontsize=10)
    if not c or not c["pairs"]:
        why = ("the baseline is the best: nothing to confirm" if report.best is None
               or report.best.setting == report.baseline.setting else
               "not confirmed: " + (c["verdict"] if c else "no time left in the budget"))
        cx.text(0.5, 0.5, why, ha="center", va="center", wrap=True, fontsize=9, transform=cx.transAxes)
        cx.set_axis_off()
        return
    k = list(range(1, len(c["pairs"]) + 1))
    cx.plot(k, [r["baseline"] for r in c["pairs"]], "s-", color="#8e44ad", label="baseline")
    cx.plot(k, [r["best"] for r in c["pairs"]], "*-", color="#27ae60", markersize=10, label="best")
    cx.set_xticks(k)
    cx.set_xlabel("pair (the one measured first alternates)")
    cx.set_ylabel("throughput (requests/s; axis from 0)")
    cx.set_ylim(bottom=0)
    cx.grid(alpha=0.3)
    lo, hi = c["interval"] or (None, None)
    text = (f"median ratio {c['median_ratio']:.3f}x, 90% interval {lo:.3f}-{hi:.3f}\n"
            f"{'CONFIRMED' if c['confirmed'] else 'NOT confirmed'} (needs lower end > {1 + c['margin']:.2f})"
            if c["median_ratio"] is not None else c["verdict"])
    cx.text(0.02, 0.22, text, transform=cx.transAxes, fontsize=8,
            bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "#bdc3c7"})
    cx.legend(fontsize=8, loc="lower right")
