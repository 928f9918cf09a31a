# Types of the C extension partition_log/_speedups.c (see partition_log/speedups.py).

pure_python_requested: bool

def records_fit(
    data: bytes | bytearray | memoryview, count: int, last_offset_delta: int, /
) -> bool: ...
