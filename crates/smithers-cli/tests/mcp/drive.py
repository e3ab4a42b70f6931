"""Drives `smithers-sandbox mcp` with the official MCP Python SDK (its stdio client), as an
agent would: start a session, run commands, write and read files (text and binary), list a
directory, look at the diff, stop. Every check is an assert; the last line printed is a JSON
summary the Rust test reads.

Usage: python drive.py SMITHERS_SANDBOX_BINARY PROJECT_ROOT
"""

import asyncio
import base64
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def call(session, name, **args):
    result = await session.call_tool(name, args)
    return result.structured_content, result.is_error, result


async def main(binary, root):
    params = StdioServerParameters(command=binary, args=["mcp", "--root", root])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            tools = sorted(t.name for t in (await session.list_tools()).tools)
            assert "session_exec" in tools and "session_accept" not in tools, tools

            started, err, _ = await call(session, "session_start")
            assert not err, started
            sid = started["sessionId"]

            # Output is byte-exact: text when UTF-8, base64 otherwise; the exit code is the command's.
            out, err, _ = await call(session, "session_exec", sessionId=sid,
                                     command=["sh", "-c", "printf 'h\\351\\000llo'; echo oops >&2; exit 3"])
            assert not err, out
            assert out["exit"]["exitCode"] == 3, out
            assert base64.b64decode(out["stdoutBase64"]) == b"h\xe9\x00llo", out
            assert out["stderr"] == "oops\n", out

            # stdin, env and cwd of one command.
            out, err, _ = await call(session, "session_exec", sessionId=sid, command=["sh", "-c", "mkdir -p d && cd d && cat && echo $K && pwd"],
                                     stdin="in\n", env={"K": "v"})
            assert out["stdout"] == "in\nv\n/workspace/d\n", out

            # Bounded: a stream past its bound is cut and says so.
            out, err, _ = await call(session, "session_exec", sessionId=sid, command=["head", "-c", "300000", "/dev/zero"],
                                     maxOutputBytes=1000)
            assert out["stdoutTruncated"] and out["stdoutBytes"] == 300000, {k: v for k, v in out.items() if "stdout" not in k or k != "stdoutBase64"}

            # Files: binary in, the same bytes out; absence is NOT_FOUND.
            blob = bytes(range(256)) * 40
            w, err, _ = await call(session, "session_write", sessionId=sid, path="deep/b.bin",
                                   contentBase64=base64.b64encode(blob).decode())
            assert not err, w
            r, err, _ = await call(session, "session_read", sessionId=sid, path="deep/b.bin")
            assert not err and base64.b64decode(r["contentBase64"]) == blob, r.keys()
            w, err, _ = await call(session, "session_write", sessionId=sid, path="notes.txt", content="ünïcode\n")
            r, err, _ = await call(session, "session_read", sessionId=sid, path="notes.txt")
            assert r["content"] == "ünïcode\n", r
            r, err, _ = await call(session, "session_read", sessionId=sid, path="missing.txt")
            assert err and r["code"] == "NOT_FOUND", r
            # A file without end is read to the bound, and the server goes on.
            r, err, _ = await call(session, "session_read", sessionId=sid, path="/dev/zero", maxBytes=10)
            assert not err and r["truncated"] and r["content"] == "\0" * 10 and r["sizeBytes"] is None, r
            assert (await session.send_ping()) is not None

            # accept is offered to nobody here, and never for what this server did not start.
            try:
                res = await session.call_tool("session_accept", {"sessionId": sid})
                assert res.is_error, res
            except Exception:
                pass

            ls, err, _ = await call(session, "session_list_dir", sessionId=sid)
            names = {e.get("name") for e in ls["entries"]}
            assert {"deep", "notes.txt", "d"} <= names, names

            # A session this server did not start is out of reach.
            try:
                out, err, _ = await call(session, "session_exec", sessionId="ses-someone-elses", command=["true"])
                reached = not err
            except Exception:
                reached = False
            assert not reached

            diff, err, _ = await call(session, "session_diff", sessionId=sid)
            paths = sorted(p["path"] for p in diff["patches"])
            # (the empty directory d/ is no change to a git tree)
            assert paths == ["deep/b.bin", "notes.txt"], paths
            assert "ünïcode" in diff["diff"], diff["diff"]

            # Many commands in the one session.
            for i in range(100):
                out, err, _ = await call(session, "session_exec", sessionId=sid, command=["true"])
                assert out["exit"]["exitCode"] == 0, out

            # Checkpoint, fork, restore: the fork starts from the checkpoint, its writes and
            # the parent's stay apart, the restore drops what came after the checkpoint.
            cp, err, _ = await call(session, "session_checkpoint", sessionId=sid)
            assert not err and cp["checkpoint"] == "cp-1", cp
            out, err, _ = await call(session, "session_exec", sessionId=sid, command=["sh", "-c", "echo later > notes.txt"])
            assert out["exit"]["exitCode"] == 0, out
            forked, err, _ = await call(session, "session_fork", sessionId=sid, checkpoint="cp-1")
            assert not err, forked
            fid = forked["sessionId"]
            w, err, _ = await call(session, "session_write", sessionId=fid, path="fork-only.txt", content="mine\n")
            assert not err, w
            r, err, _ = await call(session, "session_read", sessionId=fid, path="notes.txt")
            assert r["content"] == "ünïcode\n", r
            r, err, _ = await call(session, "session_read", sessionId=sid, path="fork-only.txt")
            assert err and r["code"] == "NOT_FOUND", r
            back, err, _ = await call(session, "session_restore", sessionId=sid, checkpoint="cp-1")
            assert not err, back
            r, err, _ = await call(session, "session_read", sessionId=sid, path="notes.txt")
            assert r["content"] == "ünïcode\n", r
            try:
                bad, err, _ = await call(session, "session_restore", sessionId=sid, checkpoint="--root=/")
                refused = err
            except Exception:
                refused = True
            assert refused
            fstop, err, _ = await call(session, "session_stop", sessionId=fid)
            assert not err and fstop["status"] == "review", fstop

            stopped, err, _ = await call(session, "session_stop", sessionId=sid)
            assert not err and stopped["status"] == "review", stopped
            print(json.dumps({"sessionId": sid, "tools": tools, "protocol": init.protocol_version, "paths": paths}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
