/**
 * What the integration tests need: the real `smithers-sandbox` binary serving on a free
 * loopback port, a check that this host can run native sandboxes, and the real JavaScript
 * package `@smithers-orchestrator/sandbox` 0.32.0 from `$SMITHERS_JS_HOME`.
 *
 * A missing prerequisite makes a test print `SKIP <reason>` and pass, except under `CI=true`,
 * where it fails: CI must run everything.
 */

import { spawn, spawnSync } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { homedir, tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";

export const TOKEN = "a-provider-test-token-of-sufficient-length";

export const underCi = process.env.CI === "true";

/** Returns the reason to skip, or throws under CI=true. */
export function skipOrFail(reason: string): string {
  if (underCi) {
    throw new Error(`prerequisite missing under CI=true: ${reason}`);
  }
  console.log(`SKIP ${reason}`);
  return reason;
}

export function binPath(): string | undefined {
  const bin = process.env.SMITHERS_SANDBOX_BIN;
  return bin && existsSync(bin) ? bin : undefined;
}

/** Whether `doctor --json` reports protection `name` (e.g. `memory`) enforced on this host. */
export function enforced(bin: string, name: string): boolean {
  const out = spawnSync(bin, ["doctor", "--json"], { encoding: "utf8", env: { ...process.env, NO_COLOR: "1" } });
  try {
    const report = JSON.parse(out.stdout) as { protections?: Array<{ name: string; status: string }> };
    return (report.protections ?? []).some((p) => p.name === name && p.status === "enforced");
  } catch {
    return false;
  }
}

/** Why native sandboxes cannot run here (`doctor --json`), or null when they can. */
export function nativeUnavailable(bin: string): string | null {
  const out = spawnSync(bin, ["doctor", "--json"], { encoding: "utf8", env: { ...process.env, NO_COLOR: "1" } });
  let report: { protections?: Array<{ name: string; status: string }> } = {};
  try {
    report = JSON.parse(out.stdout) as typeof report;
  } catch {
    return `doctor --json printed no report: ${out.stderr}`;
  }
  const needed = ["user-namespace", "mount-namespace", "pid-namespace", "workspace-cow"];
  const missing = needed.filter((name) => !(report.protections ?? []).some((p) => p.name === name && p.status === "enforced"));
  return missing.length === 0 ? null : `native sandboxes unavailable: ${missing.join(", ")}`;
}

export type Server = { url: string; dataDir: string; child: ChildProcess; stop: () => Promise<void> };

/**
 * Starts `smithers-sandbox serve --listen 127.0.0.1:0 [args]` and waits for the address it
 * prints; `env` is added to its environment (e.g. SMITHERS_SANDBOX_TOKENS for more tokens).
 */
export async function startServer(bin: string, args: string[] = [], env: Record<string, string> = {}): Promise<Server> {
  const dataDir = await mkdtemp(join(tmpdir(), "smithers-provider-server-"));
  const child = spawn(bin, ["serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir, ...args], {
    env: { ...process.env, ...env, SMITHERS_SANDBOX_TOKEN: TOKEN, NO_COLOR: "1" },
    stdio: ["ignore", "ignore", "pipe"],
  });
  // Never outlive the test process, whatever way it ends.
  const reap = () => child.kill("SIGKILL");
  process.once("exit", reap);
  const lines = createInterface({ input: child.stderr! });
  const seen: string[] = [];
  const url = await new Promise<string>((resolve, reject) => {
    child.once("exit", (code) => reject(new Error(`serve exited (${code}) before printing its address: ${seen.join("\n")}`)));
    child.once("error", reject);
    lines.on("line", (line) => {
      seen.push(line);
      const m = /serving on (http:\/\/\S+)/.exec(line);
      if (m) resolve(m[1]!);
    });
  });
  // Keep draining stderr so the server never blocks on a full pipe.
  lines.on("line", () => {});
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((resolve) => child.once("exit", resolve));
      child.kill("SIGTERM");
      await exited;
    }
    process.removeListener("exit", reap);
    await rm(dataDir, { recursive: true, force: true });
  };
  return { url, dataDir, child, stop };
}

export function smithersJsHome(): string {
  return process.env.SMITHERS_JS_HOME ?? join(homedir(), ".cache", "smithers-js");
}

function modulePath(rel: string): string {
  return join(smithersJsHome(), "node_modules", rel);
}

export function smithersJsAvailable(): boolean {
  return existsSync(modulePath("@smithers-orchestrator/sandbox/package.json"));
}

/** Imports a file of the reference installation (`@smithers-orchestrator/sandbox/src/bundle.js`). */
export async function importReference<T>(rel: string): Promise<T> {
  return (await import(pathToFileURL(modulePath(rel)).href)) as T;
}

export type ValidatedSandboxBundle = {
  manifest: { outputs: unknown; status: string; runId?: string; patches?: string[]; diffBundle?: unknown };
  bundleSizeBytes: number;
  patchFiles: string[];
  logsPath: string | null;
  bundlePath: string;
};

export type ReferenceBundle = { validateSandboxBundle: (path: string) => Promise<ValidatedSandboxBundle> };

export type ReferenceExecute = {
  registerSandboxProvider: (provider: unknown) => () => void;
  resolveSandboxProvider: (value: unknown) => { id: string; run: Function; cleanup?: Function } | undefined;
  executeSandbox: (options: Record<string, unknown>) => Promise<unknown>;
};

export type ReferenceTaskRuntime = { withTaskRuntime: <T>(runtime: Record<string, unknown>, fn: () => T) => T };
