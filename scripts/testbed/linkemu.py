#!/usr/bin/env python3
"""Userspace switch + link emulator for testbed.sh (the "user" shaper).

Chosen when a delay is asked for and the kernel has no sch_netem, so tc
cannot add latency (tbf only limits rate), or with --shaper user.  Each node namespace gets a TAP device as its NIC; this process
holds every TAP's file descriptor and plays the switch between them, modelling
per node an uplink (node -> switch: serialisation at RATE, then DELAY of
propagation) and a downlink (switch -> node: serialisation at RATE, shared by
every sender, so incast queues there like on a switch port).  Idle one-way
latency between two nodes is DELAY + frame/RATE + segment/RATE (the switch
cuts through at segment granularity), so RTT ~ 2 * DELAY plus the base path.

The TAPs carry virtio-net headers with TSO/checksum offload on, so TCP hands
over 64 KiB GSO frames and we forward a few thousand frames per second at
1 Gbit/s instead of ~80k: cheap enough for Python.  Serialisation time is
charged for the segments a GSO frame stands for (headers repeated per
segment), the same bytes tbf would count after segmenting.

Back-pressure instead of drops on the uplink: we stop reading a node's TAP
while its uplink holds more than BP_BYTES, so TCP small queues throttle the
sender as a real NIC ring would.  The downlink tail-drops only past QMAX_BYTES
of queue, as deep as testbed.sh's tbf queue: a drop costs TCP a 200 ms
retransmission timeout that an MPI collective would wait out, and training
fabrics are lossless anyway.

Runs until SIGTERM or until its parent (testbed.sh) dies; ignores SIGINT.
"""

import argparse
import ctypes
import fcntl
import heapq
import os
import select
import signal
import struct
import sys
import time

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
TUNSETOFFLOAD = 0x400454D0
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6, TUN_F_TSO_ECN = 0x01, 0x02, 0x04, 0x08
PR_SET_PDEATHSIG = 1
VNET_HDR = 10  # struct virtio_net_hdr (no num_buffers): the TAP default
READ_MAX = VNET_HDR + 65536 + 64
BP_BYTES = 2 * 65536  # uplink backlog (bytes) above which we stop reading
QMAX_BYTES = 32 << 20  # downlink backlog above which we drop
EARLY_S = 25e-6  # wake this long before an event, then poll (timer lateness)

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def setns(path):
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.setns(fd, CLONE_NEWNET), f"setns {path}")
    finally:
        os.close(fd)


def open_tap(name):
    # The device lands in the network namespace we are in when /dev/net/tun
    # is opened, so the caller setns()-es first.
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    ifr = struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI | IFF_VNET_HDR)
    fcntl.ioctl(fd, TUNSETIFF, ifr)
    fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN)
    return fd


def wire_bytes(buf):
    """(L2 bytes the frame occupies once segmented, bytes of its largest
    segment): what tbf would charge after splitting a GSO frame."""
    frame = len(buf) - VNET_HDR
    _flags, gso_type, hdr_len, gso_size, csum_start = struct.unpack_from("<BBHHH", buf)
    if (gso_type & 0x7F) == 0 or gso_size == 0:
        return frame, frame
    th = VNET_HDR + csum_start + 12  # TCP data-offset byte
    hl = csum_start + (buf[th] >> 4) * 4 if th < len(buf) else hdr_len
    payload = frame - hl
    if payload <= gso_size or hl <= 0:
        return frame, frame
    nseg = -(-payload // gso_size)
    return frame + (nseg - 1) * hl, hl + gso_size


class Port:
    __slots__ = ("fd", "up_free", "down_free")

    def __init__(self, fd):
        self.fd = fd
        self.up_free = 0.0  # time the uplink finishes its backlog
        self.down_free = 0.0  # time the downlink finishes its backlog


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=0, help="bits/s per link, 0 = unlimited")
    ap.add_argument("--delay-us", type=float, default=0, help="one-way delay node->switch")
    ap.add_argument("--ifname", default="eth0")
    ap.add_argument("--ready", required=True, help="file to write once the TAPs exist")
    ap.add_argument("--parent", type=int, default=0, help="exit if this pid is not our parent")
    ap.add_argument("--stats", action="store_true", help="print counters on exit")
    ap.add_argument("netns", nargs="+", help="node namespaces, node0 first")
    a = ap.parse_args()

    # Die with testbed.sh even when it is SIGKILLed, so TAPs never outlive it.
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0), "prctl")
    if a.parent and os.getppid() != a.parent:
        sys.exit("linkemu: parent already gone")

    def stop(_sig, _frm):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    # Ctrl-C reaches the whole foreground process group; the links must stay
    # up while testbed.sh stops COMMAND, and it ends us with SIGTERM after.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    home = f"/proc/{os.getpid()}/ns/net"
    home_fd = os.open(home, os.O_RDONLY | os.O_CLOEXEC)
    ports = []
    for ns in a.netns:
        setns(f"/run/netns/{ns}")
        ports.append(Port(open_tap(a.ifname)))
    _check(_libc.setns(home_fd, CLONE_NEWNET), "setns back")
    os.close(home_fd)
    with open(a.ready, "w") as f:
        f.write("ready\n")

    bps = a.rate / 8.0  # bytes per second, 0 = unlimited
    delay = a.delay_us * 1e-6
    bp_s = BP_BYTES / bps if bps else 0.0
    qmax_s = QMAX_BYTES / bps if bps else 0.0
    fd_port = {p.fd: i for i, p in enumerate(ports)}
    mac_port = {}  # learning switch: source MAC -> port index
    heap = []  # (delivery time, seq, port, frame); seq keeps FIFO order on ties
    seq = 0
    clock = time.monotonic
    n_in = n_out = n_drop = n_flood = 0

    try:
        while True:
            now = clock()
            while heap and heap[0][0] <= now:
                _, _, j, buf = heapq.heappop(heap)
                try:
                    os.write(ports[j].fd, buf)
                    n_out += 1
                except OSError:  # NIC down or its queue full: the frame is lost
                    n_drop += 1
            wake = heap[0][0] if heap else None
            rlist = []
            for p in ports:
                if not bps or p.up_free - now < bp_s:
                    rlist.append(p.fd)
                else:  # back-pressured: look again once the backlog drains
                    w = p.up_free - bp_s
                    wake = w if wake is None else min(wake, w)
            # Timers fire ~20 us late here even under SCHED_FIFO (more in a
            # VM), so sleep until EARLY before the next event and poll the
            # rest of the way: latency stays near the configured delay.
            timeout = None if wake is None else max(0.0, wake - clock() - EARLY_S)
            ready, _, _ = select.select(rlist, [], [], timeout)
            now = clock()
            for fd in ready:
                i = fd_port[fd]
                p = ports[i]
                while not bps or p.up_free - now < bp_s:
                    try:
                        buf = os.read(fd, READ_MAX)
                    except BlockingIOError:
                        break
                    if len(buf) < VNET_HDR + 14:
                        continue
                    n_in += 1
                    # Uplink: serialise behind the node's backlog, then the
                    # propagation delay; t is when the last byte is at the switch.
                    wb, seg = wire_bytes(buf)
                    ser = wb / bps if bps else 0.0
                    p.up_free = max(now, p.up_free) + ser
                    t = p.up_free + delay
                    # Switch, decided now rather than at t (one timer per frame
                    # instead of two): downlinks serve frames in the order
                    # the switch learns of them, a reordering bounded by the
                    # uplink backlog (BP_BYTES) between different senders.
                    dst = buf[VNET_HDR:VNET_HDR + 6]
                    mac_port[buf[VNET_HDR + 6:VNET_HDR + 12]] = i
                    if dst[0] & 1 or dst not in mac_port:
                        targets = [j for j in range(len(ports)) if j != i]
                        n_flood += 1
                    else:
                        targets = (mac_port[dst],)
                    # Cut-through at segment granularity: a GSO frame stands
                    # for many wire frames and a switch forwards the first
                    # while the rest still arrive, so the downlink may start
                    # once one segment is in. Store-and-forward of a whole
                    # 64 KiB frame would double every message's transfer time.
                    first = t - ser + seg / bps if bps else t
                    for j in targets:
                        q = ports[j]
                        start = max(first, q.down_free)
                        if bps and start - first > qmax_s:
                            n_drop += 1
                            continue
                        q.down_free = start + ser
                        seq += 1
                        heapq.heappush(heap, (q.down_free, seq, j, buf))
    finally:
        if a.stats:
            print(f"linkemu: frames in={n_in} out={n_out} dropped={n_drop} flooded={n_flood}",
                  file=sys.stderr)


if __name__ == "__main__":
    main()
