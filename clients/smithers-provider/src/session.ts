/**
 * A `SandboxSession` (the provider kit's seam of `@smithers-orchestrator/sandbox`: writeFile,
 * exec, readFile, destroy) on a smithers-sandbox host, so that a provider built with the kit's
 * `createCommandSandboxProvider({ id, createSession })` runs its command in our sandboxes:
 *
 * ```ts
 * createCommandSandboxProvider({ id: "smithers-sandbox", createSession: createSmithersSandboxSession({ url, token }) });
 * ```
 *
 * The host runs one command per sandbox, with its environment fixed when the sandbox is made,
 * so the session makes the sandbox at the first `exec` (when the kit names the environment):
 * the project (`request.rootDir`, as `createSmithersSandboxProvider` uploads it) plus the files
 * written before, the request document, then the command, followed to its end; a second `exec`
 * is refused. `remoteId` is the host's sandbox id from then on (`pending:<runId>:<sandboxId>`
 * before, as the kit's `*-session-created` heartbeat sees it).
 *
 * Paths: a file written under `/workspace/` travels with the upload, except under
 * `/workspace/.smithers/` (the host never takes the project's state): there only the kit's
 * request file is taken, as the request document the step reads at
 * `$SMITHERS_SANDBOX_REQUEST_PATH` (the host sets that variable, and
 * `$SMITHERS_SANDBOX_RESULT_PATH`, to its own files). Anything else is refused, never dropped.
 * `readFile` of the kit's result file answers the result the host collected (`{status,
 * outputs}`); other reads are refused. The step's timeout is the one `exec` asks for.
 */

import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

import type { TerminalEvent } from "./client.js";
import { ErrorCodes, SmithersSandboxError } from "./errors.js";
import { controlsFor, hostClientFor, uploadSelectionFor } from "./provider.js";
import type { SmithersSandboxProviderOptions } from "./provider.js";
import type { SandboxProviderRequest } from "./types.js";

/** The kit's default request and result files (`createCommandSandboxProvider`). */
export const KIT_REQUEST_FILE = "/workspace/.smithers/sandbox-request.json";
export const KIT_RESULT_FILE = "/workspace/.smithers/sandbox-result.json";

export type SandboxExecOptions = { cwd: string; env: Record<string, string>; timeoutMs: number; signal?: AbortSignal };
export type SandboxExecResult = { exitCode: number; stdout: string; stderr: string };
export type SandboxSession = {
  readonly remoteId: string;
  readonly writeFile: (path: string, content: string) => Promise<void>;
  readonly readFile: (path: string) => Promise<string>;
  readonly exec: (command: string, opts: SandboxExecOptions) => Promise<SandboxExecResult>;
  readonly destroy?: () => Promise<void>;
};

export type SmithersSandboxSessionOptions = Pick<
  SmithersSandboxProviderOptions,
  "url" | "token" | "includeGit" | "honourGitignore" | "databasePath" | "gzipLevel" | "requestTimeoutMs" | "eventIdleTimeoutMs" | "retry" | "ifExists"
> & {
  /** The kit's `requestFile`, absolute (default {@link KIT_REQUEST_FILE}). */
  requestFile?: string;
  /** The kit's `resultFile`, absolute (default {@link KIT_RESULT_FILE}). */
  resultFile?: string;
  /** Most bytes of stdout (and of stderr) kept for the kit (default 8 MiB; the rest is cut, and said). */
  maxOutputBytes?: number;
};

const HOST_PATH_VARIABLES = new Set(["SMITHERS_SANDBOX_REQUEST_PATH", "SMITHERS_SANDBOX_RESULT_PATH", "SMITHERS_SANDBOX"]);

function refuse(message: string): SmithersSandboxError {
  return new SmithersSandboxError(ErrorCodes.INVALID_INPUT, message);
}

/** Opens sessions for the kit: `createSession: createSmithersSandboxSession(options)`. */
export function createSmithersSandboxSession(options: SmithersSandboxSessionOptions = {}): (request: SandboxProviderRequest) => Promise<SandboxSession> {
  const client = hostClientFor(options, "smithers-sandbox");
  const requestFile = options.requestFile ?? KIT_REQUEST_FILE;
  const resultFile = options.resultFile ?? KIT_RESULT_FILE;
  const maxOutput = options.maxOutputBytes ?? 8 * 1024 * 1024;

  return async (request) => {
    // Refused before anything is made: what the host cannot honour for this request.
    const { controls: base, image } = controlsFor({ ...request, egress: undefined, config: { ...(request.config ?? {}), egress: undefined } });
    let hostId: string | undefined;
    let requestDocument: unknown = {};
    let collected: TerminalEvent | undefined;
    const extraFiles: Array<{ path: string; content: Buffer }> = [];

    const session: SandboxSession = {
      get remoteId() {
        return hostId ?? `pending:${request.runId}:${request.sandboxId}`;
      },
      async writeFile(path, content) {
        if (hostId !== undefined) throw refuse(`writeFile ${path}: the sandbox already ran (the host takes files only before its one command)`);
        if (path === requestFile) {
          try {
            requestDocument = JSON.parse(content);
          } catch {
            throw refuse(`writeFile ${path}: the request file must be JSON`);
          }
          return;
        }
        if (!path.startsWith("/workspace/") || path.startsWith("/workspace/.smithers/") || path === "/workspace/.smithers") {
          throw refuse(`writeFile ${path}: only files under /workspace/ (not /workspace/.smithers/) travel to the host`);
        }
        extraFiles.push({ path: path.slice("/workspace/".length), content: Buffer.from(content) });
      },
      async readFile(path) {
        if (path !== resultFile || collected === undefined) {
          throw refuse(`readFile ${path}: the host gives back the step's result and bundle, not files of its workspace`);
        }
        if (collected.type !== "completed") throw refuse(`readFile ${path}: the step did not complete (${collected.type})`);
        const dir = await mkdtemp(join(tmpdir(), "smithers-session-"));
        try {
          await client.downloadBundle(hostId!, join(dir, "bundle"));
          const manifest = JSON.parse(await readFile(join(dir, "bundle", "README.md"), "utf8")) as { status?: unknown; outputs?: unknown };
          return JSON.stringify({ status: manifest.status, outputs: manifest.outputs });
        } finally {
          await rm(dir, { recursive: true, force: true });
        }
      },
      async exec(command, opts) {
        if (hostId !== undefined) throw refuse("exec: the host runs one command per sandbox, and this one already ran");
        const env: Record<string, string> = { ...(base.env ?? {}) };
        for (const [k, v] of Object.entries(opts.env ?? {})) {
          // The host sets these to its own request and result files.
          if (!HOST_PATH_VARIABLES.has(k)) env[k] = v;
        }
        const controls = { ...base, ...(Object.keys(env).length > 0 ? { env } : {}) };
        if (Number.isFinite(opts.timeoutMs) && opts.timeoutMs > 0) controls.timeoutMs = Math.ceil(opts.timeoutMs);
        const info = await client.create(
          { runId: request.runId, sandboxId: request.sandboxId, controls, ifExists: options.ifExists ?? "replace", ...(image !== undefined ? { image } : {}) },
          opts.signal,
        );
        hostId = info.id;
        const selection = uploadSelectionFor(request, options);
        await client.uploadWorkspace(hostId, request.rootDir, {
          skipTop: selection.skipTop,
          skipAnywhere: selection.skipAnywhere,
          skipPaths: selection.skipPaths,
          extraFiles,
          ...(options.gzipLevel !== undefined ? { gzipLevel: options.gzipLevel } : {}),
          ...(opts.signal ? { signal: opts.signal } : {}),
        });
        await client.putRequest(hostId, requestDocument, opts.signal);
        const cwd = opts.cwd && opts.cwd !== "" ? opts.cwd : "/workspace";
        await client.execute(hostId, { argv: ["/bin/sh", "-c", command], cwd });
        const out = { stdout: [] as string[], stderr: [] as string[], bytes: { stdout: 0, stderr: 0 }, cut: { stdout: false, stderr: false } };
        collected = await client.follow(hostId, {
          ...(opts.signal ? { signal: opts.signal } : {}),
          onEvent: (event) => {
            if (event.type !== "stdout" && event.type !== "stderr") return;
            const stream = event.type;
            if (out.bytes[stream] + event.line.length + 1 > maxOutput) {
              out.cut[stream] = true;
              return;
            }
            out.bytes[stream] += event.line.length + 1;
            out[stream].push(event.line);
          },
        });
        if (collected.type === "failed") {
          throw new SmithersSandboxError(collected.error.code, `the sandbox host failed to run the command: ${collected.error.message}`, { details: collected.error.details ?? null });
        }
        if (collected.type === "cancelled") {
          throw new SmithersSandboxError(ErrorCodes.PROCESS_ABORTED, "the command was cancelled on the host before it ran");
        }
        const outcome = collected.outcome;
        const stderr = out.stderr.join("\n") + (out.cut.stderr ? `\n[smithers-sandbox: stderr cut at ${maxOutput} bytes]` : "");
        const termination = outcome.termination ?? "exited";
        const exitCode = typeof outcome.exitCode === "number" ? outcome.exitCode : termination === "exited" ? 0 : 1;
        return {
          exitCode,
          stdout: out.stdout.join("\n"),
          stderr: termination === "exited" ? stderr : `${stderr}\n[smithers-sandbox: the command ended by ${termination}]`.trim(),
        };
      },
      async destroy() {
        if (hostId !== undefined) await client.delete(hostId);
      },
    };
    return session;
  };
}
