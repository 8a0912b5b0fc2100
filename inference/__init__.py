"""Inference: the engine library (inference.engine) and its Django wrapping."""
