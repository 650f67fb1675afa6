"""The policies' array forms, declared to the registry; each module is imported on its first use.

Apart from the policies, so that an array form imports its policy and never the other way round: numpy
(~50 ms to import) stays out of processes that never judge in arrays (the simulator, the CLI's tools).
"""

from __future__ import annotations

from app.core.placement.base import ArrayForm, registry
from app.core.placement.fragaware import FragAware


@registry.register_array(FragAware)
def _fragaware(policy: FragAware) -> ArrayForm:
    from app.core.placement.fragaware_array import FragAwareArray

    return FragAwareArray(policy)
