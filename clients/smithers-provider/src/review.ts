/**
 * The durable review of a step's changes (option `durableReview`): instead of Smithers' own
 * gate, which fails closed when nobody pre-approved the diff (and Smithers then retries the
 * task, without end), the changes wait in the project's smithers-sandbox review:
 *
 *   smithers-sandbox ls / review <runId>:<sandboxId> / accept … / reject … --reason …
 *
 * `run` holds the bundle there (`smithers-sandbox hold`), keeps the task's heartbeat alive
 * while it waits, and resumes with the decision: accepted, the bundle goes to Smithers, which
 * applies its diffBundle (the `<Sandbox>` needs `autoAcceptDiffs`: the person's accept is the
 * approval); rejected, `run` fails with the reason, and nothing is applied.
 *
 * The reviewed copy is the bundle as the host sent it (patch files and diffBundle) and is
 * kept beside the one handed to Smithers, `<resultBundlePath>-review`; our accept checks its
 * digest, so what was decided is what was reviewed. The CLI is this package's companion
 * binary: option `bin`, else `$SMITHERS_SANDBOX_BIN`, else `smithers-sandbox` on PATH.
 */

import { spawn } from "node:child_process";

import { abortedError } from "./client.js";
import { ErrorCodes, SmithersSandboxError } from "./errors.js";

export type DurableReviewOptions = {
  /** The smithers-sandbox CLI (default `$SMITHERS_SANDBOX_BIN`, else `smithers-sandbox`). */
  bin?: string;
  /** How often the decision is looked for, in ms (default 1000). */
  pollMs?: number;
};

export type ReviewDecision = { state: "accepted" | "rejected"; reason: string | null; patchCount: number };

/** Output of one CLI call is bounded: `show --json` of one sandbox is small. */
const MAX_CLI_OUTPUT = 8 * 1024 * 1024;

export function reviewBin(options: DurableReviewOptions): string {
  const fromEnv = process.env.SMITHERS_SANDBOX_BIN;
  return options.bin ?? (fromEnv !== undefined && fromEnv.trim() !== "" ? fromEnv : "smithers-sandbox");
}

/** Runs the CLI with `args` (`--json` first); its parsed stdout, or a clear error. */
function cli(bin: string, args: string[]): Promise<Record<string, unknown>> {
  return new Promise((resolve, reject) => {
    const child = spawn(bin, ["--json", ...args], { stdio: ["ignore", "pipe", "pipe"] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let size = 0;
    const take = (into: Buffer[]) => (chunk: Buffer) => {
      size += chunk.length;
      if (size > MAX_CLI_OUTPUT) {
        child.kill("SIGKILL");
        return;
      }
      into.push(chunk);
    };
    child.stdout.on("data", take(out));
    child.stderr.on("data", take(err));
    child.on("error", (error) =>
      reject(
        new SmithersSandboxError(ErrorCodes.TASK_RUNTIME_UNAVAILABLE, `the durable review needs the smithers-sandbox CLI (${bin}): ${error.message}`, {
          details: { bin, fix: "install smithers-sandbox, or set SMITHERS_SANDBOX_BIN or the durableReview.bin option" },
        }),
      ),
    );
    child.on("close", (code) => {
      const text = Buffer.concat(out).toString("utf8").trim();
      let doc: Record<string, unknown> | undefined;
      try {
        doc = text === "" ? undefined : (JSON.parse(text) as Record<string, unknown>);
      } catch {
        doc = undefined;
      }
      if (code === 0 && doc) {
        resolve(doc);
        return;
      }
      // The CLI's --json errors are `{code, message, details}` on stdout.
      const error = (doc ?? {}) as { code?: string; message?: string; details?: unknown };
      const stderr = Buffer.concat(err).toString("utf8").trim().slice(0, 2000);
      reject(
        new SmithersSandboxError(error.code ?? ErrorCodes.SANDBOX_EXECUTION_FAILED, `smithers-sandbox ${args[0]} failed (exit ${code}): ${error.message ?? stderr}`, {
          details: error.details ?? { stderr },
        }),
      );
    });
  });
}

export type Held = { id: string; patchCount: number; totalDiffLines: number };

/** `smithers-sandbox hold`: the bundle at `bundleDir` waits in `rootDir`'s review. */
export async function holdForReview(
  options: DurableReviewOptions,
  where: { rootDir: string; runId: string; sandboxId: string; hostId: string; runtime: string },
  bundleDir: string,
): Promise<Held> {
  const doc = await cli(reviewBin(options), [
    "hold",
    "--root",
    where.rootDir,
    "--run-id",
    where.runId,
    "--sandbox-id",
    where.sandboxId,
    "--remote-id",
    where.hostId,
    "--runtime",
    where.runtime,
    bundleDir,
  ]);
  const review = (doc.review ?? {}) as { patchCount?: number; totalDiffLines?: number };
  return { id: `${where.runId}:${where.sandboxId}`, patchCount: Number(review.patchCount ?? 0), totalDiffLines: Number(review.totalDiffLines ?? 0) };
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(abortedError("waiting for the review", signal.reason));
      return;
    }
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(abortedError("waiting for the review", signal?.reason));
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * Waits until a person decides review `held.id` of `rootDir`; `waiting` is called on every
 * look (for the task's heartbeat). An aborted `signal` stops the wait (the review stays
 * pending; a resumed run holds its new bundle in its place).
 */
export async function waitForDecision(
  options: DurableReviewOptions,
  rootDir: string,
  held: Held,
  waiting: () => void,
  signal?: AbortSignal,
): Promise<ReviewDecision> {
  const bin = reviewBin(options);
  const pollMs = Math.max(50, options.pollMs ?? 1000);
  for (;;) {
    const doc = await cli(bin, ["show", held.id, "--root", rootDir]);
    const review = (doc.review ?? null) as { state?: string; reason?: string | null; patchCount?: number } | null;
    const state = review?.state;
    if (state === "accepted" || state === "applied") {
      return { state: "accepted", reason: null, patchCount: Number(review?.patchCount ?? 0) };
    }
    if (state === "rejected") {
      return { state: "rejected", reason: review?.reason ?? null, patchCount: Number(review?.patchCount ?? 0) };
    }
    if (state !== "pending") {
      throw new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, `the review of ${held.id} is gone or unreadable (state ${JSON.stringify(state)})`, {
        details: { review: held.id },
      });
    }
    waiting();
    await sleep(pollMs, signal);
  }
}
