"""Layout passes: the NHWC interface (`--layout nhwc`)."""

from .to_nhwc import LayoutNhwcPass

__all__ = ["LayoutNhwcPass"]
