"""`peg.Monitor` / `peg monitor`: label-free performance monitoring after deployment, chunk by
chunk, with alerts (`monitor.py`), its tests (`drift.py`), what it shows (`report.py`) and the
command line (`command.py`)."""

from peg.apps.monitor.monitor import Monitor

__all__ = ["Monitor"]
