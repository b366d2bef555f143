"""The `onnx` target: the optimized model as one ONNX file (`-o out.onnx`).

The default normalization pipeline without a runtime's rewrite rules: the model keeps its
opset and IR version (unless --opset raises them), its weights stay in the file unless they
exceed protobuf's 2 GB (or `--external-data`), and `--verify` compares it with the original,
both run by onnxruntime.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from .base import EmitResult, ParsedOptions, Target, TargetOptions, TargetParams


@dataclass
class OnnxFileParams(TargetParams):
    external_data: bool = False   # --external-data: weights beside the model file even under 2 GB


class OnnxTarget(Target):
    name: ClassVar[str] = "onnx"
    description: ClassVar[str] = "an optimized ONNX model file (what -o out.onnx writes)"
    option_types: ClassVar[Mapping[str, type]] = {"external_data": bool}
    output_suffix: ClassVar[str | None] = ".onnx"

    @property
    def runtime(self) -> str:
        from importlib.metadata import version

        return f"any ONNX runtime (verified with onnxruntime {version('onnxruntime')})"

    @property
    def opset_range(self) -> tuple[int, int]:
        from .base import probed_max_opset

        return (1, probed_max_opset())   # --verify runs the output in onnxruntime

    def convert_flags(self) -> list:
        import typer

        from .base import ConvertFlag

        return [ConvertFlag("external_data", bool, typer.Option(
            False, "--external-data", rich_help_panel="Input and output",
            help="With an .onnx output: the weights in OUT.onnx.data beside it (always when they exceed "
                 "protobuf's 2 GB)."))]

    def options_from(self, flags: Mapping[str, Any], build_file: Mapping[str, Any] | None = None,
                     source: str = "the build file") -> ParsedOptions:
        from mcp_compiler.errors import UsageError

        given = {**(build_file or {}), **{k: v for k, v in flags.items() if v is not None}}
        unknown = sorted(set(given) - set(self.option_types))
        if unknown:
            flag = "--" + unknown[0].replace("_", "-")
            raise UsageError(f"{flag if unknown[0] in flags else f'{source}: {unknown[0]}'} is not a setting of "
                             "the ONNX output (it has --external-data)")
        return ParsedOptions(OnnxFileParams(external_data=bool(given.get("external_data", False))))

    def emit(self, model, out: Path, options: TargetOptions) -> EmitResult:  # noqa: ANN001 - ir.Model
        """Write `out` (and `out.data` with external data) through a temp name in the same folder."""
        from mcp_compiler.errors import OutputExistsError
        from mcp_compiler.files import follow_umask, temp_prefix, write_error
        from mcp_compiler.lower import write_onnx

        out = Path(out)
        if out.exists() and not options.force:
            raise OutputExistsError(f"{out} exists; pass --force to replace it")
        external = isinstance(options.params, OnnxFileParams) and options.params.external_data or None
        tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(out), dir=out.parent))
        try:
            names = write_onnx(model, tmp / out.name, external=external)
            for n in names:
                follow_umask(tmp / n)
            if options.load_check:   # an optimized model that onnxruntime refuses is no output
                from mcp_compiler.session import load_check_file

                load_check_file(tmp / out.name)
            if options.check is not None:
                options.check(tmp / out.name)
            stale = out.with_name(out.name + ".data")
            for n in names:
                os.replace(tmp / n, out.parent / n)
            if len(names) == 1 and stale.exists():
                stale.unlink()   # a replaced model's old external data
        except OSError as e:
            raise write_error(out, e) from None
        finally:
            for leftover in tmp.iterdir():
                leftover.unlink()
            tmp.rmdir()
        return EmitResult(out.parent, names)

    def verify(self, original: Path, entry: Path, **kw: Any):  # noqa: ANN201 - reference.VerifyReport
        from mcp_compiler.reference import verify_onnx

        return verify_onnx(original, entry, **kw)

    def install(self, entry: Path, out_dir: Path, name: str) -> Path:
        """Copy a cached `<name>.onnx` (and its data) into `out_dir`, each through a temp name."""
        import shutil

        from mcp_compiler.files import follow_umask, temp_prefix

        out_dir.mkdir(parents=True, exist_ok=True)
        for src in sorted(entry.iterdir()):
            fd, tmp = tempfile.mkstemp(prefix=temp_prefix(out_dir / src.name), dir=out_dir)
            os.close(fd)
            shutil.copyfile(src, tmp)
            follow_umask(tmp)   # mkstemp makes 0600: the umask decides, as for every other output
            os.replace(tmp, out_dir / src.name)
        return out_dir / f"{name}.onnx"

    def commands(self) -> list[Callable]:
        return []
