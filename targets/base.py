"""The Target interface: the only door to a target. It parses its own options, names and checks
entries, lists its rewrite rules, emits, verifies what it emitted, and lists its CLI commands."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:   # the IR is not imported by `mcp-cli targets`
    from mcp_compiler.ir import Model
    from mcp_compiler.reference import VerifyReport


@dataclass
class TargetParams:
    """A target's own typed options, as `Target.options_from` parses and validates them once
    (each target has its subclass: the Triton target's ServingParams, the ONNX output's
    OnnxFileParams)."""


@dataclass
class TargetOptions:
    """Per-conversion options a target reads: its own parsed settings (`params`, from
    `Target.options_from`) and what the compiler decides (name, quantization)."""

    name: str | None = None
    force: bool = False
    params: TargetParams | None = None   # the target's own typed options (Target.options_from)
    quantization: str = "none"       # what the pipeline quantized to (one source: CompileOptions)
    budget: dict[str, float] | None = None   # --accuracy-budget a quantized entry was built with (recorded)
    load_check: bool = True          # the target's runtime loads the staged artifacts first
    inputs: str | None = None        # the user's --inputs: a measured execution is judged on them too
    # Called with the staged entry before it replaces anything (e.g. verify); raising stops the emit.
    check: Callable[[Path], None] | None = None


class Note(str):
    """A line an emitter says that is not a problem (printed `note:`, kept in the report's
    `notes`): among its warnings, it is told apart by its type."""


@dataclass
class EmitResult:
    root: Path                       # the model's folder: DIR/NAME
    files: list[str]                 # paths relative to `root`, sorted
    config: Any = None               # the ModelConfig message written to config.pbtxt
    warnings: list[str] = field(default_factory=list)
    runtime_profile: dict | None = None   # --runtime auto: the candidates measured (mcp_compiler.profile)


@dataclass
class ParsedOptions:
    """What `Target.options_from` returns: the target's typed settings (nothing flows back to
    the compiler: its own build-file keys never reach the target)."""

    params: TargetParams | None


@dataclass(frozen=True)
class ConvertFlag:
    """One of a target's own `convert` flags: the parameter's name, its annotation and its
    typer.Option (shown in the target's help panel). `Target.settings_from_flags` turns the values
    given into the target's settings (its build-file keys)."""

    name: str
    annotation: Any
    option: Any


# Settings a build file or a manifest entry may give that are the compiler's, not the target's:
# read by the compiler (CompileOptions.with_target_settings), never handed to the target.
COMPILER_SETTINGS: dict[str, type] = {"quantization_level": str, "initializer_inputs": str}


class Target(abc.ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    # The settings a build file or a zoo manifest may give this target, key -> type.
    option_types: ClassVar[Mapping[str, type]] = {}
    # Settings whose value may be null in a build file or manifest.
    nullable_options: ClassVar[frozenset[str]] = frozenset()
    # None: the output is a folder (a repository); else a file with this suffix
    output_suffix: ClassVar[str | None] = None

    @property
    def runtime(self) -> str:
        """What executes the emitted model, by version."""
        return "?"

    @property
    def opset_range(self) -> tuple[int, int]:
        """The default-domain opsets the target accepts."""
        return (1, 1)

    # --- options and names -------------------------------------------------------------------
    def convert_flags(self) -> list[ConvertFlag]:
        """The target's own `convert` flags (its help panel); none by default."""
        return []

    def settings_from_flags(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The target's settings (build-file keys) from its `convert` flags' values (None or
        False: not given). By default, each given flag is the setting of its name."""
        return {k: v for k, v in given.items() if v is not None and v is not False}

    def options_from(self, flags: Mapping[str, Any], build_file: Mapping[str, Any] | None = None) -> ParsedOptions:
        """The target's typed options from a build file's settings and the flags (None = not given;
        flags win). A target with no options refuses any."""
        given = sorted(k for k, v in {**(build_file or {}), **flags}.items() if v is not None)
        if given:
            from mcp_compiler.errors import UsageError

            raise UsageError(f"target {self.name} has no setting {given[0]!r}")
        return ParsedOptions(None)

    def type_error(self, key: str, value: Any) -> str | None:
        """Why `value` is not a valid value of setting `key` (a known key), or None."""
        want = {**COMPILER_SETTINGS, **self.option_types}[key]
        if value is None and key in self.nullable_options:
            return None
        if isinstance(value, want) and not (want is int and isinstance(value, bool)):
            return None
        return f"must be a {want.__name__}, got {value!r}"

    def load_build_file(self, path: Path) -> dict[str, Any]:
        """The settings of a YAML build file (mcp.yaml, --config): a mapping of the target's
        option keys; an unknown key or a value of the wrong type is a UsageError naming its line."""
        from mcp_compiler.errors import UsageError
        from mcp_compiler.files import parse_yaml, read_config

        text = read_config(path, "--config")
        data = parse_yaml(text, f"--config {path}")
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise UsageError(f"--config {path}: expected a mapping of settings at the top")
        lines = {k: i + 1 for i, ln in enumerate(text.splitlines())
                 for k in [ln.split(":", 1)[0].strip()] if ":" in ln}
        for key, value in data.items():
            if key not in self.option_types and key not in COMPILER_SETTINGS:
                raise UsageError(f"--config {path} line {lines.get(key, '?')}: unknown key {key!r} "
                                 f"(known: {', '.join([*self.option_types, *COMPILER_SETTINGS])})")
            err = self.type_error(key, value)
            if err:
                raise UsageError(f"--config {path} line {lines.get(key, '?')}: {key} {err}")
        return data

    def entry_name(self, stem: str) -> str:
        """The default name of the entry for a model file called `stem`."""
        from mcp_compiler.names import sanitize_name

        return sanitize_name(stem)

    def check_entry_name(self, name: str) -> str:
        """`name` if it is a name (no path: it stays inside the output); else a UsageError. The
        same rule for every target (mcp_compiler.names)."""
        from mcp_compiler.names import check_name

        return check_name(name)

    # --- compile -----------------------------------------------------------------------------
    def check(self, model: Model) -> list[str]:
        """Raise UnsupportedError if the model is outside what the target accepts; return warnings."""
        from mcp_compiler.errors import UnsupportedError

        lo, hi = self.opset_range
        ver = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
        if ver is not None and not lo <= ver <= hi:
            raise UnsupportedError(
                f"target {self.name} accepts ai.onnx opsets {lo}..{hi}, the model imports {ver}",
                hint="convert the model to a supported opset first")
        return []

    def check_ops(self, model: Model) -> None:  # noqa: B027 - an optional hook: nothing to check by default
        """Raise UnsupportedError for what no rewrite rule can make legal (e.g. operator domains
        the runtime lacks); the strict legalize pass ends with it."""

    def legalize_passes(self) -> list:
        """The target's rewrite rules, run after normalization; the last establishes target-legal."""
        return []

    def is_legal(self, model: Model) -> list[str]:
        """What in `model` the target cannot run (empty: all of it); checks target-legal."""
        return []

    @abc.abstractmethod
    def emit(self, model: Model, out_dir: Path, options: TargetOptions) -> EmitResult:
        """Write the target's artifacts for `model` under `out_dir`, atomically."""

    # --- after emitting ----------------------------------------------------------------------
    def verify(self, original: Path, entry: Path, **kw: Any) -> VerifyReport:
        """Compare the emitted `entry` with onnxruntime on the `original` model."""
        raise NotImplementedError(f"target {self.name} cannot verify its output")

    def install(self, entry: Path, out_dir: Path, name: str) -> Path:
        """Copy a finished entry (a cached one) into `out_dir` as `name`, atomically."""
        raise NotImplementedError(f"target {self.name} cannot install a cached entry")

    def commands(self) -> list[Callable]:
        """The target's own CLI commands (typer functions with a `__command_name__`)."""
        return []


def probed_max_opset() -> int:
    """The newest ai.onnx opset onnxruntime was found loading (ort_support.json), read without
    importing onnx or onnxruntime (what `mcp-cli targets` shows)."""
    import json

    table = Path(__file__).parent / "ort_support.json"   # ort_support.TABLE (that module imports onnx)
    return int(json.loads(table.read_text()).get("max_opset", 7))
