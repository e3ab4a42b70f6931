/**
 * `createSmithersSandboxProvider`: a Smithers `SandboxProvider` whose steps run on a
 * smithers-sandbox host (`smithers-sandbox serve`).
 *
 * One `run(request)`:
 *
 * 1. `POST /v1/sandboxes` with the controls taken from the request (allowNetwork,
 *    maxOutputBytes), its `config` (env, memoryLimit, cpuLimit, ports, image) and the step's
 *    settings (timeoutMs, egressPolicy, diskLimit, pidsLimit, cwd: from
 *    `config.workspace.smithersSandbox`, see `settings.ts`, else the provider's options);
 * 2. `PUT …/workspace`: `rootDir` as a gzip tar streamed from disk, without `.smithers/` (the
 *    project's own state, as the Rust client) — `.git/` is included unless `includeGit: false`;
 * 3. `PUT …/request`: `{status: "pending", runId, sandboxId, provider, runtime, input}`, which
 *    the step reads at `$SMITHERS_SANDBOX_REQUEST_PATH`;
 * 4. `POST …/execute` with an Idempotency-Key: the command of `config.command`, else the
 *    provider's `command` option, else `smithers up bundle.tsx` (a string runs as
 *    `/bin/sh -c <string>`, an array is the argv);
 * 5. `GET …/events` (SSE) until the step ends, turned into `heartbeat({sandboxId, stage,
 *    progress, ...})` calls (the egress engine's decisions among them, see `egress.ts`);
 *    aborting `signal` cancels the step on the host, which still collects its bundle (status
 *    `cancelled`);
 * 6. `GET …/bundle` unpacked, confined, into `resultBundlePath`; returns
 *    `{ bundlePath, remoteRunId, workspaceId }` for `executeSandbox` to validate and review.
 *    Only a `finished` bundle is returned: any other is moved aside (`<resultBundlePath>-failed`)
 *    and `run` throws SANDBOX_EXECUTION_FAILED (PROCESS_ABORTED when `signal` cancelled it)
 *    saying how the step ended, so Smithers applies none of its changes (see `failure.ts`).
 *
 * `cleanup(request)` deletes the sandbox on the host (idempotent). Errors are
 * {@link SmithersSandboxError}s with the host's stable `code`.
 */

import { cp, rename, rm, stat } from "node:fs/promises";

import { abortedError, ENV_API_KEY, ENV_API_URL, SandboxHostClient } from "./client.js";
import type { Controls, CreateSandbox, RetryPolicy, StepCommand, WireEvent } from "./client.js";
import { describeError, ErrorCodes, SmithersSandboxError } from "./errors.js";
import { keepChangesOnce, readManifest } from "./bundle.js";
import type { SingleSourceReport } from "./bundle.js";
import { EgressDecisions } from "./egress.js";
import { longest, redactor, resultRejection, StderrTail, stepFailure } from "./failure.js";
import { invalid, parseSize, positiveNumber, stepSettingsOf } from "./settings.js";
import { holdForReview, waitForDecision } from "./review.js";
import type { DurableReviewOptions } from "./review.js";
import { selectUpload, workflowDatabasePath } from "./upload.js";
import type { UploadSelection } from "./upload.js";
import type { SandboxProvider, SandboxProviderBundleResult, SandboxProviderRequest } from "./types.js";

/** What a step runs when neither its config nor the provider names a command (as in Smithers). */
export const DEFAULT_SANDBOX_COMMAND = "smithers up bundle.tsx";
export const DEFAULT_PROVIDER_ID = "smithers-sandbox";

export type SmithersSandboxProviderOptions = {
  /** The provider id steps name (`provider: "smithers-sandbox"`). */
  id?: string;
  /** Base URL of the host; default `$CODEPLANE_API_URL`. */
  url?: string;
  /** Bearer token (the host's SMITHERS_SANDBOX_TOKEN); default `$CODEPLANE_API_KEY`. */
  token?: string;
  /** The command when a step's `config.command` does not name one. */
  command?: string | string[];
  /** Working directory inside the sandbox (default `/workspace`); a step's `cwd` setting wins. */
  cwd?: string;
  /** Environment of every step; a step's `config.env` is merged over it. */
  env?: Record<string, string>;
  /** The egress policy of every step ({mode?, allow, deny}: see `smithers-sandbox egress
   * check`); a step's `egressPolicy` setting replaces it. The host confines it to its own. */
  egressPolicy?: Record<string, unknown>;
  /**
   * The hosts each of Smithers' `egress.secretBindings` (variable name → value) is bound to:
   * variable name → hosts. The step's variable holds a placeholder of the value's shape; the
   * host's egress engine swaps the value in only in HTTPS requests to those hosts (each
   * allowed on 443 by the binding) and swaps it out of everything they answer. A binding
   * with no hosts here is refused: bound to no host (or to every allowed one) a key is one
   * prompt away from a leak.
   */
  secretHosts?: Record<string, string[]>;
  /** Bytes every step may write (`"1g"` or a count); a step's `diskLimit` setting wins. */
  diskLimit?: string | number;
  /** Processes and threads every step may have at once; a step's `pidsLimit` setting wins. */
  pidsLimit?: number;
  /** Upload `.git/` with the workspace (default true: steps need it). */
  includeGit?: boolean;
  /** Leave out what git ignores (default true). See `upload.ts` for everything left out. */
  honourGitignore?: boolean;
  /** Smithers' database, when it is not a `smithers.db` in the tree (default `$SMITHERS_DB`): never uploaded. */
  databasePath?: string;
  /**
   * The whole step's timeout on the host, in milliseconds. A step's `timeoutMs` setting wins.
   * Neither set: the host's ceiling (`serve --max-timeout`). Smithers' `toolTimeoutMs` (60 s by
   * default) bounds one tool call of an agent, not a sandboxed step, and is not used here.
   */
  timeoutMs?: number;
  /**
   * A sandbox of the same `runId:sandboxId` already on the host (a run resumed after its
   * client died before cleanup): `"replace"` it (default; it is cancelled and removed, and
   * its bundle was never applied) or `"refuse"` (409).
   */
  ifExists?: "replace" | "refuse";
  /**
   * Hold a step's changes in the project's smithers-sandbox review until a person accepts or
   * rejects them (`smithers-sandbox accept <runId>:<sandboxId>`), instead of Smithers' gate,
   * which fails closed without a pre-approval: see `review.ts`. The `<Sandbox>` then needs
   * `autoAcceptDiffs` (the person's accept is the approval). `true` uses the defaults.
   */
  durableReview?: boolean | DurableReviewOptions;
  /** gzip level of the workspace upload (default 1: fast; 0 stores, for a host on loopback; 9 for a slow link). */
  gzipLevel?: number;
  requestTimeoutMs?: number;
  eventIdleTimeoutMs?: number;
  retry?: Partial<RetryPolicy>;
  /**
   * Shortest interval between liveness heartbeats sent for output lines and keep-alives of a
   * running step (default 5000 ms). State changes and the step's own heartbeats are always sent.
   */
  livenessIntervalMs?: number;
  /** Every event of the host's stream (stdout/stderr lines, states, the outcome), as it arrives. */
  onEvent?: (event: WireEvent, context: { runId: string; sandboxId: string; hostId: string }) => void;
};

type Active = { client: SandboxHostClient; hostId: string };

function env(name: string): string | undefined {
  const value = process.env[name];
  return value !== undefined && value.trim() !== "" ? value : undefined;
}

function unsupported(control: string, reason: string): SmithersSandboxError {
  return new SmithersSandboxError(
    ErrorCodes.TASK_RUNTIME_UNAVAILABLE,
    `the smithers-sandbox provider cannot enforce ${control}: ${reason}`,
    { details: { runtime: "smithers-sandbox", control } },
  );
}

export { parseSize };

function stringRecord(control: string, value: unknown): Record<string, string> {
  if (value === undefined || value === null) return {};
  if (typeof value !== "object" || Array.isArray(value)) throw invalid(control, "must be an object of strings");
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(value)) {
    if (typeof v !== "string") throw invalid(control, `value of ${k} must be a string`);
    out[k] = v;
  }
  return out;
}

/**
 * The host's controls for one request: the execution options, then the step's config and its
 * settings (`config.workspace.smithersSandbox`, see `settings.ts`).
 */
export function controlsFor(
  request: SandboxProviderRequest,
  options: SmithersSandboxProviderOptions = {},
): { controls: Controls; image?: string; secretValues?: Record<string, string> } {
  const config = request.config ?? {};
  const { settings: step, workspace } = stepSettingsOf(config);
  const controls: Controls = { allowNetwork: request.allowNetwork === true };
  if (typeof request.maxOutputBytes === "number" && Number.isFinite(request.maxOutputBytes) && request.maxOutputBytes > 0) {
    controls.maxOutputBytes = Math.floor(request.maxOutputBytes);
  }
  // The step's own timeout: its setting, else the provider's. Not request.toolTimeoutMs: that
  // is the engine's bound on one tool call (60 s by default), and a build or an agent's whole
  // session inside the sandbox is no tool call.
  const timeout = step.timeoutMs ?? options.timeoutMs;
  if (timeout !== undefined && timeout !== null) {
    const ms = positiveNumber("timeoutMs", timeout);
    controls.timeoutMs = Math.ceil(ms);
  }
  const mergedEnv = { ...stringRecord("env", options.env), ...stringRecord("env", config.env) };
  if (Object.keys(mergedEnv).length > 0) controls.env = mergedEnv;
  if (config.memoryLimit !== undefined) controls.memoryLimitBytes = parseSize("memoryLimit", config.memoryLimit);
  const diskLimit = step.diskLimit ?? options.diskLimit;
  if (diskLimit !== undefined && diskLimit !== null) controls.diskLimitBytes = parseSize("diskLimit", diskLimit);
  if (config.cpuLimit !== undefined) controls.cpuLimit = positiveNumber("cpuLimit", config.cpuLimit);
  const pidsLimit = step.pidsLimit ?? options.pidsLimit;
  if (pidsLimit !== undefined && pidsLimit !== null) {
    const p = positiveNumber("pidsLimit", pidsLimit);
    if (!Number.isInteger(p)) throw invalid("pidsLimit", "must be a whole number");
    controls.pidsLimit = p;
  }
  if (config.ports !== undefined) {
    if (!Array.isArray(config.ports)) throw invalid("ports", "must be an array of {host, container}");
    controls.ports = config.ports.map((p: unknown) => {
      const port = p as { host?: unknown; container?: unknown };
      if (!Number.isInteger(port?.host) || !Number.isInteger(port?.container)) throw invalid("ports", "each port needs integer host and container");
      return { host: port.host as number, container: port.container as number };
    });
  }
  if (workspace !== undefined && workspace !== null) controls.workspace = workspace;
  const egressPolicy = step.egressPolicy ?? options.egressPolicy;
  if (egressPolicy !== undefined && egressPolicy !== null) {
    if (typeof egressPolicy !== "object" || Array.isArray(egressPolicy)) {
      throw invalid("egressPolicy", "must be a policy object ({mode?, allow: [...], deny: [...]})");
    }
    if (request.allowNetwork === true) {
      throw invalid("egressPolicy", "allowNetwork shares the host's whole network, so a policy would mean nothing: choose one");
    }
    controls.egressPolicy = egressPolicy as Record<string, unknown>;
  }
  if (Array.isArray(config.volumes) && config.volumes.length > 0) {
    throw unsupported("volumes", "paths of this machine do not exist on the remote sandbox host");
  }
  const secretValues = secretsFor(request, controls, options);
  let image: string | undefined;
  if (config.image !== undefined) {
    if (typeof config.image !== "string") throw invalid("image", "must be a string");
    image = config.image;
  }
  return { controls, ...(image === undefined ? {} : { image }), ...(secretValues === undefined ? {} : { secretValues }) };
}

/** Whether secrets' values may be sent to the host at `url`: https, or http to this machine's loopback. */
export function carriesSecretsSafely(url: string): boolean {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return false;
  }
  const host = parsed.hostname.replace(/^\[|\]$/g, "");
  const loopback = host === "localhost" || /^127\.\d+\.\d+\.\d+$/.test(host) || host === "::1";
  return parsed.protocol === "https:" || (parsed.protocol === "http:" && loopback);
}

/**
 * Smithers' `egress` config as the host takes it: its `secretBindings` become the controls'
 * `secrets` (each bound to the hosts `options.secretHosts` names, allowed on 443 in the
 * policy, as `run --secret` does) and their values the create's `secretValues` (base64);
 * anything else in it (proxies, CA certificates, proxy variables) is refused, never dropped.
 */
function secretsFor(request: SandboxProviderRequest, controls: Controls, options: SmithersSandboxProviderOptions): Record<string, string> | undefined {
  const config = request.config ?? {};
  // Both places Smithers may put it are checked: nothing in either is dropped unread.
  const sources = [request.egress, config.egress === false || config.egress === null ? undefined : config.egress].filter((e) => e !== undefined);
  if (sources.length === 0) return undefined;
  for (const raw of sources) {
    if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw invalid("egress", "must be an object");
    const { secretBindings: _bindings, ...rest } = raw as Record<string, unknown>;
    if (Object.values(rest).some((v) => v !== undefined)) {
      throw unsupported("egress", "egress proxying and CA certificates are not forwarded to the sandbox host (only secretBindings are, with the provider's secretHosts)");
    }
  }
  const given = sources.map((e) => (e as Record<string, unknown>).secretBindings).filter((b) => b !== undefined && b !== null);
  if (given.length > 1 && JSON.stringify(given[0]) !== JSON.stringify(given[1])) {
    throw invalid("egress.secretBindings", "the request's egress and its config's egress bind different secrets: give them in one place");
  }
  const secretBindings = given[0];
  if (secretBindings !== undefined && secretBindings !== null && (typeof secretBindings !== "object" || Array.isArray(secretBindings))) {
    throw invalid("egress.secretBindings", "must be an object of variable names to values");
  }
  const bindings = (secretBindings ?? {}) as Record<string, unknown>;
  if (Object.values(bindings).some((v) => typeof v !== "string" || v === "")) {
    throw invalid("egress.secretBindings", "each binding's value must be a non-empty string");
  }
  const names = Object.keys(bindings);
  if (names.length === 0) return undefined;
  if (controls.allowNetwork === true) {
    throw invalid("egress.secretBindings", "allowNetwork shares the host's whole network, where no secret can be held to its hosts: use an egressPolicy instead");
  }
  const policy = structuredClone(controls.egressPolicy ?? { allow: [] }) as { allow?: unknown };
  const allow = Array.isArray(policy.allow) ? policy.allow : [];
  const secrets: Array<{ name: string; hosts: string[] }> = [];
  const values: Record<string, string> = {};
  for (const name of names.sort()) {
    // Binding names are sensitive to Smithers too: this provider's errors say how many,
    // never which (the host's own refusals, e.g. of a value's shape, name the variable).
    const hosts = options.secretHosts?.[name];
    if (!Array.isArray(hosts) || hosts.length === 0 || !hosts.every((h) => typeof h === "string" && h.trim() !== "")) {
      throw invalid("egress.secretBindings", `a binding (of ${names.length}) has no hosts in the provider's secretHosts: each secret is swapped in only for the hosts named there`);
    }
    secrets.push({ name, hosts: [...hosts] });
    values[name] = Buffer.from(bindings[name] as string, "utf8").toString("base64");
    for (const host of hosts) allow.push({ host, ports: [443] });
  }
  policy.allow = allow;
  controls.egressPolicy = policy as Record<string, unknown>;
  controls.secrets = secrets;
  return values;
}

function commandFrom(value: unknown, what: string): string[] | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value === "string") {
    return value.trim().length === 0 ? undefined : ["/bin/sh", "-c", value];
  }
  if (Array.isArray(value) && value.length > 0 && value.every((a) => typeof a === "string") && value[0] !== "") {
    return value as string[];
  }
  throw invalid(what, "must be a non-empty string (run by /bin/sh -c) or a non-empty array of strings (the argv)");
}

/**
 * The step's command: `config.command`, else the provider's, else Smithers' default; in the
 * step's `cwd` setting, else the provider's.
 */
export function stepCommandFor(request: SandboxProviderRequest, options: SmithersSandboxProviderOptions = {}): StepCommand {
  const config = request.config ?? {};
  const argv = commandFrom(config.command, "command") ?? commandFrom(options.command, "command") ?? ["/bin/sh", "-c", DEFAULT_SANDBOX_COMMAND];
  const { settings } = stepSettingsOf(config);
  const cwd = typeof settings.cwd === "string" && settings.cwd !== "" ? settings.cwd : options.cwd;
  return cwd === undefined ? { argv } : { argv, cwd };
}

/**
 * The host client of the options' `url`/`token` (default `$CODEPLANE_API_URL` /
 * `$CODEPLANE_API_KEY`); a missing one is TASK_RUNTIME_UNAVAILABLE naming it. Shared by the
 * provider and the kit session.
 */
export function hostClientFor(
  options: Pick<SmithersSandboxProviderOptions, "url" | "token" | "requestTimeoutMs" | "eventIdleTimeoutMs" | "retry">,
  runtime: string,
): SandboxHostClient {
  const url = options.url ?? env(ENV_API_URL);
  const token = options.token ?? env(ENV_API_KEY);
  if (url === undefined || token === undefined) {
    const missing = url === undefined ? ENV_API_URL : ENV_API_KEY;
    throw new SmithersSandboxError(ErrorCodes.TASK_RUNTIME_UNAVAILABLE, `${missing} is not set (and no ${url === undefined ? "url" : "token"} option was given)`, {
      details: { runtime, fix: `set ${ENV_API_URL} to the sandbox host's URL and ${ENV_API_KEY} to its token` },
    });
  }
  return new SandboxHostClient({
    url,
    token,
    ...(options.requestTimeoutMs !== undefined ? { requestTimeoutMs: options.requestTimeoutMs } : {}),
    ...(options.eventIdleTimeoutMs !== undefined ? { eventIdleTimeoutMs: options.eventIdleTimeoutMs } : {}),
    ...(options.retry !== undefined ? { retry: options.retry } : {}),
  });
}

/** What of `request.rootDir` is uploaded under these options (see `upload.ts`). */
export function uploadSelectionFor(
  request: SandboxProviderRequest,
  options: Pick<SmithersSandboxProviderOptions, "includeGit" | "honourGitignore" | "databasePath">,
): UploadSelection {
  return selectUpload(request.rootDir, {
    ...(options.includeGit !== undefined ? { includeGit: options.includeGit } : {}),
    ...(options.honourGitignore !== undefined ? { honourGitignore: options.honourGitignore } : {}),
    ...(options.databasePath !== undefined ? { databasePath: options.databasePath } : {}),
    databasePaths: [workflowDatabasePath(request)].filter((p): p is string => p !== undefined),
  });
}

/** A {@link SandboxProvider} whose `run` and `cleanup` are always asynchronous. */
export type SmithersSandboxProvider = {
  id: string;
  run: (request: SandboxProviderRequest) => Promise<SandboxProviderBundleResult>;
  cleanup: (request: SandboxProviderRequest) => Promise<void>;
};

export function createSmithersSandboxProvider(options: SmithersSandboxProviderOptions = {}): SmithersSandboxProvider {
  const id = (options.id ?? DEFAULT_PROVIDER_ID).trim();
  if (id === "") {
    throw new SmithersSandboxError(ErrorCodes.INVALID_INPUT, "the smithers-sandbox provider needs a non-empty id");
  }
  // Validated once here: a bad URL fails when the provider is made, not in the middle of a run.
  const client = hostClientFor(options, id);
  const livenessMs = options.livenessIntervalMs ?? 5000;
  const active = new Map<string, Active>();
  const keyOf = (r: { runId: string; sandboxId: string }) => `${r.runId}:${r.sandboxId}`;

  async function run(request: SandboxProviderRequest): Promise<SandboxProviderBundleResult> {
    const { signal } = request;
    const beat = (stage: string, progress: number, extra: Record<string, unknown> = {}) => {
      try {
        request.heartbeat?.({ sandboxId: request.sandboxId, stage, progress, provider: id, ...extra });
      } catch {
        // A heartbeat sink that throws must not fail the step.
      }
    };
    if (signal?.aborted) throw abortedError("the sandbox step", signal.reason);
    const rootInfo = await stat(request.rootDir).catch((error: unknown) => {
      throw invalid("rootDir", `cannot read ${request.rootDir}: ${describeError(error)}`);
    });
    if (!rootInfo.isDirectory()) throw invalid("rootDir", `${request.rootDir} is not a directory`);
    const { controls, image, secretValues } = controlsFor(request, options);
    if (secretValues !== undefined && !carriesSecretsSafely(client.baseUrl)) {
      throw invalid("egress.secretBindings", "the sandbox host is plain http on another machine: a secret's value is sent only over https, or to this machine's loopback");
    }
    const command = stepCommandFor(request, options);
    const key = keyOf(request);
    if (active.has(key)) {
      throw new SmithersSandboxError(ErrorCodes.INVALID_INPUT, `sandbox ${key} is already in use by this provider (running, or not cleaned up yet: call cleanup(request))`, {
        details: { runId: request.runId, sandboxId: request.sandboxId },
      });
    }

    const selection = uploadSelectionFor(request, options);
    const body: CreateSandbox = {
      runId: request.runId,
      sandboxId: request.sandboxId,
      controls,
      ifExists: options.ifExists ?? "replace",
      ...(image !== undefined ? { image } : {}),
      ...(secretValues !== undefined ? { secretValues } : {}),
    };
    const info = await client.create(body, signal);
    const hostId = info.id;
    // From here on cleanup(request) removes the sandbox from the host, whatever happens next.
    active.set(key, { client, hostId });
    beat("remote-created", 41, { hostId, runtime: info.runtime });

    // Packing a large tree takes a while: keep the task's heartbeat alive meanwhile.
    let lastUploadBeat = Date.now();
    const uploaded = await client.uploadWorkspace(hostId, request.rootDir, {
      skipTop: selection.skipTop,
      skipAnywhere: selection.skipAnywhere,
      skipPaths: selection.skipPaths,
      ...(options.gzipLevel !== undefined ? { gzipLevel: options.gzipLevel } : {}),
      ...(signal ? { signal } : {}),
      onProgress: (stats) => {
        const now = Date.now();
        if (now - lastUploadBeat >= livenessMs) {
          lastUploadBeat = now;
          beat("workspace-uploading", 42, { hostId, entries: stats.entries, bytes: stats.bytes });
        }
      },
    });
    beat("workspace-uploaded", 43, {
      hostId,
      entries: uploaded.entries,
      bytes: uploaded.bytes,
      receivedBytes: uploaded.receivedBytes,
      skippedSpecial: uploaded.pack.skippedSpecial,
      // Left out by .gitignore or as Smithers' database: named so nothing is dropped unseen.
      skippedPaths: uploaded.pack.skippedPaths,
    });

    const requestDocument = {
      status: "pending",
      runId: request.runId,
      sandboxId: request.sandboxId,
      provider: id,
      runtime: id,
      input: request.input ?? {},
    };
    await client.putRequest(hostId, requestDocument, signal);
    beat("request-shipped", 45, { hostId });
    if (signal?.aborted) throw abortedError("the sandbox step", signal.reason);

    // Not abortable in flight: once sent the step may have started, and only the event
    // follower below (which cancels on the host) can stop it cleanly.
    await client.execute(hostId, command);
    // What the step leaves for its error, should it fail: the end of its stderr and the egress
    // engine's decisions, with the request's environment values redacted from both.
    const secrets = Object.values(controls.env ?? {});
    const redact = redactor(secrets);
    const stderr = new StderrTail(undefined, longest(secrets));
    const egress = new EgressDecisions(redact, livenessMs);
    // Smithers keeps only the latest heartbeat it is given: the egress totals ride on each.
    const withEgress = (extra: Record<string, unknown>) => (egress.seen ? { ...extra, egressTotals: { ...egress.totals } } : extra);
    let lastLiveness = 0;
    const alive = (extra: Record<string, unknown>) => {
      const now = Date.now();
      if (now - lastLiveness >= livenessMs) {
        lastLiveness = now;
        beat("remote-alive", 50, withEgress({ hostId, ...extra }));
      }
    };
    const terminal = await client.follow(hostId, {
      ...(signal ? { signal } : {}),
      onEvent: (event) => {
        try {
          options.onEvent?.(event, { runId: request.runId, sandboxId: request.sandboxId, hostId });
        } catch {
          // An observer that throws must not fail the step.
        }
        switch (event.type) {
          case "state":
            // created and shipped were reported as they happened (remote-created, request-shipped).
            if (event.state !== "created" && event.state !== "shipped") {
              beat(`remote-${String(event.state).slice(0, 32)}`, 50, withEgress({ hostId }));
            }
            break;
          case "heartbeat":
            beat("remote-heartbeat", 50, withEgress({ hostId, remoteProgress: typeof event.progress === "number" ? event.progress : null }));
            break;
          case "egress": {
            const decision = egress.take(event.record);
            if (decision !== null) beat("remote-egress", 50, { hostId, egress: decision });
            break;
          }
          case "stderr":
            if (typeof event.line === "string") stderr.push(event.line);
            alive({ stream: event.type });
            break;
          case "stdout":
            alive({ stream: event.type });
            break;
          default:
            break;
        }
      },
      onAlive: () => alive({}),
      onResume: (since, failures) => beat("remote-resumed", 50, { hostId, since, failures }),
    });
    if (terminal.type === "failed") {
      throw new SmithersSandboxError(terminal.error.code, `the sandbox host failed to run the step: ${terminal.error.message}`, {
        details: terminal.error.details ?? null,
      });
    }
    if (terminal.type === "cancelled") {
      throw abortedError("the sandbox step (cancelled on the host before it ran)");
    }
    const unsent = egress.flush();
    if (unsent !== null) beat("remote-egress", 50, { hostId, egress: unsent });
    beat("remote-completed", 75, withEgress({
      hostId,
      exitCode: terminal.outcome.exitCode ?? null,
      termination: terminal.outcome.termination ?? null,
      patchCount: terminal.result.patchCount,
    }));
    let once: SingleSourceReport = { patchFilesRemoved: 0, diffBundlePatches: 0 };
    const review = options.durableReview === true ? {} : options.durableReview === false ? undefined : options.durableReview;
    // The bundle as the host sent it, kept for the durable review (our review reads its patch
    // files; the copy handed to Smithers has only the diffBundle).
    const reviewCopy = `${request.resultBundlePath}-review`;
    const where = `sandbox ${hostId} (${request.runId}:${request.sandboxId})`;
    let held = false;
    let status = "failed";
    let rejection: string | null = null;
    const unpacked = await client.downloadBundle(hostId, request.resultBundlePath, async (staging) => {
      const manifest = await readManifest(staging, where);
      // Anything but the three statuses of the format is a failure (fail closed).
      status = manifest.status === "finished" || manifest.status === "cancelled" ? manifest.status : "failed";
      if (status !== "finished") {
        // Never handed to Smithers nor held for review (see failure.ts): only read for why.
        rejection = await resultRejection(staging);
        return;
      }
      if (review !== undefined) {
        await rm(reviewCopy, { recursive: true, force: true });
        await cp(staging, reviewCopy, { recursive: true, errorOnExist: true, force: false, verbatimSymlinks: true });
      }
      once = await keepChangesOnce(staging, where);
      held = review !== undefined && once.diffBundlePatches > 0;
    });
    if (status !== "finished") {
      // Smithers applies the diffBundle of any bundle at resultBundlePath it is handed, and
      // would apply a failed step's half-done changes: the bundle is moved aside, where a
      // person can read its log, and the step's failure is thrown instead.
      const kept = `${request.resultBundlePath}-failed`;
      let keptBundle: string | null = kept;
      try {
        await rm(kept, { recursive: true, force: true });
        await rename(request.resultBundlePath, kept);
      } catch {
        await rm(request.resultBundlePath, { recursive: true, force: true });
        keptBundle = null;
      }
      beat("bundle-downloaded", 80, { hostId, entries: unpacked.entries, bytes: unpacked.bytes, status, applied: false });
      throw stepFailure({
        status,
        provider: id,
        runId: request.runId,
        sandboxId: request.sandboxId,
        hostId,
        outcome: terminal.outcome,
        timeoutMs: controls.timeoutMs,
        rejection,
        stderr,
        redact,
        denials: egress.denials(),
        keptBundle,
        aborted: status === "cancelled" && signal?.aborted === true,
      });
    }
    beat("bundle-downloaded", 80, {
      hostId,
      entries: unpacked.entries,
      bytes: unpacked.bytes,
      patchCount: once.diffBundlePatches,
      patchFilesRemoved: once.patchFilesRemoved,
    });
    if (review !== undefined && !held) {
      await rm(reviewCopy, { recursive: true, force: true });
    } else if (review !== undefined) {
      const pending = await holdForReview(review, { rootDir: request.rootDir, runId: request.runId, sandboxId: request.sandboxId, hostId, runtime: id }, reviewCopy);
      const decide = `smithers-sandbox accept ${pending.id} --root ${request.rootDir}`;
      beat("review-pending", 85, { hostId, review: pending.id, patchCount: pending.patchCount, totalDiffLines: pending.totalDiffLines, decide });
      let lastWaiting = Date.now();
      const decision = await waitForDecision(
        review,
        request.rootDir,
        pending,
        () => {
          const now = Date.now();
          if (now - lastWaiting >= livenessMs) {
            lastWaiting = now;
            beat("review-pending", 85, { hostId, review: pending.id, decide });
          }
        },
        signal,
      );
      beat(`review-${decision.state}`, 88, { hostId, review: pending.id, reason: decision.reason });
      if (decision.state === "rejected") {
        // Nothing of it may reach the project: the copy for Smithers goes too.
        await rm(request.resultBundlePath, { recursive: true, force: true });
        // INVALID_OUTPUT: a person refused what the step produced. Smithers does not retry a
        // compute task failing with it (a retry would run the step again and ask again, as
        // often as the task's retries allow, by default without end); running it again is
        // the caller's explicit choice.
        throw new SmithersSandboxError(
          "INVALID_OUTPUT",
          `the changes of sandbox ${pending.id} were rejected in review${decision.reason ? `: ${decision.reason}` : ""}; nothing was applied`,
          { details: { review: pending.id, rejected: true, reason: decision.reason, patchCount: decision.patchCount } },
        );
      }
    }
    return { bundlePath: request.resultBundlePath, remoteRunId: hostId, workspaceId: hostId };
  }

  async function cleanup(request: SandboxProviderRequest): Promise<void> {
    const key = keyOf(request);
    const entry = active.get(key);
    if (!entry) return;
    await entry.client.delete(entry.hostId);
    active.delete(key);
  }

  // `satisfies`: checked to be a SandboxProvider exactly as the Smithers package defines it.
  return { id, run, cleanup } satisfies SandboxProvider;
}
