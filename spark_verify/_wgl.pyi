# Types of the compiled search loop spark_verify/_wgl.pyx (see spark_verify/wgl.py).

from collections.abc import Callable

pure_python_requested: bool
READ: int
WRITE: int
CAS: int
REFUSED: int

def search(
    events: list[int],
    kinds: list[int],
    a: list[int],
    b: list[int],
    required: list[bool],
    clock: Callable[[], float],
    deadline: float,
    max_bytes: int,
    clock_every: int,
) -> tuple[int, int, int, int, int]: ...
