/**
 * The provider kit's own contract suite (`createSandboxProviderContractSuite` of
 * `@smithers-orchestrator/sandbox` 0.32, bun:test) against a provider the kit builds on our
 * session (`createSmithersSandboxSession`), with every command run in a real sandbox of a
 * real `smithers-sandbox serve` ($SMITHERS_CONTRACT_URL, $SMITHERS_CONTRACT_TOKEN; started by
 * crates/smithers-cli/tests/ts_provider.rs).
 *
 * The suite's `handler` stands for the runner inside the sandbox, as in every vendor's use
 * of the suite. Here the real sandbox runs first: a command that prints the request document
 * it finds at $SMITHERS_SANDBOX_REQUEST_PATH and its whole environment; the handler is then
 * given exactly what the sandbox saw, and its answer is the command's output.
 */

import { afterAll } from "bun:test";
import { mkdir } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { createCommandSandboxProvider, createSandboxProviderContractSuite } from "@smithers-orchestrator/sandbox/provider-kit/index";

import { createSmithersSandboxSession, SandboxHostClient } from "../dist/src/index.js";

const url = process.env.SMITHERS_CONTRACT_URL;
const token = process.env.SMITHERS_CONTRACT_TOKEN;
if (!url || !token) throw new Error("SMITHERS_CONTRACT_URL and SMITHERS_CONTRACT_TOKEN must name the host");

/** What the sandbox saw, as one JSON line (python3 is in the host's /usr, which the sandbox sees). */
const SEE = `python3 -c 'import json, os; print(json.dumps({"request": json.load(open(os.environ["SMITHERS_SANDBOX_REQUEST_PATH"])), "env": dict(os.environ), "cwd": os.getcwd()}))'`;

type Handler = (args: { command: string; request: Record<string, unknown>; files: Map<string, string>; env: Record<string, string> }) => unknown;

let counter = 0;

// Most of the suite's tests never call cleanup (the kit's `active` map forgets them): the
// sandboxes they made are deleted here, so the host is left as it was found.
afterAll(async () => {
  const host = new SandboxHostClient({ url, token });
  for (const sandbox of await host.list()) await host.delete(sandbox.id);
});

function createRequest(overrides: Record<string, unknown> = {}) {
  const heartbeats: unknown[] = [];
  counter += 1;
  const base = join(tmpdir(), `smithers-contract-${process.pid}-${counter}`);
  const request = {
    runId: `run-contract-${process.pid}-${Date.now()}`,
    sandboxId: `sbx-contract-${counter}`,
    input: overrides.input ?? { hello: "world" },
    config: (overrides.config as Record<string, unknown> | undefined) ?? {},
    rootDir: join(base, "root"),
    requestBundlePath: join(base, "request"),
    resultBundlePath: join(base, "result"),
    workflow: (() => ({ build: () => null })) as never,
    executeChildWorkflow: (async () => ({ runId: "child", status: "finished", output: null })) as never,
    allowNetwork: false,
    maxOutputBytes: 1_000_000,
    toolTimeoutMs: 60_000,
    egress: overrides.egress as never,
    signal: overrides.signal as AbortSignal | undefined,
    heartbeat: (d?: unknown) => heartbeats.push(d ?? {}),
  };
  return { request, heartbeats };
}

createSandboxProviderContractSuite({
  name: "smithers-sandbox session on a real serve host",
  expectedProviderId: "smithers-sandbox",
  createRequest: createRequest as never,
  createProvider: (handler: Handler, providerOptions: Record<string, unknown> = {}) => {
    const { onDestroy, ...kitOptions } = providerOptions as { onDestroy?: () => void } & Record<string, unknown>;
    const open = createSmithersSandboxSession({ url, token });
    return createCommandSandboxProvider({
      id: "smithers-sandbox",
      ...kitOptions,
      command: SEE,
      createSession: async (request: Parameters<typeof open>[0]) => {
        await mkdir(request.rootDir, { recursive: true });
        const session = await open(request);
        const files = new Map<string, string>();
        return {
          get remoteId() {
            return session.remoteId;
          },
          writeFile: async (path: string, content: string) => {
            files.set(path, content);
            await session.writeFile(path, content);
          },
          readFile: session.readFile,
          exec: async (command: string, opts: Parameters<typeof session.exec>[1]) => {
            const ran = await session.exec(command, opts);
            if (ran.exitCode !== 0) throw new Error(`the sandbox command failed (${ran.exitCode}): ${ran.stderr}`);
            const seen = JSON.parse(ran.stdout) as { request: Record<string, unknown>; env: Record<string, string>; cwd: string };
            if (seen.cwd !== "/workspace") throw new Error(`the command ran in ${seen.cwd}, not /workspace`);
            const answer = await handler({ command, request: seen.request, files, env: seen.env });
            return { exitCode: 0, stdout: JSON.stringify(answer), stderr: "" };
          },
          destroy: async () => {
            await session.destroy?.();
            onDestroy?.();
          },
        };
      },
    } as never);
  },
});
