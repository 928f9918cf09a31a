"""The quorum node: the I/O around the pure core.  RocksDB storage, snapshot
files, the gRPC transport and server, the asyncio node driver and the
client base.

Everything of the quorum that touches a clock, a disk, a socket or a thread
lives here and only here; the rest of ``quorum`` stays pure
(``tests/quorum/test_purity.py``).  The node knows nothing of what runs on
it: the state machines above it see it through two seams,
:mod:`quorum.driver.raft_client` (the quorum as a state machine's driver
sees it) and :mod:`quorum.driver.plugin` (the node's gRPC server as its
plug-ins see it); its command line is :mod:`kq.commands`.
"""
