"""Exceptions of ddtree_kernels (one module, so every other module can import it)."""

from __future__ import annotations


class ExtensionUnavailableError(RuntimeError):
    """Raised when the CUDA path is required but the compiled extension cannot be used."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"ddtree_kernels CUDA extension is unavailable ({reason}); rebuild with "
            "`DDTREE_KERNELS_BUILD_CUDA=1 pip install --no-build-isolation ./kernels` "
            "on a machine with nvcc and torch's CUDA build, or unset DDTREE_KERNELS_REQUIRE_CUDA."
        )
        self.reason = reason
