"""Support code with no knowledge of graphs or schedules: atomic output files (`files`) and
numba's on-disk cache for kernels spread over several files (`numba_cache`).
"""
