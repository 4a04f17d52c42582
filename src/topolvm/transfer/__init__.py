"""The node-to-node copy of a logical volume (docs/mobility.md).

A shared package that topolvm-node runs: the wire format and its checks (``wire``, ``digest``,
``messages``, ``plan``, ``sparse``) are pure and apart from I/O, as ``lvm.report`` is; the
sender (``server``, resuming with ``resume``) and the receiver (``client``) move the bytes with
blocking TLS sockets in worker threads, driven from the node's asyncio loop; the sender's
port accepts (``door``) and runs the handshake and HELLO on the loop (``handshake``) within its
limits (``gate``, pure; ``turns``, the fair pacing of handshakes and reviews); ``auth`` checks
a receiver's ServiceAccount token with TokenReview, and ``tokens`` makes the receiver's tokens,
one per source node, with TokenRequest. What it needs of LVM (a volume's device and a thin
volume's mapped blocks) it asks of lvmd through :class:`~topolvm.transfer.source.VolumeData`.
"""
