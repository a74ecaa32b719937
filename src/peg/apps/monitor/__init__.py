"""`peg.Monitor` / `peg monitor`: label-free performance monitoring after deployment, chunk by
chunk, with alerts (`monitor.py`), built from small objects: the chunkers (`chunking.py`:
`by_size`, `per_update`), the bands (`thresholds.py`: `Sigmas`, `Fixed`), the records of what
it finds (`records.py`: `ChunkResult`, `Alert`); how a chunk is judged (`judge.py`), its tests
(`drift.py`), what it shows (`report.py`), its results folder (`files.py`) and the command
line (`command.py`)."""

from peg.apps.monitor.chunking import by_size, per_update
from peg.apps.monitor.monitor import Monitor
from peg.apps.monitor.records import Alert, ChunkResult
from peg.apps.monitor.thresholds import Fixed, Sigmas

__all__ = ["Alert", "ChunkResult", "Fixed", "Monitor", "Sigmas", "by_size", "per_update"]
