"""Rewrites that move a model between opsets or op sets (target rules use them)."""

from .upgrade_opset import UpgradeOpsetPass

__all__ = ["UpgradeOpsetPass"]
