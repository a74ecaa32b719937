"""The one place that reads what users pass as data: `Source` (see `peg.source._source`).

- `_source`: `Source` and `Tapped`, and the tests of what a kind of data is (`is_loader`, ...);
- `_rows`: data read by index or in order (`ValSource`), for PEG's mini-batches, the scale
  search's points and `AutoSelect`'s folds;
- `batches`: the batch conventions (mappings, `(x, y, ...)` tuples, `batch_fn`) and the model
  calls that follow them; `is_pair`, the one test of a pair `(X, y)`;
- `_values`: the checks of values and labels; `_devices`: the device rule (data follows the
  model, labels follow the scores).
"""

from peg.source._rows import InputBatches, ValSource
from peg.source._source import (
    Data,
    Source,
    Tapped,
    as_loader,
    is_dataset,
    is_dataset_or_loader,
    is_loader,
    reread_loader,
)
from peg.source.batches import is_pair

__all__ = [
    "Data",
    "InputBatches",
    "Source",
    "Tapped",
    "ValSource",
    "as_loader",
    "is_dataset",
    "is_dataset_or_loader",
    "is_loader",
    "is_pair",
    "reread_loader",
]
