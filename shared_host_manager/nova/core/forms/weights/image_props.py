"""The vector form of nova's ImagePropertiesWeigher (``nova/scheduler/weights/image_props.py``).

With its multiplier at 0 every host weighs 0; otherwise nova's class weighs every host
itself, since it reads the image metadata of the host's instances from the cell database.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from nova.scheduler.weights import image_props

from shared_host_manager.decision.host_table import HostTable
from shared_host_manager.nova.core.forms.base import FloatArray, IntArray, WeigherForm, option


def _image_props_weight(w: Any, rows: HostTable, idx: IntArray, spec: Any) -> FloatArray | None:
    if option("filter_scheduler", "image_props_weight_multiplier") == 0.0:
        return np.zeros(len(idx))
    return None  # reads instances' image metadata from the cell DB: nova's class per host


FORMS = (WeigherForm(image_props.ImagePropertiesWeigher, _image_props_weight,
                     ("filter_scheduler", "image_props_weight_multiplier")),)
