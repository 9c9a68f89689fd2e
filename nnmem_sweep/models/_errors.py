"""A ValueError that knows which input key it is about, relative to the `model:` mapping."""
from __future__ import annotations


class FieldError(ValueError):
    """`key` is relative to the model mapping, e.g. "hidden" or "layers[3].kernel_size"."""

    def __init__(self, key: str, message: str):
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}" if key else message)
