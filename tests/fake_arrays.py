"""The refsim.Array surface `conformance.verdict.compare` reads (shape, dtype, shards of device id,
index and data), built by hand in the verdict tests."""
import dataclasses

import numpy as np


@dataclasses.dataclass
class Sh:
    device_id: int
    index: tuple
    data: np.ndarray


@dataclasses.dataclass
class Arr:
    """The refsim.Array surface compare() reads: shape, dtype, shards."""
    shape: tuple
    dtype: np.dtype
    shards: list
