"""Rewrites that move a model between opsets or op sets (target rules use them)."""

from .legalize import LegalizePass
from .upgrade_opset import UpgradeOpsetPass

__all__ = ["LegalizePass", "UpgradeOpsetPass"]
