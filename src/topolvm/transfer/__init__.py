"""The node-to-node copy of a logical volume (docs/mobility.md).

A shared package that topolvm-node runs: the wire format and its checks (``wire``, ``digest``,
``messages``, ``plan``, ``sparse``) are pure and apart from I/O, as ``lvm.report`` is; the
sender (``server``) and the receiver (``client``) move the bytes with blocking TLS sockets in
worker threads, driven from the node's asyncio loop; ``auth`` checks a receiver's
ServiceAccount token with TokenReview. What it needs of LVM (a volume's device and a thin
volume's mapped blocks) it asks of lvmd through :class:`~topolvm.transfer.source.VolumeData`.
"""
