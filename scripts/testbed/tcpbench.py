#!/usr/bin/env python3
"""Raw TCP check of a testbed link, without MPI (used by check.sh).

  tcpbench.py serve PORT                 # in the receiving namespace
  tcpbench.py run HOST PORT [--mb 200]   # in the sending namespace

`run` measures the median/min round trip of a 1-byte echo (TCP_NODELAY) and
then the throughput of a bulk send of --mb MiB, and prints both; `serve`
answers one `run` and exits.
"""

import socket
import sys
import time

CHUNK = 1 << 20


def serve(port):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(1)
    c, _ = ls.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    f = c.makefile("rb")
    n_echo, total = (int(x) for x in f.readline().split())
    for _ in range(n_echo):
        c.sendall(f.read(1))
    got = 0
    while got < total:
        b = f.read1(CHUNK)
        if not b:
            break
        got += len(b)
    c.sendall(b"k")
    c.close()


def run(host, port, mb):
    n_echo, total = 2000, mb * CHUNK
    for _ in range(100):  # the server may still be starting
        try:
            s = socket.create_connection((host, port))
            break
        except ConnectionRefusedError:
            time.sleep(0.05)
    else:
        sys.exit("tcpbench: cannot connect")
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(f"{n_echo} {total}\n".encode())
    rtt = []
    for _ in range(n_echo):
        t0 = time.perf_counter()
        s.sendall(b"x")
        s.recv(1)
        rtt.append(time.perf_counter() - t0)
    rtt.sort()
    buf = b"\0" * CHUNK
    t0 = time.perf_counter()
    for _ in range(mb):
        s.sendall(buf)
    s.recv(1)  # the server has everything
    dt = time.perf_counter() - t0
    print(f"tcp rtt_med_us={rtt[len(rtt) // 2] * 1e6:.1f} rtt_min_us={rtt[0] * 1e6:.1f} "
          f"bulk_MBps={total / dt / 1e6:.1f} ({mb} MiB in {dt:.2f} s)")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    elif len(sys.argv) >= 4 and sys.argv[1] == "run":
        mb = int(sys.argv[sys.argv.index("--mb") + 1]) if "--mb" in sys.argv else 200
        run(sys.argv[2], int(sys.argv[3]), mb)
    else:
        sys.exit(__doc__)
