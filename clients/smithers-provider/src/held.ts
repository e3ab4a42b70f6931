/**
 * A held session on a smithers-sandbox host: the `Session` upstream Smithers' next line is
 * built on (`spawn`, `readFile`, `writeFile`, `kill`, `ping`, a workdir, reacquisition by key),
 * over serve's sessions (`POST …/start`, `…/exec`, `…/stop`):
 *
 * ```ts
 * const session = await openSession({ url, token, key: "build-42", rootDir: "." });
 * const r = await session.spawn(["make", "test"], { cwd: "sub" });
 * await session.writeFile("out/report.txt", "done\n");
 * await session.stop(); // collected on the host: GET …/bundle serves it
 * ```
 *
 * Opening makes one sandbox (its runId/sandboxId derived from the key and the token, see
 * {@link sessionIdsFor}), uploads `rootDir` (or an empty workspace) as the provider does,
 * ships a request document and starts it. Opening a key whose session is live on the host
 * (this token's, found through `GET /v1/sandboxes`) attaches to it instead: nothing is
 * uploaded then, and the files are the ones the earlier holder left.
 *
 * Every operation is a command of the session (`POST …/exec`): files are read and written by
 * `cat` inside, so they always come from the machine the processes run on, never from a
 * copy. Output is kept as bytes, never decoded, up to a bound per stream; past it the stream
 * is still drained (the command is not stalled or killed for it) and the cut is said in the
 * result. Everything the host sends is checked: a frame of an unknown kind or longer than
 * 1 MiB ends the command with an error, and no more than one frame is buffered at a time.
 */

import { mkdtemp, rm, stat } from "node:fs/promises";
import { createHash } from "node:crypto";
import { tmpdir } from "node:os";
import { join, posix } from "node:path";

import { abortedError } from "./client.js";
import type { Controls, ExecBody, RetryPolicy, SandboxHostClient, SandboxInfo } from "./client.js";
import { describeError, ErrorCodes, SmithersSandboxError } from "./errors.js";
import { hostClientFor } from "./provider.js";
import { selectUpload } from "./upload.js";

/** Frame kinds of `POST …/exec`'s answer (smithers_wire::session). */
export const FRAME_STDOUT = 0x6f; // 'o'
export const FRAME_STDERR = 0x65; // 'e'
export const FRAME_EXIT = 0x78; // 'x'
export const FRAME_FAILED = 0x66; // 'f'
/** The largest frame a host sends; a longer one is refused. */
export const MAX_FRAME_BYTES = 1 << 20;
/** The most stdin one command may carry (the host's bound, as upstream Smithers bounds it). */
export const MAX_STDIN_BYTES = 16 << 20;
/** Default bound on the bytes kept of each of stdout and stderr of one command. */
export const DEFAULT_MAX_OUTPUT_BYTES = 16 << 20;
/** Default workdir: where relative paths and cwds resolve. */
export const DEFAULT_WORKDIR = "/workspace";

/** `readFile`'s script: exit 66 for a missing path and 67 for a directory, told apart from cat's own failures. */
const READ_SCRIPT = '[ -e "$1" ] || exit 66; [ -d "$1" ] && exit 67; exec cat -- "$1"';
/** `writeFile`'s script: the parent directories, then the bytes from stdin. */
const WRITE_SCRIPT = 'd=$(dirname -- "$1") && mkdir -p -- "$d" && exec cat > "$1"';
const EXIT_MISSING = 66;
const EXIT_DIRECTORY = 67;

export type Termination = "exited" | "signaled" | "timeout" | "cancelled";

export type SpawnOptions = {
  /** Working directory: absolute, or relative to the session's workdir (default the workdir). */
  cwd?: string;
  /** Variables for this command, over the session's environment. */
  env?: Record<string, string>;
  /** The command's stdin (a string is sent as UTF-8), at most 16 MiB; none: `/dev/null`. */
  stdin?: Uint8Array | string;
  /** Killed (its process group) after this long; within the host's ceiling. Default the session's `timeoutMs`. */
  timeoutMs?: number;
  /** Aborting it closes the command's stream: the host kills the command, and `spawn` rejects with PROCESS_ABORTED. */
  signal?: AbortSignal;
  /** Bytes kept of each of stdout and stderr (default the session's `maxOutputBytes`). */
  maxOutputBytes?: number;
};

export type SpawnResult = {
  /** The exit code when the command exited on its own; null when a signal, a timeout or a cancel ended it. */
  exitCode: number | null;
  /** The signal that ended it, when one did. */
  signal?: number;
  termination: Termination;
  /** Its stdout, byte for byte, up to the bound. */
  stdout: Uint8Array;
  stderr: Uint8Array;
  /** Whether stdout went past the bound (only its first `maxOutputBytes` are in `stdout`). */
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  /** Bytes the command wrote to each stream in all, as the host counted them. */
  stdoutBytes: number;
  stderrBytes: number;
  durationMs: number;
};

export type OpenSessionOptions = {
  /** Base URL of the host; default `$CODEPLANE_API_URL`. */
  url?: string;
  /** Bearer token; default `$CODEPLANE_API_KEY`. Sessions are this token's: another token never sees them. */
  token?: string;
  /** What the session is reacquired by: opening a key whose session is live attaches to it. */
  key: string;
  /** The project uploaded as the session's workspace (default: an empty workspace). Not uploaded when attaching. */
  rootDir?: string;
  /** Where relative paths and cwds resolve (default `/workspace`); made when it does not exist. */
  workdir?: string;
  /** Environment of every command of the session (fixed when it is made). */
  env?: Record<string, string>;
  /** Whether the session may reach the host's network (default false). */
  allowNetwork?: boolean;
  /** More controls of the sandbox when it is made (memory, pids, disk, an egress policy, ...). */
  controls?: Controls;
  image?: string;
  /** Default timeout of one command (default none: the host's ceiling). */
  timeoutMs?: number;
  /** Bytes kept of each of stdout and stderr of one command (default 16 MiB). */
  maxOutputBytes?: number;
  /** The largest file `readFile` returns (default `maxOutputBytes`); a larger one is refused, never cut. */
  maxFileBytes?: number;
  /** How long `kill` waits for the commands it stopped to settle (default 5000 ms). */
  killTimeoutMs?: number;
  /** How long opening waits for a session of the same key that another opener is still making (default 30 s). */
  openWaitMs?: number;
  /** Upload options, as the provider's. */
  includeGit?: boolean;
  honourGitignore?: boolean;
  databasePath?: string;
  gzipLevel?: number;
  requestTimeoutMs?: number;
  retry?: Partial<RetryPolicy>;
  signal?: AbortSignal;
};

export type Session = {
  readonly key: string;
  /** The host's sandbox id. */
  readonly id: string;
  readonly runId: string;
  readonly sandboxId: string;
  readonly workdir: string;
  /** Whether opening attached to a session that was already live. */
  readonly reacquired: boolean;
  /** Runs one command; a string is run by `/bin/sh -c`. */
  spawn(command: string | string[], options?: SpawnOptions): Promise<SpawnResult>;
  /** The file's bytes; a missing file is NOT_FOUND, a directory INVALID_INPUT. */
  readFile(path: string): Promise<Uint8Array>;
  /** Writes the file whole (a string as UTF-8), making its parent directories; at most 16 MiB. */
  writeFile(path: string, data: Uint8Array | string): Promise<void>;
  /** Stops every command of this holder in flight (each `spawn` rejects with PROCESS_ABORTED). */
  kill(): Promise<void>;
  /** Whether the session is live on the host (false when stopped, gone, or the host is unreachable). */
  ping(): Promise<boolean>;
  /** Ends the session; the host collects its bundle (`GET …/bundle`). Returns what the host says of it. */
  stop(): Promise<SandboxInfo>;
  /** Removes the session from the host (stopped first if live). */
  destroy(): Promise<void>;
};

const PLAIN_ID = /^[A-Za-z0-9._-]{1,128}$/;

function plainId(id: string): boolean {
  return PLAIN_ID.test(id) && id !== "." && id !== "..";
}

/**
 * The host ids of a key's session for a token. A plain key (1-128 of `[A-Za-z0-9._-]`) is the
 * runId itself, so `smithers-sandbox` listings name it as it is; any other key becomes its
 * readable part and a hash, with a sandboxId of its own (`session-h-…`) so that no plain key
 * names the same pair. The sandboxId carries a tag of the token (a hash prefix, not the
 * token): keys are per token as sessions are, and the host's runtime names its state by the
 * pair alone, so two tokens opening one key must not ask for the same pair.
 */
export function sessionIdsFor(key: string, token: string): { runId: string; sandboxId: string } {
  if (typeof key !== "string" || key === "") {
    throw new SmithersSandboxError(ErrorCodes.INVALID_INPUT, "a held session needs a non-empty key");
  }
  const tag = createHash("sha256").update(`smithers-session-token\0${token}`, "utf8").digest("hex").slice(0, 12);
  if (plainId(key)) return { runId: key, sandboxId: `session-${tag}` };
  const readable = key.replace(/[^A-Za-z0-9._-]+/g, "_").slice(0, 80).replace(/^[.]/, "_");
  const hash = createHash("sha256").update(key, "utf8").digest("hex").slice(0, 32);
  return { runId: `${readable}-${hash}`, sandboxId: `session-h-${tag}` };
}

/**
 * Reads the frames of one exec answer as they arrive: a kind byte, a big-endian u32 length,
 * that many bytes. At most one frame (and the chunk that completes it) is held.
 */
export class FrameDecoder {
  private chunks: Uint8Array[] = [];
  private length = 0;

  push(bytes: Uint8Array): void {
    if (bytes.length === 0) return;
    this.chunks.push(bytes);
    this.length += bytes.length;
  }

  /** Bytes received that are not a whole frame yet. */
  get pending(): number {
    return this.length;
  }

  /** The next whole frame, or null; throws for a frame no host sends. */
  next(): { kind: number; payload: Uint8Array } | null {
    if (this.length < 5) return null;
    const head = this.peek(5);
    const kind = head[0]!;
    if (kind !== FRAME_STDOUT && kind !== FRAME_STDERR && kind !== FRAME_EXIT && kind !== FRAME_FAILED) {
      throw badStream(`a frame of unknown kind 0x${kind.toString(16).padStart(2, "0")}`);
    }
    const len = ((head[1]! << 24) >>> 0) + (head[2]! << 16) + (head[3]! << 8) + head[4]!;
    if (len > MAX_FRAME_BYTES) throw badStream(`a frame of ${len} bytes, over ${MAX_FRAME_BYTES}`);
    if (this.length < 5 + len) return null;
    const frame = this.take(5 + len);
    return { kind, payload: frame.subarray(5) };
  }

  private peek(n: number): Uint8Array {
    const first = this.chunks[0]!;
    if (first.length >= n) return first.subarray(0, n);
    const out = new Uint8Array(n);
    let at = 0;
    for (const c of this.chunks) {
      const part = c.subarray(0, n - at);
      out.set(part, at);
      at += part.length;
      if (at === n) break;
    }
    return out;
  }

  private take(n: number): Uint8Array {
    const first = this.chunks[0]!;
    if (first.length >= n) {
      // The common case (small frames inside one chunk): no copy.
      if (first.length === n) this.chunks.shift();
      else this.chunks[0] = first.subarray(n);
      this.length -= n;
      return first.subarray(0, n);
    }
    const out = new Uint8Array(n);
    let at = 0;
    while (at < n) {
      const c = this.chunks[0]!;
      const want = n - at;
      if (c.length <= want) {
        out.set(c, at);
        at += c.length;
        this.chunks.shift();
      } else {
        out.set(c.subarray(0, want), at);
        this.chunks[0] = c.subarray(want);
        at = n;
      }
    }
    this.length -= n;
    return out;
  }
}

function badStream(what: string): SmithersSandboxError {
  return new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, `exec: the host sent ${what}`, { details: { protocol: "exec-stream" } });
}

/** Output of one stream kept up to a bound; past it only counted. */
class Capture {
  private parts: Uint8Array[] = [];
  kept = 0;
  seen = 0;
  constructor(private readonly bound: number) {}

  add(bytes: Uint8Array): void {
    this.seen += bytes.length;
    const room = this.bound - this.kept;
    if (room <= 0) return;
    const part = bytes.length <= room ? bytes : bytes.subarray(0, room);
    this.parts.push(part);
    this.kept += part.length;
  }

  get truncated(): boolean {
    return this.seen > this.kept;
  }

  bytes(): Uint8Array {
    // A plain Uint8Array (not a Buffer), whatever the chunks were.
    const out = new Uint8Array(this.kept);
    let at = 0;
    for (const p of this.parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }
}

function toBytes(data: Uint8Array | string): Buffer {
  return typeof data === "string" ? Buffer.from(data, "utf8") : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
}

function text(bytes: Uint8Array, max = 2000): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset, Math.min(bytes.byteLength, max)).toString("utf8").trim();
}

const TERMINATIONS = new Set<string>(["exited", "signaled", "timeout", "cancelled"]);

function nonNegative(what: string, value: number | undefined): number | undefined {
  if (value === undefined) return undefined;
  if (!Number.isFinite(value) || value < 0) {
    throw new SmithersSandboxError(ErrorCodes.INVALID_INPUT, `${what} must be a non-negative number (got ${value})`);
  }
  return value;
}

function argvOf(command: string | string[]): string[] {
  if (typeof command === "string") {
    if (command.trim() === "") throw new SmithersSandboxError(ErrorCodes.INVALID_INPUT, "spawn: the command is empty");
    return ["/bin/sh", "-c", command];
  }
  if (!Array.isArray(command) || command.length === 0 || command[0] === "" || !command.every((a) => typeof a === "string")) {
    throw new SmithersSandboxError(ErrorCodes.INVALID_INPUT, "spawn: argv must be a non-empty array of strings naming a program");
  }
  return command;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

type Ids = { runId: string; sandboxId: string };

/** Opens (or reacquires) the session of `options.key`: see the module comment. */
export async function openSession(options: OpenSessionOptions): Promise<Session> {
  if (typeof options.key !== "string" || options.key === "") {
    throw new SmithersSandboxError(ErrorCodes.INVALID_INPUT, "a held session needs a non-empty key");
  }
  const workdir = options.workdir ?? DEFAULT_WORKDIR;
  if (!posix.isAbsolute(workdir)) {
    throw new SmithersSandboxError(ErrorCodes.INVALID_INPUT, `workdir must be an absolute path in the sandbox (got ${JSON.stringify(workdir)})`);
  }
  nonNegative("timeoutMs", options.timeoutMs);
  nonNegative("maxOutputBytes", options.maxOutputBytes);
  nonNegative("maxFileBytes", options.maxFileBytes);
  if (options.rootDir !== undefined) {
    const info = await stat(options.rootDir).catch((error: unknown) => {
      throw new SmithersSandboxError(ErrorCodes.INVALID_INPUT, `rootDir: cannot read ${options.rootDir}: ${describeError(error)}`);
    });
    if (!info.isDirectory()) throw new SmithersSandboxError(ErrorCodes.INVALID_INPUT, `rootDir: ${options.rootDir} is not a directory`);
  }
  const client = hostClientFor(options, "smithers-sandbox");
  const ids = sessionIdsFor(options.key, client.token);
  const { hostId, reacquired } = await acquire(client, ids, options);
  const session = heldSession(client, hostId, ids, workdir, reacquired, options);
  if (workdir !== DEFAULT_WORKDIR) {
    // Made whether the session is new or reacquired (an earlier holder may have used another).
    const made = await session.spawn(["mkdir", "-p", "--", workdir], { cwd: "/" });
    if (made.exitCode !== 0) {
      // Only a session made here is removed: a reacquired one is another holder's too.
      if (!reacquired) await client.delete(hostId).catch(() => {});
      throw new SmithersSandboxError(ErrorCodes.INVALID_INPUT, `workdir ${workdir}: mkdir failed: ${text(made.stderr)}`);
    }
  }
  return session;
}

/**
 * The live session of `ids` on the host: an existing one (reacquired), or one made now.
 * Another opener may be making the same key's session at the same moment: one that is not
 * live yet is waited for (up to `openWaitMs`), and a create that loses the race (409) looks
 * again, so two openers end on one session. One left half-made (its opener died) or ended
 * (stopped, failed) is replaced.
 */
async function acquire(client: SandboxHostClient, ids: Ids, options: OpenSessionOptions): Promise<{ hostId: string; reacquired: boolean }> {
  const waitMs = options.openWaitMs ?? 30_000;
  const started = Date.now();
  for (let attempt = 0; ; attempt++) {
    if (options.signal?.aborted) throw abortedError("opening the session", options.signal.reason);
    const found = (await client.list(options.signal)).find((s) => s.runId === ids.runId && s.sandboxId === ids.sandboxId);
    if (found?.state === "live") return { hostId: found.id, reacquired: true };
    const making = found !== undefined && (found.state === "created" || found.state === "shipped");
    if (making && Date.now() - started < waitMs) {
      await sleep(200);
      continue;
    }
    let hostId: string;
    try {
      const info = await client.create(
        {
          runId: ids.runId,
          sandboxId: ids.sandboxId,
          controls: {
            ...(options.controls ?? {}),
            allowNetwork: options.allowNetwork ?? options.controls?.allowNetwork ?? false,
            ...(options.env ? { env: { ...(options.controls?.env ?? {}), ...options.env } } : {}),
          },
          ifExists: found === undefined ? "refuse" : "replace",
          ...(options.image !== undefined ? { image: options.image } : {}),
        },
        options.signal,
      );
      hostId = info.id;
    } catch (error) {
      // Another opener created it between our look and our create: look again.
      if (error instanceof SmithersSandboxError && error.httpStatus === 409 && attempt < 20) {
        await sleep(100);
        continue;
      }
      throw error;
    }
    try {
      await make(client, hostId, ids, options);
    } catch (error) {
      // Half made: removed, so the key's next open starts clean.
      await client.delete(hostId).catch(() => {});
      throw error;
    }
    return { hostId, reacquired: false };
  }
}

/** Uploads the workspace (the project, or an empty one), ships the request, starts the session. */
async function make(client: SandboxHostClient, hostId: string, ids: Ids, options: OpenSessionOptions): Promise<void> {
  let empty: string | undefined;
  try {
    let root = options.rootDir;
    if (root === undefined) {
      empty = await mkdtemp(join(tmpdir(), "smithers-session-empty-"));
      root = empty;
    }
    const selection = selectUpload(root, {
      ...(options.includeGit !== undefined ? { includeGit: options.includeGit } : {}),
      ...(options.honourGitignore !== undefined ? { honourGitignore: options.honourGitignore } : {}),
      ...(options.databasePath !== undefined ? { databasePath: options.databasePath } : {}),
    });
    await client.uploadWorkspace(hostId, root, {
      skipTop: selection.skipTop,
      skipAnywhere: selection.skipAnywhere,
      skipPaths: selection.skipPaths,
      ...(options.gzipLevel !== undefined ? { gzipLevel: options.gzipLevel } : {}),
      ...(options.signal ? { signal: options.signal } : {}),
    });
  } finally {
    if (empty !== undefined) await rm(empty, { recursive: true, force: true });
  }
  await client.putRequest(
    hostId,
    { status: "pending", runId: ids.runId, sandboxId: ids.sandboxId, provider: "smithers-sandbox", runtime: "smithers-sandbox", session: { key: options.key }, input: {} },
    options.signal,
  );
  await client.start(hostId, options.signal);
}

function heldSession(client: SandboxHostClient, hostId: string, ids: Ids, workdir: string, reacquired: boolean, options: OpenSessionOptions): Session {
  const maxOutput = options.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES;
  const maxFile = options.maxFileBytes ?? maxOutput;
  const killTimeoutMs = options.killTimeoutMs ?? 5000;
  /** Commands in flight: how to stop each (close its stream), and its settling. */
  const inFlight = new Set<{ kill: () => void; settled: Promise<void> }>();
  const resolvePath = (path: string) => posix.resolve(workdir, path);

  async function spawn(command: string | string[], opts: SpawnOptions = {}): Promise<SpawnResult> {
    const argv = argvOf(command);
    const body: ExecBody = { argv, cwd: opts.cwd === undefined || opts.cwd === "" ? workdir : resolvePath(opts.cwd) };
    if (opts.env !== undefined) {
      body.env = Object.entries(opts.env).map(([k, v]) => {
        if (typeof v !== "string") throw new SmithersSandboxError(ErrorCodes.INVALID_INPUT, `spawn: env ${k} must be a string`);
        return [k, v];
      });
    }
    const timeoutMs = nonNegative("timeoutMs", opts.timeoutMs ?? options.timeoutMs);
    if (timeoutMs !== undefined) body.timeoutMs = Math.ceil(timeoutMs);
    if (opts.stdin !== undefined) {
      const stdin = toBytes(opts.stdin);
      if (stdin.length > MAX_STDIN_BYTES) {
        throw new SmithersSandboxError(ErrorCodes.INVALID_INPUT, `spawn: stdin of ${stdin.length} bytes, over the ${MAX_STDIN_BYTES}-byte bound of one command`, {
          details: { stdinBytes: stdin.length, maxStdinBytes: MAX_STDIN_BYTES },
        });
      }
      body.stdinBase64 = stdin.toString("base64");
    }
    const bound = nonNegative("maxOutputBytes", opts.maxOutputBytes) ?? maxOutput;
    if (opts.signal?.aborted) throw abortedError("spawn", opts.signal.reason);

    const ctl = new AbortController();
    let killed = false;
    const onAbort = () => ctl.abort(opts.signal?.reason);
    opts.signal?.addEventListener("abort", onAbort, { once: true });
    const run = (async (): Promise<SpawnResult> => {
      const stdout = new Capture(bound);
      const stderr = new Capture(bound);
      let resp: Response;
      try {
        resp = await client.exec(hostId, body, ctl.signal);
      } catch (error) {
        if (ctl.signal.aborted) throw stopped(killed, opts.signal);
        throw error;
      }
      if (!resp.body) throw badStream("no body");
      const reader = resp.body.getReader();
      const decoder = new FrameDecoder();
      let end: End | undefined;
      let done = false;
      try {
        for (;;) {
          let chunk: Awaited<ReturnType<typeof reader.read>>;
          try {
            chunk = await reader.read();
          } catch (error) {
            if (ctl.signal.aborted) throw stopped(killed, opts.signal);
            throw new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, `exec: the stream from the host broke off, so how the command ended is unknown: ${describeError(error)}`, {
              cause: error,
            });
          }
          if (chunk.done) {
            done = true;
            break;
          }
          // The end is the last frame: anything after it is a host that breaks the protocol.
          if (end !== undefined) throw badStream("bytes after the command's end");
          decoder.push(chunk.value);
          for (let frame = decoder.next(); frame !== null; frame = decoder.next()) {
            if (frame.kind === FRAME_STDOUT) stdout.add(frame.payload);
            else if (frame.kind === FRAME_STDERR) stderr.add(frame.payload);
            else {
              end = parseEnd(frame.kind, frame.payload);
              if (decoder.pending > 0) throw badStream("bytes after the command's end");
              break;
            }
          }
        }
        // Read to the stream's own end (so its connection is reused), then answered.
        if (end !== undefined) {
          return {
            exitCode: end.exitCode,
            ...(end.signal !== undefined ? { signal: end.signal } : {}),
            termination: end.termination,
            stdout: stdout.bytes(),
            stderr: stderr.bytes(),
            stdoutTruncated: stdout.truncated,
            stderrTruncated: stderr.truncated,
            stdoutBytes: Math.max(end.stdoutBytes, stdout.seen),
            stderrBytes: Math.max(end.stderrBytes, stderr.seen),
            durationMs: end.durationMs,
          };
        }
        if (ctl.signal.aborted) throw stopped(killed, opts.signal);
        throw new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, "exec: the stream from the host ended before the command's end, so how it ended is unknown", {
          details: { truncated: true },
        });
      } finally {
        // Closing the stream early is what kills the command on the host.
        if (!done) await reader.cancel().catch(() => {});
      }
    })();
    const settled = run.then(
      () => {},
      () => {},
    );
    const entry = {
      kill: () => {
        killed = true;
        ctl.abort(new Error("the session was killed"));
      },
      settled,
    };
    inFlight.add(entry);
    try {
      return await run;
    } finally {
      inFlight.delete(entry);
      opts.signal?.removeEventListener("abort", onAbort);
    }
  }

  function stopped(killed: boolean, signal: AbortSignal | undefined): SmithersSandboxError {
    if (killed) {
      return new SmithersSandboxError(ErrorCodes.PROCESS_ABORTED, "spawn: the command was killed (session.kill())", { details: { operation: "spawn", killed: true } });
    }
    return abortedError("spawn", signal?.reason);
  }

  async function kill(): Promise<void> {
    const entries = [...inFlight];
    const waiting = entries.map((e) => e.settled);
    for (const e of entries) e.kill();
    if (waiting.length === 0) return;
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<"late">((resolve) => {
      timer = setTimeout(() => resolve("late"), killTimeoutMs);
    });
    try {
      const outcome = await Promise.race([Promise.all(waiting).then(() => "settled" as const), late]);
      if (outcome === "late") {
        throw new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, `kill: ${waiting.length} command(s) did not settle within ${killTimeoutMs} ms`);
      }
    } finally {
      clearTimeout(timer);
    }
  }

  async function readFile(path: string): Promise<Uint8Array> {
    const abs = resolvePath(path);
    const r = await spawn(["/bin/sh", "-c", READ_SCRIPT, "sh", abs], { cwd: "/", maxOutputBytes: maxFile });
    if (r.termination === "exited" && r.exitCode === EXIT_MISSING) {
      throw new SmithersSandboxError(ErrorCodes.NOT_FOUND, `readFile ${abs}: no such file in the session`, { details: { path: abs } });
    }
    if (r.termination === "exited" && r.exitCode === EXIT_DIRECTORY) {
      throw new SmithersSandboxError(ErrorCodes.INVALID_INPUT, `readFile ${abs}: a directory, not a file`, { details: { path: abs } });
    }
    if (r.termination !== "exited" || r.exitCode !== 0) {
      throw new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, `readFile ${abs}: ${endedBy(r)}: ${text(r.stderr)}`, { details: { path: abs } });
    }
    if (r.stdoutTruncated) {
      throw new SmithersSandboxError(ErrorCodes.INVALID_INPUT, `readFile ${abs}: ${r.stdoutBytes} bytes, over the ${maxFile}-byte bound (maxFileBytes)`, {
        details: { path: abs, bytes: r.stdoutBytes, maxFileBytes: maxFile },
      });
    }
    return r.stdout;
  }

  async function writeFile(path: string, data: Uint8Array | string): Promise<void> {
    const abs = resolvePath(path);
    const r = await spawn(["/bin/sh", "-c", WRITE_SCRIPT, "sh", abs], { cwd: "/", stdin: data });
    if (r.termination !== "exited" || r.exitCode !== 0) {
      throw new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, `writeFile ${abs}: ${endedBy(r)}: ${text(r.stderr)}`, { details: { path: abs } });
    }
  }

  async function ping(): Promise<boolean> {
    try {
      return (await client.info(hostId)).state === "live";
    } catch {
      return false;
    }
  }

  return {
    key: options.key,
    id: hostId,
    runId: ids.runId,
    sandboxId: ids.sandboxId,
    workdir,
    reacquired,
    spawn,
    readFile,
    writeFile,
    kill,
    ping,
    stop: () => client.stop(hostId),
    async destroy() {
      await kill().catch(() => {});
      await client.delete(hostId);
    },
  };
}

function endedBy(r: SpawnResult): string {
  return r.termination === "exited" ? `exit code ${r.exitCode}` : r.termination === "signaled" ? `signal ${r.signal}` : r.termination;
}

type End = { exitCode: number | null; signal?: number; termination: Termination; stdoutBytes: number; stderrBytes: number; durationMs: number };

/** The last frame: the command's end, or the host's report of why it could not run (thrown). */
function parseEnd(kind: number, payload: Uint8Array): End {
  let value: Record<string, unknown>;
  try {
    value = JSON.parse(Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength).toString("utf8")) as Record<string, unknown>;
  } catch (error) {
    throw badStream(`an unreadable ${kind === FRAME_EXIT ? "exit" : "error"} frame: ${describeError(error)}`);
  }
  if (value === null || typeof value !== "object") throw badStream("an end frame that is not an object");
  if (kind === FRAME_FAILED) {
    const code = typeof value.code === "string" ? value.code : ErrorCodes.SANDBOX_EXECUTION_FAILED;
    const message = typeof value.message === "string" ? value.message : "no message";
    throw new SmithersSandboxError(code, `exec: the host could not run the command: ${message}`, { details: value.details ?? null });
  }
  const termination = value.termination;
  if (typeof termination !== "string" || !TERMINATIONS.has(termination)) throw badStream(`an exit frame with termination ${JSON.stringify(termination)}`);
  const int = (v: unknown) => (typeof v === "number" && Number.isSafeInteger(v) ? v : undefined);
  const exitCode = int(value.exitCode) ?? null;
  const signal = int(value.signal);
  return {
    exitCode: termination === "exited" ? exitCode : null,
    ...(signal !== undefined ? { signal } : {}),
    termination: termination as Termination,
    stdoutBytes: int(value.stdoutBytes) ?? 0,
    stderrBytes: int(value.stderrBytes) ?? 0,
    durationMs: typeof value.duration === "number" && Number.isFinite(value.duration) ? value.duration : 0,
  };
}
