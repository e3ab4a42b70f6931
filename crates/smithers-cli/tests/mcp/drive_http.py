"""Drives the MCP endpoint of `smithers-sandbox serve` (POST /v1/mcp, streamable HTTP) with the
official MCP Python SDK's streamable-HTTP client, as a remote agent would: handshake, tools,
a session over an empty workspace, 100 commands, byte-exact output, binary files, a
listing, checkpoint and restore, two commands at once, another token's view, stop. Every
check is an assert; the last line printed is a JSON summary the Rust test reads.

Usage: python drive_http.py URL TOKEN OTHER_TOKEN
"""

import asyncio
import base64
import json
import sys
import urllib.request

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def call(session, name, **args):
    result = await session.call_tool(name, args)
    return result.structured_content, result.is_error


def client(url, token):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return streamable_http_client(url, http_client=create_mcp_http_client(headers=headers))


async def as_other(url, token, sid):
    """Another token: the session does not exist for it, and it has none of its own."""
    async with client(url, token) as (read, write, *_):
        async with ClientSession(read, write) as session:
            await session.initialize()
            listed, err = await call(session, "session_list")
            assert not err and listed["sessions"] == [], listed
            out, err = await call(session, "session_exec", sessionId=sid, command=["true"])
            assert err and out["code"] == "NOT_FOUND", out
            r, err = await call(session, "session_read", sessionId=sid, path="a.txt")
            assert err and r["code"] == "NOT_FOUND", r


async def read_text(session, sid, path):
    r, err = await call(session, "session_read", sessionId=sid, path=path)
    return None if err else r["content"]


async def forks(session, sid, url, token):
    """Forks start from the parent's state (now, or a checkpoint), then change apart; a fork
    outlives its parent's removal."""
    await call(session, "session_write", sessionId=sid, path="shared.txt", content="before\n")
    one, err = await call(session, "session_fork", sessionId=sid)
    assert not err and one["sandbox"]["state"] == "live", one
    two, err = await call(session, "session_fork", sessionId=sid, checkpoint=one["checkpoint"])
    assert not err and two["checkpoint"] == one["checkpoint"], two
    old, err = await call(session, "session_fork", sessionId=sid, checkpoint="cp-1")
    assert not err, old
    a, b, c = one["sessionId"], two["sessionId"], old["sessionId"]
    await call(session, "session_write", sessionId=sid, path="parent.txt", content="p\n")
    await call(session, "session_write", sessionId=a, path="shared.txt", content="a\n")
    await call(session, "session_write", sessionId=b, path="b.txt", content="b\n")
    assert await read_text(session, sid, "shared.txt") == "before\n"
    assert await read_text(session, a, "shared.txt") == "a\n"
    assert await read_text(session, b, "shared.txt") == "before\n"
    assert await read_text(session, c, "shared.txt") is None  # cp-1 was before it
    assert await read_text(session, c, "a.txt") == "ünïcode\n"
    for other in (a, b, c):
        assert await read_text(session, other, "parent.txt") is None, other
    assert await read_text(session, sid, "b.txt") is None
    assert await read_text(session, a, "b.txt") is None
    out, err = await call(session, "session_fork", sessionId=sid, checkpoint="cp-99")
    assert err and out["code"] == "NOT_FOUND", out
    listed, _ = await call(session, "session_list")
    assert len(listed["sessions"]) == 4, listed
    for doomed in (b, c):
        stopped, err = await call(session, "session_stop", sessionId=doomed)
        assert not err, stopped
        delete(url, token, doomed)

    # A fork outlives its parent: the parent's sandbox is deleted over HTTP (its processes
    # end, its directory stays for the fork), and the fork runs on, whole.
    parent, err = await call(session, "session_start")
    assert not err, parent
    pid = parent["sessionId"]
    await call(session, "session_write", sessionId=pid, path="kept/deep.txt", content="kept\n")
    child, err = await call(session, "session_fork", sessionId=pid)
    assert not err, child
    delete(url, token, pid)
    out, err = await call(session, "session_exec", sessionId=pid, command=["true"])
    assert err and out["code"] == "NOT_FOUND", out
    fid = child["sessionId"]
    assert await read_text(session, fid, "kept/deep.txt") == "kept\n"
    await call(session, "session_write", sessionId=fid, path="kept/new.txt", content="new\n")
    out, err = await call(session, "session_exec", sessionId=fid, command=["cat", "kept/deep.txt", "kept/new.txt"])
    assert out["stdout"] == "kept\nnew\n", out
    for done in (a, fid):
        stopped, err = await call(session, "session_stop", sessionId=done)
        assert not err and stopped["sandbox"]["state"] == "completed", stopped
    return pid, fid


def delete(url, token, sandbox):
    request = urllib.request.Request(f"{url.rsplit('/mcp', 1)[0]}/sandboxes/{sandbox}", method="DELETE",
                                     headers={"Authorization": f"Bearer {token}"})
    assert urllib.request.urlopen(request).status == 204


async def without_token(url):
    try:
        async with client(url, None) as (read, write, *_):
            async with ClientSession(read, write) as session:
                await asyncio.wait_for(session.initialize(), 30)
    except BaseException as e:  # the SDK raises its own error (or a group) for the 401
        return repr(e)
    raise AssertionError("a client without a token was served")


async def main(url, token, other):
    refused = await without_token(url)
    async with client(url, token) as (read, write, *_):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = sorted(t.name for t in (await session.list_tools()).tools)
            assert "session_exec" in tools and "session_checkpoint" in tools, tools
            assert "session_accept" not in tools and "session_diff" not in tools, tools

            started, err = await call(session, "session_start")
            assert not err, started
            sid = started["sessionId"]

            # Output is byte-exact: text when UTF-8, base64 otherwise; the exit code is the command's.
            out, err = await call(session, "session_exec", sessionId=sid,
                                  command=["sh", "-c", "printf 'h\\351\\000llo'; echo oops >&2; exit 3"])
            assert not err, out
            assert out["exit"]["exitCode"] == 3, out
            assert base64.b64decode(out["stdoutBase64"]) == b"h\xe9\x00llo", out
            assert out["stderr"] == "oops\n", out

            # stdin, env and cwd of one command.
            out, err = await call(session, "session_exec", sessionId=sid,
                                  command=["sh", "-c", "mkdir -p d && cd d && cat && echo $K && pwd"],
                                  stdin="in\n", env={"K": "v"})
            assert out["stdout"] == "in\nv\n/workspace/d\n", out

            # Bounded: a stream past its bound is cut and says so, counted whole.
            out, err = await call(session, "session_exec", sessionId=sid,
                                  command=["head", "-c", "300000", "/dev/zero"], maxOutputBytes=1000)
            assert out["stdoutTruncated"] and out["stdoutBytes"] == 300000, out["stdoutBytes"]
            assert len(out["stdout"]) == 1000, len(out["stdout"])

            # Files: binary in, the same bytes out; absence is NOT_FOUND; a directory is refused.
            blob = bytes(range(256)) * 40
            w, err = await call(session, "session_write", sessionId=sid, path="deep/b.bin",
                                contentBase64=base64.b64encode(blob).decode())
            assert not err and w["sizeBytes"] == len(blob), w
            r, err = await call(session, "session_read", sessionId=sid, path="deep/b.bin")
            assert not err and base64.b64decode(r["contentBase64"]) == blob, r.keys()
            assert r["sizeBytes"] == len(blob) and not r["truncated"], r["sizeBytes"]
            w, err = await call(session, "session_write", sessionId=sid, path="a.txt", content="ünïcode\n")
            assert not err, w
            r, err = await call(session, "session_read", sessionId=sid, path="a.txt")
            assert r["content"] == "ünïcode\n", r
            r, err = await call(session, "session_read", sessionId=sid, path="missing.txt")
            assert err and r["code"] == "NOT_FOUND", r
            r, err = await call(session, "session_read", sessionId=sid, path="deep")
            assert err and r["code"] == "INVALID_INPUT", r
            # A file without end is read to the bound, and the host goes on.
            r, err = await call(session, "session_read", sessionId=sid, path="/dev/zero", maxBytes=10)
            assert not err and r["truncated"] and r["content"] == "\0" * 10 and r["sizeBytes"] is None, r
            assert (await session.send_ping()) is not None

            ls, err = await call(session, "session_list_dir", sessionId=sid)
            kinds = {e.get("name"): e["type"] for e in ls["entries"]}
            assert kinds == {"deep": "directory", "a.txt": "file", "d": "directory"}, kinds
            ls, err = await call(session, "session_list_dir", sessionId=sid, path="nowhere")
            assert err and ls["code"] == "NOT_FOUND", ls
            ls, err = await call(session, "session_list_dir", sessionId=sid, path="a.txt")
            assert err and ls["code"] == "INVALID_INPUT", ls
            # A directory whose name ends in a newline is made and written into as named.
            w, err = await call(session, "session_write", sessionId=sid, path="nl\n/x.txt", content="n\n")
            assert not err, w
            r, err = await call(session, "session_read", sessionId=sid, path="nl\n/x.txt")
            assert not err and r["content"] == "n\n", r
            await call(session, "session_exec", sessionId=sid, command=["rm", "-r", "nl\n"])

            # Checkpoint, change, restore: the change is gone, the checkpoint's state is back.
            cp, err = await call(session, "session_checkpoint", sessionId=sid)
            assert not err and cp["checkpoint"] == "cp-1", cp
            await call(session, "session_write", sessionId=sid, path="a.txt", content="changed\n")
            await call(session, "session_write", sessionId=sid, path="later.txt", content="later\n")
            done, err = await call(session, "session_restore", sessionId=sid, checkpoint="cp-1")
            assert not err, done
            r, _ = await call(session, "session_read", sessionId=sid, path="a.txt")
            assert r["content"] == "ünïcode\n", r
            r, err = await call(session, "session_read", sessionId=sid, path="later.txt")
            assert err and r["code"] == "NOT_FOUND", r
            bad, err = await call(session, "session_restore", sessionId=sid, checkpoint="cp-9")
            assert err and bad["code"] == "NOT_FOUND", bad

            # Two commands at once: the second is not held behind the first.
            slow = call(session, "session_exec", sessionId=sid,
                        command=["sh", "-c", "while [ ! -e /workspace/go ]; do sleep 0.05; done; echo waited"])
            fast = call(session, "session_exec", sessionId=sid, command=["sh", "-c", "touch /workspace/go; echo quick"])
            (s_out, _), (f_out, _) = await asyncio.wait_for(asyncio.gather(slow, fast), 60)
            assert s_out["stdout"] == "waited\n" and f_out["stdout"] == "quick\n", (s_out, f_out)

            # 100 commands in the one session, each its own output.
            for i in range(100):
                out, err = await call(session, "session_exec", sessionId=sid, command=["echo", str(i)])
                assert not err and out["stdout"] == f"{i}\n", out

            listed, err = await call(session, "session_list")
            assert [s["sessionId"] for s in listed["sessions"]] == [sid], listed

            forked_parent, fork = await forks(session, sid, url, token)

            await as_other(url, other, sid)

            stopped, err = await call(session, "session_stop", sessionId=sid)
            assert not err and stopped["sandbox"]["state"] == "completed", stopped
            out, err = await call(session, "session_exec", sessionId=sid, command=["true"])
            assert err and out["code"] == "SANDBOX_EXECUTION_FAILED", out
            print(json.dumps({"sessionId": sid, "refusedWithoutToken": refused[:200], "execs": 100,
                              "deletedParent": forked_parent, "fork": fork}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
