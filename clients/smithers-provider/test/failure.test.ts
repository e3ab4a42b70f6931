/**
 * The pieces of a failed step's error on their own (no server): the bounded stderr tail, the
 * redaction of the request's environment values, the host's result rejection read from a
 * bundle's log, how a step ended in words, and the egress decisions turned into heartbeats.
 */

import assert from "node:assert/strict";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";

import { EgressDecisions } from "../src/egress.js";
import { howItEnded, redactor, resultRejection, StderrTail, STDERR_TAIL_BYTES, stepFailure, utf8Tail, visible } from "../src/failure.js";
import type { StepFailure } from "../src/failure.js";

const scratch: string[] = [];
after(async () => {
  for (const dir of scratch) await rm(dir, { recursive: true, force: true });
});

test("the stderr tail keeps the last 4 KiB whatever the lines, and says it was cut", () => {
  const tail = new StderrTail();
  tail.push("first line");
  assert.deepEqual(tail.tail(), { text: "first line", cut: false });
  // One huge line (the host caps a stream, not a line) and many small ones.
  tail.push("x".repeat(10 * 1024 * 1024));
  for (let i = 0; i < 10_000; i++) tail.push(`line ${i}`);
  const { text, cut } = tail.tail();
  assert.equal(cut, true);
  assert.ok(Buffer.byteLength(text) <= STDERR_TAIL_BYTES, String(Buffer.byteLength(text)));
  assert.ok(text.endsWith("line 9998\nline 9999"), text.slice(-40));
  assert.ok(!text.includes("first line"));
  // Multi-byte characters are never cut in half.
  const wide = new StderrTail(10);
  wide.push("ééééééééé");
  assert.equal(wide.tail().text, "ééééé");
  assert.equal(utf8Tail("aé", 2), "é");
  assert.equal(utf8Tail("aé", 1), "");
});

test("the request's env values are redacted, even one the tail's start cut through", () => {
  const secret = "s3cr3t-value-of-some-length";
  const redact = redactor([secret, "1", "", "abc"]);
  assert.equal(redact(`key=${secret}; again ${secret}`), "key=[redacted]; again [redacted]");
  // Short values only where they stand alone: DEBUG=1 does not garble every 1.
  assert.equal(redact("exit 1 after 10 tries, 1"), "exit [redacted] after 10 tries, [redacted]");
  assert.equal(redact("abcdef abc"), "abcdef [redacted]");
  // The secret straddles the point where the last 4 KiB begin: still redacted whole.
  const tail = new StderrTail(STDERR_TAIL_BYTES, secret.length);
  tail.push(`${secret}${"y".repeat(STDERR_TAIL_BYTES - 5)}`);
  const { text } = tail.tail(redact);
  assert.ok(!text.includes(secret.slice(-5)), text.slice(0, 30));
  assert.ok(!text.includes("ue-of"), text.slice(0, 30));
});

test("control characters are made visible: no terminal escape reaches a log", () => {
  assert.equal(visible("red \x1b[31mtext\x07\r\n\tok\u2028"), "red \\u001b[31mtext\\u0007\\u000d\n\tok\\u2028");
});

test("the host's result rejection is read from the bundle's log, bounded", async () => {
  const dir = await mkdtemp(join(tmpdir(), "smithers-provider-failure-"));
  scratch.push(dir);
  assert.equal(await resultRejection(dir), null);
  await mkdir(join(dir, "logs"));
  const records = [
    JSON.stringify({ type: "stderr", line: "resultRejected is just a word here" }),
    // A huge line naming the record is never parsed (nor kept whole).
    JSON.stringify({ type: "resultRejected", reason: "z".repeat(200_000) }),
    JSON.stringify({ type: "resultRejected", timestampMs: 1, reason: "the result JSON is not valid JSON (expected value at line 1 column 1)" }),
    JSON.stringify({ type: "exit", termination: "exited", exitCode: 0 }),
    "not json at all {",
  ];
  await writeFile(join(dir, "logs", "stream.ndjson"), `${records.join("\n")}\n`);
  assert.equal(await resultRejection(dir), "the result JSON is not valid JSON (expected value at line 1 column 1)");
});

test("how a step ended, in words", () => {
  assert.equal(howItEnded({ termination: "exited", exitCode: 3 }, undefined).words, "exited with code 3");
  assert.equal(howItEnded({ termination: "timeout", exitCode: null }, 1500).words, "timed out after 1500 ms (timeoutMs) and was killed");
  assert.equal(howItEnded({ termination: "memory", exitCode: 137 }, undefined).words, "was killed by its memory limit (memoryLimit) (exit code 137)");
  assert.equal(howItEnded({ termination: "signaled", signal: 9 }, undefined).words, "was killed by signal 9");
  assert.equal(howItEnded({ termination: "pids" }, undefined).words, "hit its process limit (pidsLimit)");
  assert.equal(howItEnded({ termination: "disk" }, undefined).words, "hit its disk limit (diskLimit)");
  // The host's words are not trusted: an unknown termination is not echoed.
  const odd = howItEnded({ termination: "\x1b[2Jweird", exitCode: 1.5 as unknown as number }, undefined);
  assert.equal(odd.termination, "unknown");
  assert.equal(odd.exitCode, null);
});

function failure(over: Partial<StepFailure> = {}): StepFailure {
  const stderr = new StderrTail();
  stderr.push("boom");
  return {
    status: "failed",
    provider: "smithers-sandbox",
    runId: "run",
    sandboxId: "step",
    hostId: "sbx-1",
    outcome: { termination: "exited", exitCode: 3, stderrTruncated: false },
    timeoutMs: undefined,
    rejection: null,
    stderr,
    redact: (t) => t,
    denials: [],
    keptBundle: "/tmp/result-failed",
    aborted: false,
    ...over,
  };
}

test("the error is SANDBOX_EXECUTION_FAILED, built from the outcome", () => {
  const error = stepFailure(failure());
  assert.equal(error.code, "SANDBOX_EXECUTION_FAILED");
  assert.equal(error.message, "Sandbox step step (smithers-sandbox sbx-1) exited with code 3; none of its changes were applied\nits stderr:\nboom");
  assert.deepEqual(error.details, {
    provider: "smithers-sandbox",
    remoteId: "sbx-1",
    runId: "run",
    sandboxId: "step",
    status: "failed",
    termination: "exited",
    exitCode: 3,
    signal: null,
    stderrTruncated: false,
    bundlePath: "/tmp/result-failed",
  });
  const rejected = stepFailure(failure({ outcome: { termination: "exited", exitCode: 0 }, rejection: "the result JSON exceeds the limit of 5242880 bytes", stderr: new StderrTail() }));
  assert.match(rejected.message, /exited with code 0; none of its changes were applied\nits result file was rejected: the result JSON exceeds the limit/);
  assert.match(rejected.message, /its stderr was empty/);
  assert.equal((rejected.details as { resultRejected?: string }).resultRejected, "the result JSON exceeds the limit of 5242880 bytes");
  const said = stepFailure(failure({ outcome: { termination: "exited", exitCode: 0 } }));
  assert.match(said.message, /exited with code 0, and reported status failed;/);
  const denied = stepFailure(failure({ denials: [{ host: "evil.test", port: 443, reason: "no rule allows evil.test", count: 2 }] }));
  assert.match(denied.message, /\negress denied: evil\.test:443 ×2 \(no rule allows evil\.test\)\n/);
  const aborted = stepFailure(failure({ status: "cancelled", outcome: { termination: "cancelled" }, aborted: true }));
  assert.equal(aborted.code, "PROCESS_ABORTED");
});

test("egress decisions become heartbeats: new destinations at once, the rest throttled, totals always", () => {
  const redact = redactor(["hidden-token-value"]);
  const decisions = new EgressDecisions(redact, 1000);
  const deny = (host: string, port = 443) => ({ type: "egress", host, port, verdict: "deny", reason: `no rule allows ${host}`, rule: null, entry: "http-connect" });
  const first = decisions.take(deny("denied.test"), 0);
  assert.deepEqual(first, { host: "denied.test", port: 443, verdict: "deny", reason: "no rule allows denied.test", entry: "http-connect", count: 1, allowed: 0, denied: 1, wouldDeny: 0 });
  // The same destination again, soon: throttled, then due.
  assert.equal(decisions.take(deny("denied.test"), 10)?.count, 2);
  assert.equal(decisions.take(deny("denied.test"), 20), null);
  assert.equal(decisions.take(deny("denied.test"), 1500)?.count, 4);
  // A step's words are bounded, made visible and redacted.
  const odd = decisions.take({ verdict: "allow", host: `hidden-token-value.${"a".repeat(1000)}\x1b`, port: 99999, reason: "ok" }, 1600);
  assert.ok(odd !== null);
  assert.ok(odd.host.startsWith("[redacted].aaa"), odd.host);
  assert.ok(odd.host.length <= 255);
  assert.equal(odd.port, 0);
  assert.equal(decisions.take({ verdict: "maybe", host: "x" }, 1700), null);
  assert.equal(decisions.take("not a record", 1700), null);
  // Thousands of destinations: counted in the totals, throttled, memory bounded.
  let sent = 0;
  for (let i = 0; i < 5000; i++) if (decisions.take(deny(`host${i}.test`), 1800) !== null) sent += 1;
  assert.ok(sent <= 40, String(sent));
  assert.equal(decisions.totals.denied, 5004);
  assert.equal(decisions.flush()?.denied, 5004);
  assert.equal(decisions.flush(), null);
  assert.ok(decisions.denials().length <= 256);
  assert.deepEqual(decisions.denials()[0], { host: "denied.test", port: 443, reason: "no rule allows denied.test", count: 4 });
});
