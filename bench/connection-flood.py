#!/usr/bin/env python3
"""Silent-connection flood against a `smithers-sandbox serve` child (loopback only, bounded).

Opens N TCP connections to the server that never send a byte (slowloris at its simplest),
then reports the server's open descriptors while they are held, how long a well-behaved
`GET /health` on a new connection takes to be answered, how many of the silent connections
the server closed (waiting at most 15 s after the health check) and its descriptors after.

    bench/connection-flood.py BINARY N [serve flags...]
    bench/connection-flood.py "$(scripts/bin-dir debug)/smithers-sandbox" 500 --header-timeout-ms 1000 --max-connections 64

Prints one Markdown table row:
| flags | silent conns | fds before | fds while held | /health | closed by the server | fds after |
"""
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

binary, n, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
assert 0 < n <= 5000, "bounded: at most 5000 connections"
data = tempfile.mkdtemp()
server = subprocess.Popen(
    [binary, "serve", "--listen", "127.0.0.1:0", "--data-dir", data, *extra],
    stderr=subprocess.PIPE,
    stdout=subprocess.DEVNULL,
    env={**os.environ, "SMITHERS_SANDBOX_TOKEN": "flood-test-token-0123456789"},
)
addr = None
for _ in range(20):
    m = re.search(r"serving on http://(\S+)", server.stderr.readline().decode())
    if m:
        addr = m.group(1)
        break
assert addr, "the server printed no address"
host, port = addr.rsplit(":", 1)
port = int(port)


def fds():
    return len(os.listdir(f"/proc/{server.pid}/fd"))


try:
    before = fds()
    silent = [socket.create_connection((host, port)) for _ in range(n)]
    time.sleep(0.5)
    held = fds()

    start = time.time()
    try:
        s = socket.create_connection((host, port), timeout=30)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        health = s.recv(100).decode(errors="replace").split("\r\n")[0]
        s.close()
    except OSError as e:
        health = type(e).__name__
    health = f"{health} after {time.time() - start:.2f} s"

    def closed():
        count = 0
        for c in silent:
            c.setblocking(False)
            try:
                if c.recv(1) == b"":
                    count += 1
            except BlockingIOError:
                pass
            except ConnectionResetError:
                count += 1
        return count

    start = time.time()
    while (done := closed()) < n and time.time() - start < 15:
        time.sleep(0.25)
    after = fds()
    print(f"| {' '.join(extra) or '(defaults)'} | {n} | {before} | {held} | {health} | {done}/{n} | {after} |")
    for c in silent:
        c.close()
finally:
    server.terminate()
    server.wait(timeout=60)
