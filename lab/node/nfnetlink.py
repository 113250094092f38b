"""The few nfnetlink (NFQUEUE) constants and message framings the delayer needs; stdlib only.

Raw nfnetlink instead of libnetfilter_queue: the image's Python has no bindings, and a delay
needs only three messages (bind/unbind config, packet, batch verdict). Numbers are from the
kernel's ``linux/netfilter/nfnetlink_queue.h`` and ``linux/netlink.h``.
"""

from __future__ import annotations

import socket
import struct

__all__ = [
    "MSG_PACKET_TYPE",
    "NETLINK_NETFILTER",
    "NFNL_SUBSYS_QUEUE",
    "NFQNL_MSG_CONFIG",
    "NFQNL_MSG_PACKET",
    "NFQNL_MSG_VERDICT",
    "NFQNL_MSG_VERDICT_BATCH",
    "attr",
    "bind_attrs",
    "drop_attrs",
    "nfq_msg",
    "unbind_attrs",
    "verdict_attrs",
]

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 1, 2, 3
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLMSG_ERROR = 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQA_CFG_F_GSO = 0x4
NFQNL_CFG_CMD_BIND, NFQNL_CFG_CMD_UNBIND = 1, 2
NFQNL_COPY_META = 1
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NF_DROP, NF_ACCEPT = 0, 1
SO_RCVBUFFORCE = 33
NLA_TYPE_MASK = 0x3FFF  # strips NLA_F_NESTED / NLA_F_NET_BYTEORDER
MSG_PACKET_TYPE = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET


def attr(kind: int, data: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes (the length field excludes the padding)."""
    pad = -len(data) % 4
    return struct.pack("=HH", 4 + len(data), kind) + data + b"\0" * pad


def nfq_msg(msg: int, queue: int, attrs: bytes, seq: int, flags: int = NLM_F_REQUEST) -> bytes:
    """A queue-subsystem message for ``queue``."""
    # nlmsghdr is host order; nfgenmsg's res_id (the queue number) is big endian.
    body = struct.pack("!BBH", socket.AF_UNSPEC, 0, queue) + attrs
    kind = (NFNL_SUBSYS_QUEUE << 8) | msg
    return struct.pack("=IHHII", 16 + len(body), kind, flags, seq, 0) + body


def bind_attrs(maxlen: int) -> bytes:
    """Bind for IPv4, metadata only (the packet id is all a delay needs), queue length."""
    return (
        attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET))
        + attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
        + attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen))
        # GSO: we never touch payloads, so the kernel may queue GRO'd super-packets whole
        # instead of segmenting them first (fewer messages per byte).
        + attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_GSO))
        + attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_GSO))
    )


def unbind_attrs() -> bytes:
    return attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_UNBIND, 0))


def verdict_attrs(packet_id: int) -> bytes:
    """Accept ``packet_id`` and, sent as a batch verdict, every earlier id too."""
    return attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id))


def drop_attrs(packet_id: int) -> bytes:
    """Drop ``packet_id`` (sent as a single verdict: only that packet)."""
    return attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_DROP, packet_id))
