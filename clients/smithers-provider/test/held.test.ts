/**
 * The held session (`openSession`) against a real `smithers-sandbox serve` ($SMITHERS_SANDBOX_BIN)
 * running native sandboxes: a port of upstream Smithers' SandboxConformance behaviours (byte
 * round trips, not_found, parent directories, workdir and cwd, env and stdin, reacquisition by
 * key, files from the machine the processes run on, kill), plus many and concurrent commands,
 * stop, and another token.
 *
 * Without the binary or native sandboxes the tests print SKIP; under CI=true they fail.
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import type { TestContext } from "node:test";

import { FrameDecoder, openSession, SandboxHostClient, sessionIdsFor, SmithersSandboxError } from "../src/index.js";
import type { OpenSessionOptions, Session } from "../src/index.js";
import { binPath, nativeUnavailable, skipOrFail, startServer, TOKEN } from "./helpers.js";
import type { Server } from "./helpers.js";

/** A bound so a hung command fails the suite instead of hanging CI (not a timing assertion). */
const TEST_TIMEOUT_MS = 180_000;
/** A second client's token (`SMITHERS_SANDBOX_TOKENS`). */
const OTHER_TOKEN = "another-client-token-of-sufficient-length";

let server: Server | undefined;
let skipReason: string | undefined;
const opened: Session[] = [];
const scratch: string[] = [];
let keys = 0;

before(async () => {
  const bin = binPath();
  if (bin === undefined) {
    skipReason = skipOrFail("SMITHERS_SANDBOX_BIN does not name the smithers-sandbox binary");
    return;
  }
  const native = nativeUnavailable(bin);
  if (native !== null) {
    skipReason = skipOrFail(native);
    return;
  }
  server = await startServer(bin, [], { SMITHERS_SANDBOX_TOKENS: `other:${OTHER_TOKEN}` });
});

after(async () => {
  for (const s of opened) await s.destroy().catch(() => {});
  await server?.stop();
  for (const dir of scratch) await rm(dir, { recursive: true, force: true });
});

function ready(t: TestContext): boolean {
  if (skipReason !== undefined) {
    t.skip(skipReason);
    return false;
  }
  return true;
}

/** A fresh key per test, so tests never share a session unless they mean to. */
function freshKey(name: string): string {
  keys += 1;
  return `held-${name}-${process.pid}-${keys}`;
}

async function open(options: Partial<OpenSessionOptions> & { key: string }): Promise<Session> {
  const s = await openSession({ url: server!.url, token: TOKEN, ...options });
  opened.push(s);
  return s;
}

const ALL_BYTES = Uint8Array.from({ length: 256 }, (_, i) => i);
const utf8 = (b: Uint8Array) => Buffer.from(b).toString("utf8");

// Frame decoding needs no host: it runs even where sandboxes cannot.
test("frames split anywhere come out whole; an unknown kind or an oversized frame is refused", () => {
  const frame = (kind: string, payload: Uint8Array) => {
    const out = Buffer.alloc(5 + payload.length);
    out[0] = kind.charCodeAt(0);
    out.writeUInt32BE(payload.length, 1);
    Buffer.from(payload).copy(out, 5);
    return out;
  };
  const wire = Buffer.concat([frame("o", Uint8Array.of(0x61, 0, 0xff)), frame("e", new Uint8Array(0)), frame("x", Buffer.from("{}"))]);
  for (let cut = 0; cut <= wire.length; cut++) {
    const d = new FrameDecoder();
    const got: Array<[number, number[]]> = [];
    for (const part of [wire.subarray(0, cut), wire.subarray(cut)]) {
      d.push(part);
      for (let f = d.next(); f !== null; f = d.next()) got.push([f.kind, [...f.payload]]);
    }
    assert.deepEqual(got, [
      [0x6f, [0x61, 0, 0xff]],
      [0x65, []],
      [0x78, [...Buffer.from("{}")]],
    ]);
    assert.equal(d.pending, 0);
  }
  const unknown = new FrameDecoder();
  unknown.push(Uint8Array.of(0x7a, 0, 0, 0, 0));
  assert.throws(() => unknown.next(), (e: unknown) => e instanceof SmithersSandboxError && /unknown kind/.test(e.message));
  const huge = new FrameDecoder();
  huge.push(Uint8Array.of(0x6f, 0, 0x10, 0, 1));
  assert.throws(() => huge.next(), (e: unknown) => e instanceof SmithersSandboxError && /over 1048576/.test(e.message));
});

test("keys become plain host ids; other keys are hashed, never colliding with a plain one; each token has its own", () => {
  const plain = sessionIdsFor("build-42", TOKEN);
  assert.equal(plain.runId, "build-42");
  assert.match(plain.sandboxId, /^session-[0-9a-f]{12}$/);
  const odd = sessionIdsFor("workflow:run/7 node", TOKEN);
  assert.match(odd.runId, /^workflow_run_7_node-[0-9a-f]{32}$/);
  assert.match(odd.sandboxId, /^session-h-[0-9a-f]{12}$/);
  assert.notDeepEqual(sessionIdsFor("a b", TOKEN), sessionIdsFor("a/b", TOKEN));
  assert.notDeepEqual(sessionIdsFor("build-42", OTHER_TOKEN), plain);
  assert.ok(!plain.sandboxId.includes(TOKEN));
  assert.throws(() => sessionIdsFor("", TOKEN), (e: unknown) => e instanceof SmithersSandboxError && e.code === "INVALID_INPUT");
});

/**
 * A host that breaks the exec protocol, one way per program name: it claims a live session for
 * the key, so `openSession` attaches to it, and answers each command as its argv[0] says.
 */
async function hostileHost(): Promise<{ url: string; close: () => Promise<void> }> {
  const ids = sessionIdsFor("hostile", TOKEN);
  const frame = (kind: string, payload: Uint8Array | string, len?: number) => {
    const bytes = typeof payload === "string" ? Buffer.from(payload) : Buffer.from(payload);
    const head = Buffer.alloc(5);
    head[0] = kind.charCodeAt(0);
    head.writeUInt32BE(len ?? bytes.length, 1);
    return Buffer.concat([head, bytes]);
  };
  const exit = frame("x", JSON.stringify({ termination: "exited", exitCode: 0, signal: null, duration: 1, stdoutBytes: 2, stderrBytes: 0 }));
  const srv = createServer((req, res) => {
    if (req.method === "GET" && req.url === "/v1/sandboxes") {
      res.setHeader("content-type", "application/json");
      res.end(JSON.stringify([{ id: "sbx-hostile", ...ids, runtime: "native", state: "live", createdAtMs: 0 }]));
      return;
    }
    let body = "";
    req.on("data", (c: Buffer) => (body += c.toString()));
    req.on("end", () => {
      const argv = (JSON.parse(body) as { argv: string[] }).argv;
      res.setHeader("content-type", "application/vnd.smithers.exec-stream");
      switch (argv[0]) {
        case "ok":
          res.end(Buffer.concat([frame("o", "hi"), exit]));
          break;
        case "unknown-kind":
          res.end(Buffer.concat([frame("o", "hi"), frame("z", "?")]));
          break;
        case "oversized":
          // Claims a frame of 2 GiB and keeps sending: refused at its header, never buffered.
          res.write(frame("o", "", 0x7fff_ffff));
          res.write(Buffer.alloc(64 * 1024));
          break;
        case "cut":
          res.end(frame("o", "partial"));
          break;
        case "after-end":
          res.end(Buffer.concat([exit, frame("o", "late")]));
          break;
        case "failed":
          res.end(frame("f", JSON.stringify({ code: "TASK_RUNTIME_UNAVAILABLE", message: "the engine is gone", details: { why: "test" } })));
          break;
        default:
          res.statusCode = 404;
          res.end(JSON.stringify({ code: "NOT_FOUND", message: "no" }));
      }
    });
  });
  await new Promise<void>((resolve) => srv.listen(0, "127.0.0.1", resolve));
  const { port } = srv.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        srv.closeAllConnections();
        srv.close(() => resolve());
      }),
  };
}

// Needs no sandbox: a fake host on loopback.
test("whatever the host sends is checked: unknown kinds, oversized frames, cut streams, bytes after the end, error reports", { timeout: TEST_TIMEOUT_MS }, async () => {
  const host = await hostileHost();
  try {
    const s = await openSession({ url: host.url, token: TOKEN, key: "hostile" });
    assert.equal(s.reacquired, true);
    assert.equal(s.id, "sbx-hostile");
    const ok = await s.spawn(["ok"]);
    assert.equal(utf8(ok.stdout), "hi");
    const failed = (pattern: RegExp, code = "SANDBOX_EXECUTION_FAILED") => (e: unknown) =>
      e instanceof SmithersSandboxError && e.code === code && pattern.test(e.message);
    await assert.rejects(s.spawn(["unknown-kind"]), failed(/unknown kind 0x7a/));
    await assert.rejects(s.spawn(["oversized"]), failed(/over 1048576/));
    await assert.rejects(s.spawn(["cut"]), failed(/ended before the command's end/));
    await assert.rejects(s.spawn(["after-end"]), failed(/after the command's end/));
    await assert.rejects(s.spawn(["failed"]), failed(/the engine is gone/, "TASK_RUNTIME_UNAVAILABLE"));
  } finally {
    await host.close();
  }
});

test("all 256 byte values round-trip through writeFile/readFile and through spawn stdin to stdout", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const s = await open({ key: freshKey("bytes") });
  await s.writeFile("bytes.bin", ALL_BYTES);
  const back = await s.readFile("bytes.bin");
  assert.ok(back instanceof Uint8Array);
  assert.deepEqual(back, ALL_BYTES);
  const echoed = await s.spawn(["cat"], { stdin: ALL_BYTES });
  assert.equal(echoed.exitCode, 0);
  assert.equal(echoed.termination, "exited");
  assert.deepEqual(echoed.stdout, ALL_BYTES);
  assert.equal(echoed.stdoutTruncated, false);
  // Bytes to stderr stay bytes too.
  const err = await s.spawn(["/bin/sh", "-c", "cat >&2"], { stdin: ALL_BYTES });
  assert.deepEqual(err.stderr, ALL_BYTES);
  assert.equal(err.stdout.length, 0);
});

test("megabytes of random bytes round-trip whole (frames split and joined)", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const s = await open({ key: freshKey("large") });
  const data = new Uint8Array(randomBytes(3 * 1024 * 1024 + 17));
  await s.writeFile("large.bin", data);
  const back = await s.readFile("large.bin");
  assert.equal(back.length, data.length);
  assert.ok(Buffer.from(back).equals(Buffer.from(data)));
  const piped = await s.spawn(["cat"], { stdin: data });
  assert.ok(Buffer.from(piped.stdout).equals(Buffer.from(data)));
  assert.equal(piped.stdoutBytes, data.length);
});

test("a missing file is not_found; a directory is refused; parent directories are created", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const s = await open({ key: freshKey("files") });
  await assert.rejects(s.readFile("no/such/file"), (e: unknown) => e instanceof SmithersSandboxError && e.code === "NOT_FOUND");
  await assert.rejects(s.readFile("/nonexistent-dir/x"), (e: unknown) => e instanceof SmithersSandboxError && e.code === "NOT_FOUND");
  await s.writeFile("deep/er/and/deeper/file.txt", "nested\n");
  assert.equal(utf8(await s.readFile("deep/er/and/deeper/file.txt")), "nested\n");
  const listed = await s.spawn(["/bin/sh", "-c", "test -d deep/er/and/deeper && echo dir"]);
  assert.equal(utf8(listed.stdout), "dir\n");
  await assert.rejects(s.readFile("deep/er"), (e: unknown) => e instanceof SmithersSandboxError && e.code === "INVALID_INPUT");
  // An empty file is an empty file, not absence.
  await s.writeFile("empty", new Uint8Array(0));
  assert.equal((await s.readFile("empty")).length, 0);
});

test("the workdir is where commands run and relative paths resolve; a relative cwd resolves against it", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const s = await open({ key: freshKey("workdir") });
  assert.equal(s.workdir, "/workspace");
  assert.equal(utf8((await s.spawn("pwd")).stdout), "/workspace\n");
  await s.writeFile("sub/dir/marker", "m");
  assert.equal(utf8((await s.spawn("pwd", { cwd: "sub/dir" })).stdout), "/workspace/sub/dir\n");
  assert.equal(utf8((await s.spawn(["cat", "marker"], { cwd: "sub/dir" })).stdout), "m");
  assert.equal(utf8((await s.spawn("pwd", { cwd: "/tmp" })).stdout), "/tmp\n");
  assert.equal(utf8(await s.readFile("/workspace/sub/dir/marker")), "m");

  const other = await open({ key: freshKey("workdir-own"), workdir: "/workspace/app" });
  assert.equal(utf8((await other.spawn("pwd")).stdout), "/workspace/app\n");
  await other.writeFile("x.txt", "x");
  assert.equal(utf8((await other.spawn(["cat", "/workspace/app/x.txt"])).stdout), "x");
  await other.spawn("mkdir -p lib");
  assert.equal(utf8((await other.spawn("pwd", { cwd: "lib" })).stdout), "/workspace/app/lib\n");
});

test("the project is uploaded as the workspace; env and stdin are delivered", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const root = await mkdtemp(join(tmpdir(), "held-root-"));
  scratch.push(root);
  await writeFile(join(root, "hello.txt"), "from the project\n");
  const s = await open({ key: freshKey("env"), rootDir: root, env: { SESSION_VAR: "session-wide" } });
  assert.equal(utf8(await s.readFile("hello.txt")), "from the project\n");
  const r = await s.spawn('printf "%s|%s" "$SESSION_VAR" "$ONE_VAR"', { env: { ONE_VAR: "a value with spaces = and 'quotes'" } });
  assert.equal(utf8(r.stdout), "session-wide|a value with spaces = and 'quotes'");
  const stdin = await s.spawn(["/bin/sh", "-c", "cat; echo end"], { stdin: "line one\nline two\n" });
  assert.equal(utf8(stdin.stdout), "line one\nline two\nend\n");
  assert.equal(utf8((await s.spawn(["wc", "-c"], { stdin: "é\n" })).stdout).trim(), "3");
  // No stdin given: /dev/null, so a reader ends at once.
  assert.equal(utf8((await s.spawn(["cat"])).stdout), "");
  const code = await s.spawn("exit 3");
  assert.equal(code.exitCode, 3);
  assert.equal(code.termination, "exited");
});

test("stdin over 16 MiB is refused before anything is sent; output past the bound is cut, said, and drained", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const s = await open({ key: freshKey("bounds"), maxOutputBytes: 1000 });
  await assert.rejects(
    s.spawn(["cat"], { stdin: new Uint8Array(16 * 1024 * 1024 + 1) }),
    (e: unknown) => e instanceof SmithersSandboxError && e.code === "INVALID_INPUT" && /16777216/.test(e.message),
  );
  const big = await s.spawn("head -c 3000000 /dev/zero; echo done >&2");
  assert.equal(big.exitCode, 0);
  assert.equal(big.stdout.length, 1000);
  assert.equal(big.stdoutTruncated, true);
  assert.equal(big.stdoutBytes, 3_000_000);
  assert.equal(utf8(big.stderr), "done\n");
  assert.equal(big.stderrTruncated, false);
  // readFile refuses a file over its bound rather than cutting it.
  await s.spawn("head -c 5000 /dev/zero > big.bin");
  await assert.rejects(s.readFile("big.bin"), (e: unknown) => e instanceof SmithersSandboxError && e.code === "INVALID_INPUT" && /maxFileBytes/.test(e.message));
});

test("reacquisition by key: a second open of a live key is the same host sandbox and sees its files", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const key = freshKey("reacquire");
  const first = await open({ key });
  assert.equal(first.reacquired, false);
  await first.writeFile("state.txt", "kept");
  await first.spawn("echo from-spawn > spawned.txt");
  const second = await open({ key });
  assert.equal(second.reacquired, true);
  assert.equal(second.id, first.id);
  assert.equal(utf8(await second.readFile("state.txt")), "kept");
  assert.equal(utf8(await second.readFile("spawned.txt")), "from-spawn\n");
  const client = new SandboxHostClient({ url: server!.url, token: TOKEN });
  const mine = (await client.list()).filter((i) => i.runId === first.runId && i.sandboxId === first.sandboxId);
  assert.equal(mine.length, 1);
  assert.equal(mine[0]!.state, "live");
  // Once stopped, the key opens a new session (the old one replaced).
  await first.stop();
  const third = await open({ key });
  assert.equal(third.reacquired, false);
  assert.notEqual(third.id, first.id);
  await assert.rejects(third.readFile("state.txt"), (e: unknown) => e instanceof SmithersSandboxError && e.code === "NOT_FOUND");
});

test("two opens of one key at once end on one session", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const key = freshKey("race");
  const [a, b] = await Promise.all([open({ key }), open({ key })]);
  assert.equal(a.id, b.id);
  assert.deepEqual([a.reacquired, b.reacquired].sort(), [false, true]);
  await a.writeFile("from-a", "a");
  assert.equal(utf8(await b.readFile("from-a")), "a");
  assert.equal(await a.ping(), true);
});

test("files come from the machine the processes run on: spawn writes what readFile reads, and back", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const s = await open({ key: freshKey("machine") });
  await s.spawn(["/bin/sh", "-c", "printf 'made by a process\\000\\377' > /tmp/by-spawn && echo $$ > /tmp/pid"]);
  assert.deepEqual(await s.readFile("/tmp/by-spawn"), Uint8Array.from([...Buffer.from("made by a process"), 0, 0xff]));
  await s.writeFile("/tmp/by-writefile", ALL_BYTES);
  const r = await s.spawn(["/bin/sh", "-c", "od -An -tx1 /tmp/by-writefile | tr -d ' \\n' | head -c 12; echo; wc -c < /tmp/by-writefile"]);
  assert.equal(utf8(r.stdout), "000102030405\n256\n");
  // The sandbox's own /tmp, not this machine's.
  const hostSide = await import("node:fs").then((fs) => fs.existsSync("/tmp/by-writefile"));
  assert.equal(hostSide, false);
});

test("kill stops a sleep 1000 within 5 s, and it no longer runs", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const s = await open({ key: freshKey("kill") });
  const sleeping = s.spawn(["sleep", "1000"]);
  const outcome = sleeping.then(
    () => "resolved",
    (e: unknown) => e,
  );
  // Wait until it runs, then kill.
  for (let i = 0; i < 100; i++) {
    const ps = await s.spawn(["/bin/sh", "-c", "grep -l '^sleep' /proc/[0-9]*/cmdline 2>/dev/null | wc -l"]);
    if (utf8(ps.stdout).trim() !== "0") break;
    await new Promise((r) => setTimeout(r, 50));
  }
  const started = Date.now();
  await s.kill();
  const result = await outcome;
  const took = Date.now() - started;
  assert.ok(took < 5000, `kill took ${took} ms`);
  assert.ok(result instanceof SmithersSandboxError && result.code === "PROCESS_ABORTED", `spawn ended with ${String(result)}`);
  // The host killed it: no sleep is left in the session (given a moment to reap).
  let left = "1";
  for (let i = 0; i < 50 && left !== "0"; i++) {
    const ps = await s.spawn(["/bin/sh", "-c", "grep -l '^sleep' /proc/[0-9]*/cmdline 2>/dev/null | wc -l"]);
    left = utf8(ps.stdout).trim();
    if (left !== "0") await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(left, "0");
  // The session still works after a kill.
  assert.equal((await s.spawn("echo alive")).exitCode, 0);
  // A caller's signal stops one command the same way.
  const ctl = new AbortController();
  const one = s.spawn(["sleep", "1000"], { signal: ctl.signal });
  setTimeout(() => ctl.abort(), 200);
  await assert.rejects(one, (e: unknown) => e instanceof SmithersSandboxError && e.code === "PROCESS_ABORTED");
});

test("a command's timeout ends it with termination timeout; a signal with signaled", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const s = await open({ key: freshKey("timeout") });
  const r = await s.spawn(["sleep", "1000"], { timeoutMs: 300 });
  assert.equal(r.termination, "timeout");
  assert.equal(r.exitCode, null);
  const killed = await s.spawn("kill -9 $$");
  assert.equal(killed.termination, "signaled");
  assert.equal(killed.signal, 9);
  assert.equal(killed.exitCode, null);
});

test("100 spawns in one session", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const s = await open({ key: freshKey("hundred") });
  for (let i = 0; i < 100; i++) {
    const r = await s.spawn(["/bin/sh", "-c", `echo ${i} >> count.txt; echo ${i}`]);
    assert.equal(r.exitCode, 0);
    assert.equal(utf8(r.stdout), `${i}\n`);
  }
  const lines = utf8(await s.readFile("count.txt")).trim().split("\n");
  assert.equal(lines.length, 100);
  assert.equal(lines[99], "99");
});

test("concurrent spawns each get their own output and end", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const s = await open({ key: freshKey("concurrent") });
  const results = await Promise.all(
    Array.from({ length: 8 }, (_, i) => s.spawn(["/bin/sh", "-c", `sleep 0.2; head -c ${1000 * (i + 1)} /dev/zero | tr '\\0' '${i}'; exit ${i}`])),
  );
  results.forEach((r, i) => {
    assert.equal(r.exitCode, i);
    assert.equal(r.stdout.length, 1000 * (i + 1));
    assert.ok(r.stdout.every((b) => b === 0x30 + i));
  });
  const files = await Promise.all(Array.from({ length: 5 }, (_, i) => s.writeFile(`c/${i}.txt`, `${i}`).then(() => s.readFile(`c/${i}.txt`))));
  assert.deepEqual(files.map(utf8), ["0", "1", "2", "3", "4"]);
});

test("stop ends the session: ping false, commands refused, the bundle collected on the host", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const s = await open({ key: freshKey("stop") });
  assert.equal(await s.ping(), true);
  await s.writeFile("result.txt", "made in the session\n");
  const info = await s.stop();
  assert.equal(info.state, "completed");
  assert.equal(await s.ping(), false);
  await assert.rejects(s.spawn("true"), (e: unknown) => e instanceof SmithersSandboxError && e.httpStatus === 409);
  const dir = await mkdtemp(join(tmpdir(), "held-bundle-"));
  scratch.push(dir);
  const client = new SandboxHostClient({ url: server!.url, token: TOKEN });
  await client.downloadBundle(s.id, join(dir, "bundle"));
  await s.destroy();
  assert.equal(await s.ping(), false);
});

test("another token cannot see the session, nor reacquire its key", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const key = freshKey("tokens");
  const mine = await open({ key });
  await mine.writeFile("secret.txt", "mine");
  const otherClient = new SandboxHostClient({ url: server!.url, token: OTHER_TOKEN });
  assert.equal((await otherClient.list()).some((i) => i.id === mine.id), false);
  await assert.rejects(otherClient.info(mine.id), (e: unknown) => e instanceof SmithersSandboxError && e.httpStatus === 404);
  await assert.rejects(otherClient.exec(mine.id, { argv: ["cat", "secret.txt"] }), (e: unknown) => e instanceof SmithersSandboxError && e.httpStatus === 404);
  const theirs = await openSession({ url: server!.url, token: OTHER_TOKEN, key });
  opened.push(theirs);
  assert.equal(theirs.reacquired, false);
  assert.notEqual(theirs.id, mine.id);
  await assert.rejects(theirs.readFile("secret.txt"), (e: unknown) => e instanceof SmithersSandboxError && e.code === "NOT_FOUND");
  assert.equal(await mine.ping(), true);
  assert.equal(utf8(await mine.readFile("secret.txt")), "mine");
});
