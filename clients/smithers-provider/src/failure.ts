/**
 * A step that did not finish, as the error Smithers shows.
 *
 * Smithers 0.32 applies the `diffBundle` of any bundle a provider hands it, whatever its
 * status (`finalizeSandboxBundle` in `@smithers-orchestrator/sandbox/src/execute.js`), and a
 * failed step's bundle has no outputs, so the task then failed with "Task output failed
 * validation … received undefined" after the step's half-done changes had landed. Smithers'
 * own provider kit never hands such a bundle over: it throws
 * `SmithersError("SANDBOX_EXECUTION_FAILED", "Sandbox command … exited with code N: <stderr>")`.
 * So does this provider: a bundle whose status is not `finished` is never returned (nor held
 * for the durable review), and `run` throws a `SANDBOX_EXECUTION_FAILED` error built from the
 * outcome: the exit code or how the step was ended (timeout, memory, pids, disk, output,
 * signal, cancelled), why the host rejected its result file, the egress engine's denials, and
 * the end of its stderr.
 *
 * Everything here came from the step (its stderr, its egress targets) or the host: the stderr
 * kept is the last {@link STDERR_TAIL_BYTES} of what the event stream carried, each line
 * bounded before it is kept; the request's environment values are redacted from it, and control
 * characters are made visible, so nothing the step printed reaches Smithers' logs unbounded or
 * as terminal escapes.
 */

import { createReadStream } from "node:fs";
import { lstat } from "node:fs/promises";
import { join } from "node:path";

import type { ExecOutcome } from "./client.js";
import { ErrorCodes, SmithersSandboxError } from "./errors.js";

/** How much of the end of a failed step's stderr goes into its error. */
export const STDERR_TAIL_BYTES = 4096;

/** The longest environment value the tail keeps room for, so a value cut at its start is still redacted whole. */
const MAX_REDACTED_VALUE = 64 * 1024;

const TERMINATIONS = new Set(["exited", "signaled", "timeout", "cancelled", "memory", "pids", "output", "disk"]);

/** Collects the end of a stream of lines, bounded whatever the lines' size. */
export class StderrTail {
  private text = "";
  private readonly keep: number;
  /** Lines seen in all. */
  lines = 0;

  /** `keep`: characters kept beyond the tail itself (room for redaction, see {@link redactor}). */
  constructor(private readonly limit: number = STDERR_TAIL_BYTES, extra = 0) {
    this.keep = limit + Math.min(Math.max(0, extra), MAX_REDACTED_VALUE);
  }

  push(line: string): void {
    this.lines += 1;
    const piece = line.length > this.keep ? line.slice(-this.keep) : line;
    this.text = this.text === "" ? piece : `${this.text}\n${piece}`;
    if (this.text.length > 2 * this.keep) this.text = this.text.slice(-this.keep);
  }

  /**
   * The kept end, passed through `clean` (redaction, {@link visible}) before it is cut to its
   * limit in UTF-8 bytes, so that a value cut at the tail's start is still redacted whole.
   */
  tail(clean: (text: string) => string = (t) => t): { text: string; cut: boolean } {
    const whole = clean(this.text.length > this.keep ? this.text.slice(-this.keep) : this.text);
    const cut = this.text.length > this.keep || Buffer.byteLength(whole, "utf8") > this.limit;
    return { text: utf8Tail(whole, this.limit), cut };
  }
}

/** The last `bytes` UTF-8 bytes of `text`, never cutting a character in half. */
export function utf8Tail(text: string, bytes: number): string {
  const buf = Buffer.from(text, "utf8");
  if (buf.length <= bytes) return text;
  let start = buf.length - bytes;
  // Skip continuation bytes (10xxxxxx) so the tail starts on a character.
  while (start < buf.length && (buf[start]! & 0xc0) === 0x80) start += 1;
  return buf.subarray(start).toString("utf8");
}

/** The first `chars` characters of `text`, said to be cut when it was. */
export function bounded(text: string, chars: number): string {
  return text.length > chars ? `${text.slice(0, chars)}… [${text.length - chars} more characters]` : text;
}

/** Control characters but newline and tab made visible (`\x1b` → `\u001b`): no terminal escapes reach a log. */
export function visible(text: string): string {
  // eslint-disable-next-line no-control-regex
  return text.replace(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

/**
 * Replaces each of `values` (the request's environment values) with `[redacted]`, longest
 * first. A value of fewer than 4 characters is replaced only where it stands alone (not inside
 * a longer word or number), so `DEBUG=1` does not garble every `1`.
 */
export function redactor(values: Iterable<string>): (text: string) => string {
  const unique = [...new Set([...values].filter((v) => typeof v === "string" && v.length > 0))].sort((a, b) => b.length - a.length);
  if (unique.length === 0) return (text) => text;
  return (text) => {
    let out = text;
    for (const value of unique) {
      if (value.length >= 4) {
        out = out.split(value).join("[redacted]");
        continue;
      }
      let result = "";
      let from = 0;
      for (let at = out.indexOf(value); at !== -1; at = out.indexOf(value, at + value.length)) {
        const before = at > 0 ? out[at - 1]! : "";
        const after = out[at + value.length] ?? "";
        if (/[\p{L}\p{N}_]/u.test(before) || /[\p{L}\p{N}_]/u.test(after)) continue;
        result += `${out.slice(from, at)}[redacted]`;
        from = at + value.length;
      }
      out = result + out.slice(from);
    }
    return out;
  };
}

/** The longest of `values`, for {@link StderrTail}'s room. */
export function longest(values: Iterable<string>): number {
  let n = 0;
  for (const v of values) n = Math.max(n, v.length);
  return n;
}

/** Lines of the bundle's log longer than this are not looked into (a record we want is short). */
const MAX_LOG_LINE = 64 * 1024;

/**
 * Why the host rejected the step's result (the last `resultRejected` record of the bundle's
 * log, `logs/stream.ndjson`), or null. The log is the host's, up to the bundle's size limit:
 * it is read as a stream, and only short lines naming the record are parsed.
 */
export async function resultRejection(bundleDir: string): Promise<string | null> {
  const path = join(bundleDir, "logs", "stream.ndjson");
  const info = await lstat(path).catch(() => null);
  if (!info || !info.isFile()) return null;
  let found: string | null = null;
  let line: Buffer[] = [];
  let lineBytes = 0;
  let skipping = false;
  const look = (bytes: Buffer) => {
    if (!bytes.includes("resultRejected")) return;
    try {
      const record = JSON.parse(bytes.toString("utf8")) as { type?: unknown; reason?: unknown };
      if (record?.type === "resultRejected" && typeof record.reason === "string") found = record.reason;
    } catch {
      // Not a record: ignored.
    }
  };
  for await (const chunk of createReadStream(path)) {
    let buf = chunk as Buffer;
    for (let nl = buf.indexOf(0x0a); nl !== -1; nl = buf.indexOf(0x0a)) {
      if (!skipping && lineBytes + nl <= MAX_LOG_LINE) look(Buffer.concat([...line, buf.subarray(0, nl)]));
      line = [];
      lineBytes = 0;
      skipping = false;
      buf = buf.subarray(nl + 1);
    }
    if (skipping) continue;
    if (lineBytes + buf.length > MAX_LOG_LINE) {
      skipping = true;
      line = [];
      lineBytes = 0;
    } else if (buf.length > 0) {
      line.push(Buffer.from(buf));
      lineBytes += buf.length;
    }
  }
  if (!skipping && lineBytes > 0) look(Buffer.concat(line));
  return found;
}

/** An egress denial, for the error (see `egress.ts`). */
export type Denial = { host: string; port: number; reason: string; count: number };

export type StepFailure = {
  /** The bundle's status: failed or cancelled. */
  status: string;
  provider: string;
  runId: string;
  sandboxId: string;
  hostId: string;
  outcome: ExecOutcome;
  /** The step's timeout as asked (for the message of a timeout). */
  timeoutMs: number | undefined;
  /** Why the host rejected the step's result file, when it did. */
  rejection: string | null;
  stderr: StderrTail;
  redact: (text: string) => string;
  denials: Denial[];
  /** Where the step's bundle was kept, for a person to look into (never applied). */
  keptBundle: string | null;
  /** The caller aborted the step (PROCESS_ABORTED rather than a failure). */
  aborted: boolean;
};

function safeInt(value: unknown): number | null {
  return typeof value === "number" && Number.isSafeInteger(value) ? value : null;
}

/** How the step ended, in words: "exited with code 3", "timed out after 500 ms and was killed", ... */
export function howItEnded(outcome: ExecOutcome, timeoutMs: number | undefined): { words: string; termination: string; exitCode: number | null; signal: number | null } {
  const termination = typeof outcome.termination === "string" && TERMINATIONS.has(outcome.termination) ? outcome.termination : "unknown";
  const exitCode = safeInt(outcome.exitCode);
  const signal = safeInt(outcome.signal);
  const code = exitCode === null ? "" : ` (exit code ${exitCode})`;
  let words: string;
  switch (termination) {
    case "exited":
      words = exitCode === null ? "exited" : `exited with code ${exitCode}`;
      break;
    case "signaled":
      words = `was killed by signal ${signal ?? "?"}${code}`;
      break;
    case "timeout":
      words = `timed out${timeoutMs === undefined ? "" : ` after ${timeoutMs} ms`} (timeoutMs) and was killed`;
      break;
    case "cancelled":
      words = `was cancelled${code}`;
      break;
    case "memory":
      words = `was killed by its memory limit (memoryLimit)${code}`;
      break;
    case "pids":
      words = `hit its process limit (pidsLimit)${code}`;
      break;
    case "disk":
      words = `hit its disk limit (diskLimit)${code}`;
      break;
    case "output":
      words = `hit its output limit (maxOutputBytes)${code}`;
      break;
    default:
      words = `ended (${exitCode === null ? "no exit code" : `exit code ${exitCode}`})`;
  }
  return { words, termination, exitCode, signal };
}

/** The error `run` throws for a step whose bundle is not `finished` (see the module comment). */
export function stepFailure(f: StepFailure): SmithersSandboxError {
  const ended = howItEnded(f.outcome, f.timeoutMs);
  // A step that exited 0 (or was not stopped) yet failed said so itself, or had its result refused.
  const said = ended.termination === "exited" && ended.exitCode === 0 && f.rejection === null ? `, and reported status ${f.status}` : "";
  const lines = [
    `Sandbox step ${f.sandboxId} (smithers-sandbox ${f.hostId}) ${ended.words}${said}; none of its changes were applied`,
  ];
  const rejection = f.rejection === null ? null : bounded(visible(f.redact(f.rejection)), 1000);
  if (rejection !== null) lines.push(`its result file was rejected: ${rejection}`);
  if (f.denials.length > 0) {
    const shown = f.denials
      .slice(0, 5)
      .map((d) => `${visible(f.redact(d.host))}${d.port > 0 ? `:${d.port}` : ""}${d.count > 1 ? ` ×${d.count}` : ""} (${bounded(visible(f.redact(d.reason)), 200)})`);
    lines.push(`egress denied: ${shown.join("; ")}${f.denials.length > 5 ? `; and ${f.denials.length - 5} more` : ""}`);
  }
  const tail = f.stderr.tail((text) => visible(f.redact(text)));
  const truncated = f.outcome.stderrTruncated === true;
  if (tail.text.trim() !== "") {
    const what = tail.cut ? `last ${STDERR_TAIL_BYTES} bytes of its stderr` : "its stderr";
    lines.push(`${what}${truncated ? " (as far as the host's output limit kept it)" : ""}:\n${tail.text}`);
  } else {
    lines.push("its stderr was empty");
  }
  const details = {
    provider: f.provider,
    remoteId: f.hostId,
    runId: f.runId,
    sandboxId: f.sandboxId,
    status: f.status,
    termination: ended.termination,
    exitCode: ended.exitCode,
    signal: ended.signal,
    ...(f.timeoutMs !== undefined && ended.termination === "timeout" ? { timeoutMs: f.timeoutMs } : {}),
    ...(rejection !== null ? { resultRejected: rejection } : {}),
    ...(f.denials.length > 0 ? { egressDenied: f.denials.slice(0, 20).map((d) => ({ host: visible(f.redact(d.host)), port: d.port, count: d.count })) } : {}),
    stderrTruncated: truncated || tail.cut,
    bundlePath: f.keptBundle,
  };
  const code = f.aborted ? ErrorCodes.PROCESS_ABORTED : ErrorCodes.SANDBOX_EXECUTION_FAILED;
  return new SmithersSandboxError(code, lines.join("\n"), { details });
}
