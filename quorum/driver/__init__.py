"""The I/O around the pure core: RocksDB storage, snapshot files, the gRPC
transport, the asyncio node driver, clients and the command line.

Everything that touches a clock, a disk, a socket or a thread lives here and
only here; the rest of ``quorum`` stays pure (``tests/quorum/test_purity.py``).
"""
