"""A hand-written reproducer (the older format `conformance.debug.loader` reads): psum of 2a over 8
devices, for the explain CLI tests."""

REPRO = '''\
# conformance reproducer v1: shard_map/psum/8
import numpy as np, jax
from jax.sharding import PartitionSpec as P
MESH_SHAPE = (8,)
AXIS_NAMES = ('i',)
DEVICE_IDS = [0, 1, 2, 3, 4, 5, 6, 7]
KIND = "shard_map"
IN_SPECS = (P('i'),)
OUT_SPECS = P()
CHECK_VMA = True
def program(a):
    return jax.lax.psum(a * 2.0, 'i')
def inputs(): return (np.arange(16, dtype=np.float32).reshape(8, 2),)
'''
