"""Frontends: model formats in, IR out."""

from .onnx import LoadedModel, load_onnx

__all__ = ["LoadedModel", "load_onnx"]
