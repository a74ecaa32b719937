"""Layers: Packed-Ensembles layers (`packed.py`) and Ensemble Model Patching (`patching.py`; its
layers in `patched_module.py` and `patched_layers.py`, its regulariser and overhead in
`patch_cost.py`)."""

from peg.layers.packed import PackedConv2d, PackedLinear, packed_channels, rearrange
from peg.layers.patching import emp_loss, overhead, patch, patch_regularizer, unpatch

__all__ = [
    "PackedConv2d",
    "PackedLinear",
    "emp_loss",
    "overhead",
    "packed_channels",
    "patch",
    "patch_regularizer",
    "rearrange",
    "unpatch",
]
