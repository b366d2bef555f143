"""Named pass pipelines, read top to bottom."""

from __future__ import annotations

from .errors import UsageError
from .passes import PASSES, Pass, PassContext, PassManager, Repeat
from .passes.normalize import (CommonSubexpressionEliminationPass, ConstantToInitializerPass,
                               DeadCodeEliminationPass, DeduplicateWeightsPass,
                               FoldConstantsPass, IdentityEliminationPass)


def default_pipeline(target=None) -> list[Pass | Repeat]:  # noqa: ANN001
    """Normalization, then the target's own rewrite rules."""
    steps: list[Pass | Repeat] = [
        ConstantToInitializerPass(),
        Repeat([FoldConstantsPass(), IdentityEliminationPass(), CommonSubexpressionEliminationPass(),
                DeadCodeEliminationPass()]),
        DeduplicateWeightsPass(),
    ]
    if target is not None:
        steps += target.legalize_passes()
    return steps


def named_pipeline(names: list[str]) -> list[Pass | Repeat]:
    """The passes the user listed with --passes, in that order."""
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        raise UsageError(f"unknown pass {', '.join(map(repr, unknown))}; known passes: "
                         f"{', '.join(sorted(PASSES))}")
    return [PASSES[n]() for n in names]


def build(target=None, passes: list[str] | None = None, disabled: set[str] | None = None,  # noqa: ANN001
          verify_each: bool = False) -> PassManager:
    disabled = set(disabled or ())
    unknown = sorted(disabled - set(PASSES))
    if unknown:
        raise UsageError(f"--disable-pass: unknown pass {', '.join(map(repr, unknown))}")
    steps = named_pipeline(passes) if passes else default_pipeline(target)
    return PassManager(steps, PassContext(verify_each=verify_each, disabled=disabled, target=target))
