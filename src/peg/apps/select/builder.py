"""The registry entry "auto-select" (`peg.apps.registry`): `AutoSelect` with its default
candidates as a bench column or a compare row (`{name: AutoSelect, method: auto-select}`),
fitted on the site's base and validation data. Registered when `peg.apps.select` is imported
(the bench runner imports it; the registry cannot: AutoSelect builds its candidates through it).
"""

from __future__ import annotations

from peg.apps import registry
from peg.apps.select.auto import AutoSelect


@registry.register("auto-select")
class AutoSelectBuilder(registry.PostHoc):
    method = AutoSelect
    single = True
