"""zcrop: fast random N-d crops from huge Zarr arrays, to feed GPU/TPU training."""

from zcrop._zcrop import __version__

__all__ = ["__version__"]
