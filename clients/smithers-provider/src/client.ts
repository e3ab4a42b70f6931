/**
 * A client of the sandbox host API (`smithers-sandbox serve`, `openapi/smithers-sandbox.yaml`),
 * with the call sequence and retry rules of the Rust client (`crates/smithers-runtime-remote`):
 *
 * * A request that never reached the host (connection refused, name not resolved) is always
 *   retried. Beyond that only requests that are safe to repeat are: GET, DELETE, the workspace
 *   PUT (the host swaps the whole tree in atomically), the request PUT (an identical repeat is
 *   answered again), cancel, and execute **with its Idempotency-Key** (the host starts a step
 *   at most once and answers a retried key with the run already started). `create` is not
 *   retried once sent.
 * * 502/503/504 answers to safe requests are retried with exponential backoff.
 * * The event stream is resumed from the next sequence number after a dropped or idle
 *   connection; a gap in the sequence is an error, never skipped over.
 * * Every error answer of the host (`{code, message, details}`) becomes a
 *   {@link SmithersSandboxError} carrying that code, its details and the HTTP status.
 */

import { randomBytes, randomUUID } from "node:crypto";
import { mkdir, rename, rm } from "node:fs/promises";
import { dirname, join } from "node:path";
import { Readable } from "node:stream";
import { setTimeout as sleep } from "node:timers/promises";
import { createGzip } from "node:zlib";

import { describeError, ErrorCodes, SmithersSandboxError } from "./errors.js";
import { SseParser } from "./sse.js";
import { BUNDLE_LIMITS, packTree, unpackTar } from "./tar.js";
import type { PackStats, UnpackStats } from "./tar.js";

/** Environment variable holding the host's base URL (`http://127.0.0.1:7420`). */
export const ENV_API_URL = "CODEPLANE_API_URL";
/** Environment variable holding the bearer token the host expects. */
export const ENV_API_KEY = "CODEPLANE_API_KEY";

export type SandboxState = "created" | "shipped" | "running" | "live" | "completed" | "failed" | "cancelled";

export type ResultInfo = { patchCount: number; ignoredPaths?: string[]; bundleSizeBytes: number };

export type SandboxInfo = {
  id: string;
  runId: string;
  sandboxId: string;
  runtime: string;
  state: SandboxState;
  createdAtMs: number;
  lastSeq?: number | null;
  result?: ResultInfo;
};

/** What the host reports when a step ended (smithers_runtime::ExecOutcome). */
export type ExecOutcome = {
  exitCode?: number | null;
  signal?: number | null;
  /** exited, signaled, timeout, cancelled, memory, pids, output or disk. */
  termination?: string;
  stderrTruncated?: boolean;
  /** The egress engine's summary (policy, mode, allowed, denied, wouldDeny, destinations), with an egress policy. */
  egress?: Record<string, unknown> | null;
  [key: string]: unknown;
};

export type HostErrorReport = { code: string; message: string; details?: unknown };

/** One event of `GET /v1/sandboxes/{id}/events`. */
export type WireEvent =
  | { type: "state"; state: SandboxState }
  | { type: "stdout"; line: string; timestampMs: number }
  | { type: "stderr"; line: string; timestampMs: number }
  | { type: "heartbeat"; progress: number | null; timestampMs: number }
  /** A decision of the egress engine (a `smithers_egress::EgressRecord`: host, port, verdict, reason, ...). */
  | { type: "egress"; record: Record<string, unknown>; timestampMs: number }
  | { type: "completed"; outcome: ExecOutcome; result: ResultInfo }
  | { type: "failed"; error: HostErrorReport }
  | { type: "cancelled" };

export type TerminalEvent = Extract<WireEvent, { type: "completed" | "failed" | "cancelled" }>;

export type WorkspaceUploaded = { entries: number; bytes: number; receivedBytes: number };

export type ExecuteAccepted = { id: string; state: SandboxState; idempotencyKey?: string; started: boolean };

export type StepCommand = { argv: string[]; cwd?: string };

/** `POST …/exec`'s body (smithers_wire::session::ExecBody). */
export type ExecBody = { argv: string[]; cwd?: string; env?: Array<[string, string]>; timeoutMs?: number; stdinBase64?: string };

/** The controls of a sandbox (smithers_runtime::Controls, camelCase). */
export type Controls = {
  env?: Record<string, string>;
  ports?: Array<{ host: number; container: number }>;
  memoryLimitBytes?: number;
  cpuLimit?: number;
  pidsLimit?: number;
  diskLimitBytes?: number;
  allowNetwork?: boolean;
  maxOutputBytes?: number;
  timeoutMs?: number;
  workspace?: unknown;
  /** The network the step may reach (a smithers-egress policy: {mode?, allow, deny}). */
  egressPolicy?: Record<string, unknown>;
  /** Secrets on egress: each variable's name and the hosts its value is swapped in for. */
  secrets?: Array<{ name: string; hosts: string[] }>;
};

/**
 * `POST /v1/sandboxes`' body. `secretValues`: each secret's value in base64, which the host
 * keeps in memory only (never on disk, in a log or a reply).
 */
export type CreateSandbox = {
  runId: string;
  sandboxId: string;
  image?: string;
  controls?: Controls;
  ifExists?: "replace" | "refuse";
  secretValues?: Record<string, string>;
};

export type RetryPolicy = {
  /** Attempts in total (1 = no retry). */
  maxAttempts: number;
  initialBackoffMs: number;
  maxBackoffMs: number;
};

export type HostClientOptions = {
  /** Base URL of the host, e.g. `http://127.0.0.1:7420` (no trailing `/v1`). */
  url: string;
  /** Bearer token (the host's `SMITHERS_SANDBOX_TOKEN`). */
  token: string;
  /** Timeout of one JSON call (not of uploads, downloads or the event stream). Default 60 s. */
  requestTimeoutMs?: number;
  /** The event stream is resumed when nothing, not even a keep-alive, arrived for this long. Default 60 s. */
  eventIdleTimeoutMs?: number;
  retry?: Partial<RetryPolicy>;
};

const DEFAULT_RETRY: RetryPolicy = { maxAttempts: 5, initialBackoffMs: 200, maxBackoffMs: 5000 };

/** Error codes of a connection that never reached the host: always safe to retry. */
const CONNECT_ERRORS = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EADDRNOTAVAIL",
  "UND_ERR_CONNECT_TIMEOUT",
]);

function errorCodeChain(error: unknown): string[] {
  const codes: string[] = [];
  let current: unknown = error;
  for (let depth = 0; current && depth < 5; depth++) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === "string") {
      codes.push(code);
    }
    current = (current as { cause?: unknown }).cause;
  }
  return codes;
}

function isConnectError(error: unknown): boolean {
  return errorCodeChain(error).some((c) => CONNECT_ERRORS.has(c));
}

function isTransient(status: number): boolean {
  return status === 502 || status === 503 || status === 504;
}

export function abortedError(what: string, reason?: unknown): SmithersSandboxError {
  const why = reason instanceof Error ? `: ${reason.message}` : "";
  return new SmithersSandboxError(ErrorCodes.PROCESS_ABORTED, `${what} was aborted${why}`, { details: { operation: what } });
}

/** `AbortSignal.any` (Node ≥ 20.3), written out so any Node 20 works. */
function anySignal(signals: AbortSignal[]): AbortSignal {
  if (signals.length === 1) return signals[0]!;
  const ctl = new AbortController();
  for (const s of signals) {
    if (s.aborted) {
      ctl.abort(s.reason);
      return ctl.signal;
    }
  }
  const onAbort = (event: Event) => {
    ctl.abort((event.target as AbortSignal).reason);
    for (const s of signals) s.removeEventListener("abort", onAbort);
  };
  for (const s of signals) s.addEventListener("abort", onAbort, { once: true });
  return ctl.signal;
}

type Built = { path: string; init: RequestInit & { duplex?: "half" } };

export class SandboxHostClient {
  readonly baseUrl: string;
  /** The bearer token (held sessions derive their ids' token tag from it). */
  readonly token: string;
  private readonly requestTimeoutMs: number;
  private readonly eventIdleTimeoutMs: number;
  private readonly retry: RetryPolicy;

  constructor(options: HostClientOptions) {
    const base = options.url.trim().replace(/\/+$/, "");
    let url: URL;
    try {
      url = new URL(base);
    } catch {
      throw new SmithersSandboxError(ErrorCodes.TASK_RUNTIME_UNAVAILABLE, `invalid sandbox host URL ${JSON.stringify(options.url)}`, {
        details: { fix: `set ${ENV_API_URL} to e.g. http://127.0.0.1:7420` },
      });
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw new SmithersSandboxError(ErrorCodes.TASK_RUNTIME_UNAVAILABLE, `unsupported URL scheme ${JSON.stringify(url.protocol)} of the sandbox host`, {
        details: { fix: "use an http:// or https:// URL" },
      });
    }
    this.baseUrl = base;
    this.token = options.token;
    this.requestTimeoutMs = options.requestTimeoutMs ?? 60_000;
    this.eventIdleTimeoutMs = options.eventIdleTimeoutMs ?? 60_000;
    this.retry = { ...DEFAULT_RETRY, ...(options.retry ?? {}) };
  }

  private backoff(attempt: number): number {
    return Math.min(this.retry.initialBackoffMs * 2 ** Math.min(attempt, 16), this.retry.maxBackoffMs);
  }

  private unreachable(error: unknown): SmithersSandboxError {
    return new SmithersSandboxError(
      ErrorCodes.TASK_RUNTIME_UNAVAILABLE,
      `cannot reach the sandbox host at ${this.baseUrl}: ${describeError(error)}`,
      { details: { fix: `check ${ENV_API_URL} and that the sandbox host (smithers-sandbox serve) is running` }, cause: error },
    );
  }

  /**
   * Sends a request built by `build`, retrying what is safe (see the module docs). `timeoutMs`
   * bounds the whole call including reading the body; streams pass none. `signal` is the
   * caller's: aborting it ends the call with PROCESS_ABORTED and is never retried.
   */
  private async send(
    what: string,
    safe: boolean,
    build: () => Built,
    opts: { timeoutMs?: number; signal?: AbortSignal; fatal?: () => unknown } = {},
  ): Promise<Response> {
    for (let attempt = 1; ; attempt++) {
      const last = attempt >= Math.max(1, this.retry.maxAttempts);
      if (opts.signal?.aborted) {
        throw abortedError(what, opts.signal.reason);
      }
      const { path, init } = build();
      const signals: AbortSignal[] = [];
      if (opts.signal) signals.push(opts.signal);
      if (init.signal) signals.push(init.signal);
      if (opts.timeoutMs !== undefined) signals.push(AbortSignal.timeout(opts.timeoutMs));
      const headers = new Headers(init.headers);
      headers.set("authorization", `Bearer ${this.token}`);
      let resp: Response;
      try {
        resp = await fetch(`${this.baseUrl}${path}`, {
          ...init,
          headers,
          ...(signals.length > 0 ? { signal: anySignal(signals) } : {}),
        });
      } catch (error) {
        if (opts.signal?.aborted) {
          throw abortedError(what, opts.signal.reason);
        }
        if (init.signal?.aborted) {
          // The caller's own per-request signal (an idle stream): the caller decides.
          throw error;
        }
        const fatal = opts.fatal?.();
        if (fatal !== undefined) {
          // Our side broke the request (the workspace could not be read): repeating won't help.
          throw fatal;
        }
        if (error instanceof SmithersSandboxError) {
          throw error;
        }
        const connect = isConnectError(error);
        if ((connect || safe) && !last) {
          await sleep(this.backoff(attempt));
          continue;
        }
        const timedOut = (error as Error)?.name === "TimeoutError";
        if (connect || timedOut || safe) {
          throw this.unreachable(error);
        }
        throw new SmithersSandboxError(
          ErrorCodes.SANDBOX_EXECUTION_FAILED,
          `${what} on the sandbox host: the connection failed after the request was sent, and it is not safe to repeat, so it was not retried: ${describeError(error)}`,
          { details: { operation: what }, cause: error },
        );
      }
      if (isTransient(resp.status) && safe && !last) {
        await resp.body?.cancel().catch(() => {});
        await sleep(this.backoff(attempt));
        continue;
      }
      return this.check(resp, what);
    }
  }

  /** Turns a non-success answer into the error it describes, keeping the host's code. */
  private async check(resp: Response, what: string): Promise<Response> {
    if (resp.ok) {
      return resp;
    }
    const text = await resp.text().catch(() => "");
    let report: HostErrorReport;
    try {
      const parsed = JSON.parse(text) as Partial<HostErrorReport>;
      if (typeof parsed?.code !== "string" || typeof parsed?.message !== "string") {
        throw new Error("not an error report");
      }
      report = { code: parsed.code, message: parsed.message, details: parsed.details ?? null };
    } catch {
      report = { code: ErrorCodes.SANDBOX_EXECUTION_FAILED, message: `HTTP ${resp.status}: ${text.slice(0, 500)}`, details: null };
    }
    const status = resp.status;
    if (status === 401) {
      throw new SmithersSandboxError(
        report.code,
        `the sandbox host at ${this.baseUrl} refused the API key (${report.message}); set ${ENV_API_KEY} (or the provider's token option) to the token the host was started with (SMITHERS_SANDBOX_TOKEN)`,
        { details: report.details, httpStatus: status },
      );
    }
    if (status === 503) {
      const fix = (report.details as { fix?: unknown } | null)?.fix;
      throw new SmithersSandboxError(
        report.code,
        `the sandbox host cannot run steps: ${report.message}${typeof fix === "string" ? ` (fix: ${fix})` : ""}`,
        { details: report.details, httpStatus: status },
      );
    }
    throw new SmithersSandboxError(report.code, `${what} on the sandbox host (HTTP ${status}): ${report.message}`, {
      details: report.details,
      httpStatus: status,
    });
  }

  private async json<T>(what: string, safe: boolean, build: () => Built, signal?: AbortSignal): Promise<T> {
    const resp = await this.send(what, safe, build, { timeoutMs: this.requestTimeoutMs, ...(signal ? { signal } : {}) });
    const text = await resp.text();
    try {
      return JSON.parse(text) as T;
    } catch (error) {
      throw new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, `${what} on the sandbox host: unreadable reply: ${describeError(error)}`);
    }
  }

  /** `POST /v1/sandboxes`: not safe to repeat once sent (only connection failures are retried). */
  create(body: CreateSandbox, signal?: AbortSignal): Promise<SandboxInfo> {
    return this.json<SandboxInfo>(
      "create a sandbox",
      false,
      () => ({ path: "/v1/sandboxes", init: { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) } }),
      signal,
    );
  }

  /** `GET /v1/sandboxes`: this token's sandboxes. */
  list(signal?: AbortSignal): Promise<SandboxInfo[]> {
    return this.json<SandboxInfo[]>("list sandboxes", true, () => ({ path: "/v1/sandboxes", init: { method: "GET" } }), signal);
  }

  info(id: string, signal?: AbortSignal): Promise<SandboxInfo> {
    return this.json<SandboxInfo>("read sandbox", true, () => ({ path: `/v1/sandboxes/${encodeURIComponent(id)}`, init: { method: "GET" } }), signal);
  }

  /**
   * `PUT /v1/sandboxes/{id}/workspace`: `rootDir` as a gzip-compressed tar, built while it is
   * sent (never the whole tree in memory). Retried whole (the host swaps trees atomically).
   */
  async uploadWorkspace(
    id: string,
    rootDir: string,
    options: {
      skipTop: string[];
      skipAnywhere?: string[];
      skipPaths?: Set<string>;
      extraFiles?: Array<{ path: string; content: Buffer }>;
      gzipLevel?: number;
      signal?: AbortSignal;
      onProgress?: (stats: PackStats) => void;
    },
  ): Promise<WorkspaceUploaded & { pack: PackStats }> {
    let stats: PackStats = { entries: 0, bytes: 0, skippedSpecial: [], skippedPaths: 0 };
    let packError: unknown = undefined;
    let source: Readable | undefined;
    const build = (): Built => {
      source?.destroy();
      stats = { entries: 0, bytes: 0, skippedSpecial: [], skippedPaths: 0 };
      packError = undefined;
      const gzip = createGzip({ level: options.gzipLevel ?? 1 });
      const current = stats;
      const packed = packTree(
        rootDir,
        { skipTop: options.skipTop, ...(options.skipAnywhere ? { skipAnywhere: options.skipAnywhere } : {}), ...(options.skipPaths ? { skipPaths: options.skipPaths } : {}), ...(options.extraFiles ? { extraFiles: options.extraFiles } : {}) },
        current,
      );
      const onProgress = options.onProgress;
      const chunks = onProgress
        ? (async function* () {
            for await (const chunk of packed) {
              yield chunk;
              onProgress(current);
            }
          })()
        : packed;
      const src = Readable.from(chunks, { objectMode: false });
      src.on("error", (error) => {
        packError = error;
        // Fail the body so the host sees a failed upload, not a truncated archive.
        gzip.destroy(error);
      });
      src.pipe(gzip);
      source = src;
      return {
        path: `/v1/sandboxes/${encodeURIComponent(id)}/workspace`,
        init: { method: "PUT", headers: { "content-type": "application/gzip" }, body: gzip as unknown as RequestInit["body"], duplex: "half" },
      };
    };
    try {
      let resp: Response;
      try {
        resp = await this.send("upload the workspace", true, build, {
          ...(options.signal ? { signal: options.signal } : {}),
          fatal: () => (packError === undefined ? undefined : packFailure(packError)),
        });
      } catch (error) {
        if (packError !== undefined) {
          throw packFailure(packError);
        }
        throw error;
      }
      if (packError !== undefined) {
        throw packFailure(packError);
      }
      const uploaded = (await resp.json()) as WorkspaceUploaded;
      return { ...uploaded, pack: stats };
    } finally {
      source?.destroy();
    }
  }

  /** `PUT /v1/sandboxes/{id}/request` (ship): safe to repeat. */
  putRequest(id: string, request: unknown, signal?: AbortSignal): Promise<{ bundleSizeBytes: number }> {
    const body = JSON.stringify(request, null, 2);
    return this.json(
      "ship the request",
      true,
      () => ({ path: `/v1/sandboxes/${encodeURIComponent(id)}/request`, init: { method: "PUT", headers: { "content-type": "application/json" }, body } }),
      signal,
    );
  }

  /**
   * `POST /v1/sandboxes/{id}/execute`. One key per call: every retry carries it, so the host
   * starts the step once whatever the network does.
   */
  execute(id: string, command: StepCommand, idempotencyKey: string = randomUUID(), signal?: AbortSignal): Promise<ExecuteAccepted> {
    const body = JSON.stringify(command);
    return this.json(
      "execute",
      true,
      () => ({
        path: `/v1/sandboxes/${encodeURIComponent(id)}/execute`,
        init: { method: "POST", headers: { "content-type": "application/json", "idempotency-key": idempotencyKey }, body },
      }),
      signal,
    );
  }

  /** `POST /v1/sandboxes/{id}/start`: a shipped sandbox becomes a live session. Not repeated once sent (a second start is 409). */
  start(id: string, signal?: AbortSignal): Promise<SandboxInfo> {
    return this.json("start the session", false, () => ({ path: `/v1/sandboxes/${encodeURIComponent(id)}/start`, init: { method: "POST" } }), signal);
  }

  /**
   * `POST /v1/sandboxes/{id}/exec`: one command of a live session; the answer is the framed
   * stream (`held.ts` reads it). Never repeated once sent: the command may have run. No
   * timeout of its own (a command may run long); aborting `signal` closes the stream, and the
   * host then kills the command.
   */
  exec(id: string, body: ExecBody, signal?: AbortSignal): Promise<Response> {
    const text = JSON.stringify(body);
    return this.send(
      "exec",
      false,
      () => ({ path: `/v1/sandboxes/${encodeURIComponent(id)}/exec`, init: { method: "POST", headers: { "content-type": "application/json" }, body: text } }),
      signal ? { signal } : {},
    );
  }

  /** `POST /v1/sandboxes/{id}/stop`: ends the session and collects its bundle; stopping a stopped one is a no-op, so it is retried. */
  stop(id: string, signal?: AbortSignal): Promise<SandboxInfo> {
    return this.json("stop the session", true, () => ({ path: `/v1/sandboxes/${encodeURIComponent(id)}/stop`, init: { method: "POST" } }), signal);
  }

  /** `POST /v1/sandboxes/{id}/cancel`: cancelling twice is harmless, so it is retried. */
  cancel(id: string): Promise<SandboxInfo> {
    return this.json("cancel", true, () => ({ path: `/v1/sandboxes/${encodeURIComponent(id)}/cancel`, init: { method: "POST" } }));
  }

  /** `DELETE /v1/sandboxes/{id}` (idempotent; the host cancels a running step and waits for it). */
  async delete(id: string): Promise<void> {
    const resp = await this.send(
      "clean up",
      true,
      () => ({ path: `/v1/sandboxes/${encodeURIComponent(id)}`, init: { method: "DELETE" } }),
      { timeoutMs: this.requestTimeoutMs },
    );
    await resp.body?.cancel().catch(() => {});
  }

  /**
   * Follows `GET /v1/sandboxes/{id}/events` from seq 0 until a terminal event, resuming from
   * the next seq after a dropped or idle connection, handing every event to `onEvent` and
   * calling `onAlive` on keep-alives. Once `signal` aborts, the host is asked (once) to cancel
   * the step, and the stream is still followed to its terminal event: a cancelled step still
   * ends with its bundle.
   */
  async follow(
    id: string,
    options: {
      signal?: AbortSignal;
      onEvent?: (event: WireEvent, seq: number) => void;
      onAlive?: () => void;
      /** Called before the stream is reopened from `since` after it dropped or went idle. */
      onResume?: (since: number, failures: number) => void;
    } = {},
  ): Promise<TerminalEvent> {
    let next = 0;
    let failures = 0;
    let cancelRequested = false;
    let cancelError: unknown = undefined;
    let cancelDone: Promise<void> = Promise.resolve();
    let connection: AbortController | undefined;
    const onAbort = () => {
      if (cancelRequested) return;
      cancelRequested = true;
      cancelDone = this.cancel(id).then(
        () => {},
        (error) => {
          cancelError = error;
          connection?.abort();
        },
      );
    };
    options.signal?.addEventListener("abort", onAbort);
    if (options.signal?.aborted) onAbort();
    try {
      for (;;) {
        if (cancelError !== undefined) throw cancelError;
        const ctl = new AbortController();
        connection = ctl;
        let idle: NodeJS.Timeout | undefined;
        const arm = () => {
          if (idle) clearTimeout(idle);
          idle = setTimeout(() => ctl.abort(new Error("the event stream was idle")), this.eventIdleTimeoutMs);
        };
        arm();
        try {
          const since = next;
          const resp = await this.send("follow events", true, () => ({
            path: `/v1/sandboxes/${encodeURIComponent(id)}/events?since=${since}`,
            init: { method: "GET", headers: { accept: "text/event-stream" }, signal: ctl.signal },
          }));
          if (!resp.body) throw new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, "follow events: the host sent no body");
          const parser = new SseParser();
          let comments = 0;
          const body = Readable.fromWeb(resp.body as import("node:stream/web").ReadableStream<Uint8Array>);
          try {
            for await (const chunk of body) {
              arm();
              for (const frame of parser.push(chunk as Buffer)) {
                const seq = Number(frame.id);
                if (frame.id === undefined || !Number.isSafeInteger(seq)) {
                  throw new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, "follow events: an event without a numeric id");
                }
                if (seq !== next) {
                  throw new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, `follow events: the host skipped events: expected seq ${next}, got ${seq}`);
                }
                let event: WireEvent;
                try {
                  event = JSON.parse(frame.data) as WireEvent;
                } catch (error) {
                  throw new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, `follow events: unreadable event ${seq}: ${describeError(error)}`);
                }
                next += 1;
                failures = 0;
                options.onEvent?.(event, seq);
                if (event.type === "completed" || event.type === "failed" || event.type === "cancelled") {
                  return event;
                }
              }
              if (parser.comments !== comments) {
                comments = parser.comments;
                options.onAlive?.();
              }
            }
          } finally {
            body.destroy();
          }
        } catch (error) {
          if (error instanceof SmithersSandboxError && !isRetryableStreamError(error)) {
            throw error;
          }
          // Dropped, idle or ended without a terminal event: resume from `next`.
        } finally {
          if (idle) clearTimeout(idle);
        }
        failures += 1;
        if (failures >= Math.max(1, this.retry.maxAttempts)) {
          throw new SmithersSandboxError(
            ErrorCodes.TASK_RUNTIME_UNAVAILABLE,
            `lost the event stream of sandbox ${id} ${failures} times in a row`,
            { details: { fix: `check the network path to ${this.baseUrl}` } },
          );
        }
        await sleep(this.backoff(failures));
        options.onResume?.(next, failures);
      }
    } finally {
      options.signal?.removeEventListener("abort", onAbort);
      await cancelDone;
    }
  }

  /**
   * `GET /v1/sandboxes/{id}/bundle`, unpacked (confined, see `tar.ts`) into a staging directory
   * next to `dest` and renamed into place only when complete. A stream that broke off is
   * downloaded again; an archive that breaks a rule is refused.
   */
  /**
   * `GET …/bundle` unpacked, confined, into a staging directory beside `dest`; `prepare` (if
   * given) may rewrite it there; then it replaces `dest` whole.
   */
  async downloadBundle(id: string, dest: string, prepare?: (staging: string) => Promise<void>): Promise<UnpackStats> {
    const parent = dirname(dest);
    await mkdir(parent, { recursive: true });
    for (let attempt = 1; ; attempt++) {
      const last = attempt >= Math.max(1, this.retry.maxAttempts);
      // A stalled transfer (nothing for eventIdleTimeoutMs) is aborted and tried again.
      const ctl = new AbortController();
      let idle: NodeJS.Timeout | undefined;
      const arm = () => {
        if (idle) clearTimeout(idle);
        idle = setTimeout(() => ctl.abort(new Error("the bundle download stalled")), this.eventIdleTimeoutMs);
      };
      arm();
      let resp: Response;
      try {
        resp = await this.send("download the bundle", true, () => ({
          path: `/v1/sandboxes/${encodeURIComponent(id)}/bundle`,
          init: { method: "GET", signal: ctl.signal },
        }));
      } catch (error) {
        clearTimeout(idle);
        if (ctl.signal.aborted && !last) continue;
        if (ctl.signal.aborted) throw this.unreachable(error);
        throw error;
      }
      if (!resp.body) throw new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, "download the bundle: the host sent no body");
      const staging = join(parent, `.result-partial-${randomBytes(8).toString("hex")}`);
      await mkdir(staging, { mode: 0o755 });
      const body = Readable.fromWeb(resp.body as import("node:stream/web").ReadableStream<Uint8Array>);
      const watched = (async function* () {
        for await (const chunk of body) {
          arm();
          yield chunk as Uint8Array;
        }
      })();
      try {
        const stats = await unpackTar(watched, staging, BUNDLE_LIMITS).finally(() => clearTimeout(idle));
        body.destroy();
        if (prepare) await prepare(staging);
        await rm(dest, { recursive: true, force: true });
        await rename(staging, dest);
        return stats;
      } catch (error) {
        body.destroy();
        await rm(staging, { recursive: true, force: true });
        const streamBroke = !(error instanceof SmithersSandboxError) && !isLocalFsError(error);
        const truncated = error instanceof SmithersSandboxError && isRetryableStreamError(error);
        if ((streamBroke || truncated) && !last) {
          await sleep(this.backoff(attempt));
          continue;
        }
        if (error instanceof SmithersSandboxError) throw error;
        throw new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, `unpack the bundle from the sandbox host: ${describeError(error)}`, {
          cause: error,
        });
      }
    }
  }
}

function isLocalFsError(error: unknown): boolean {
  return typeof (error as { syscall?: unknown })?.syscall === "string" && typeof (error as { path?: unknown })?.path !== "undefined";
}

/** A stream that ended early (marked by the reader) is worth another attempt. */
function isRetryableStreamError(error: SmithersSandboxError): boolean {
  return (error.details as { truncated?: unknown } | null)?.truncated === true;
}

function packFailure(error: unknown): SmithersSandboxError {
  if (error instanceof SmithersSandboxError) return error;
  return new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, `pack the workspace: ${describeError(error)}`, { cause: error });
}
