"""`zoo`: convert every model of a manifest into one repository."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import DebugOpt, JsonOpt, examples, reporter, run, write_json

ZOO_EXAMPLES = examples("mcp-cli zoo zoo.yaml -o model_repository --verify",
                        "mcp-cli zoo zoo.yaml --shard 1/4 --report zoo.json --junit zoo.xml")


def zoo(
    manifest: Path = typer.Argument(..., help="The zoo manifest (zoo.yaml).", dir_okay=False),
    output: str = typer.Option("model_repository", "--output", "-o", help="The model repository to fill."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="Parallel processes (default: CPUs)."),
    shard: Optional[str] = typer.Option(None, "--shard", metavar="K/N", help="Only the K-th of N deterministic slices."),
    report_path: Optional[Path] = typer.Option(None, "--report", help="Write the JSON report (what --json prints) here."),
    junit: Optional[Path] = typer.Option(None, "--junit", help="Write a JUnit XML report here."),
    cache: Optional[Path] = typer.Option(None, "--cache", help="Cache folder (default ~/.cache/mcp-cli/zoo)."),
    verify_: bool = typer.Option(False, "--verify", help="Verify each model against onnxruntime."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing --report / --junit files."),
    allow_outside_paths: bool = typer.Option(False, "--allow-outside-paths",
                                             help="Let source paths point outside the manifest's folder."),
    json_out: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Convert every model of a manifest into one repository (parallel, cached, shardable)."""
    rep = reporter(json_out)

    def body() -> None:
        import time

        from mcp_compiler.files import check_output
        from mcp_compiler.manifest import load_manifest
        from mcp_compiler.zoo import parse_shard, run_zoo, summary, write_junit

        check_output(output, "--output", directory=True)
        for flag, path in (("--report", report_path), ("--junit", junit)):
            if path is not None:
                check_output(path, flag, force=force, inputs=(manifest,))
        m = load_manifest(manifest, allow_outside_paths=allow_outside_paths)
        sh = parse_shard(shard)
        t0 = time.perf_counter()
        with rep.zoo_progress() as progress:
            results = run_zoo(m, Path(output), jobs=jobs, shard=sh, cache=cache, verify=verify_, progress=progress)
        data = summary(results, m, sh, time.perf_counter() - t0)
        if report_path:
            write_json(report_path, data)
        if junit:
            write_junit(results, junit)
        rep.zoo_done(data, results)
        if not data["ok"]:
            from mcp_compiler.zoo import ZooFailedError

            failed = [r for r in results if r.status == "failed"]
            names = ", ".join(r.name for r in failed[:10]) + (f" and {len(failed) - 10} more" if len(failed) > 10 else "")
            raise ZooFailedError(f"{len(failed)} of {len(results)} models failed ({names}): each one's reason is "
                                 f"{'in the report' if json_out else 'above and in the report'}")

    run(rep, debug, body)
