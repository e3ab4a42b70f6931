/**
 * Per-step settings of this provider, from a workflow.
 *
 * Smithers 0.32 builds the `config` a provider receives from nine props of `<Sandbox>` only
 * (`image, env, egress, ports, volumes, memoryLimit, cpuLimit, command, workspace`;
 * `@smithers-orchestrator/graph/src/dom/extract.js`): it has no `config` prop, and anything else
 * on the element is dropped. Of the nine, `workspace` is the one object it hands to a provider
 * as it is (the engine normalises it only for its own local transports; its type,
 * `SandboxWorkspaceSpec`, names a persistent workspace, which no runtime of a smithers-sandbox
 * host offers: the host refuses it). So a step's settings travel there, under one key:
 *
 * ```tsx
 * <Sandbox provider="smithers-sandbox" workspace={sandboxSettings({ timeoutMs: 60_000, cwd: "/workspace/app" })} … />
 * ```
 *
 * `sandboxSettings` returns `{ name, smithersSandbox: {...} }` (the `name` keeps it a
 * `SandboxWorkspaceSpec` for TypeScript); `workspace={{ smithersSandbox: {...} }}` works as
 * well. Smithers records the whole `workspace` in its `SandboxCreated` event, so the settings
 * a step ran with are in the run's history. A workspace carrying settings is never forwarded
 * to the host as a workspace; one without them is, as before.
 *
 * The same settings may be given at the top of `config` by a direct `executeSandbox` caller
 * (`config.timeoutMs`, ...); the workspace's win. Unknown keys are refused, never dropped: a
 * misspelt `timeout` must not leave a step without its bound.
 */

import { ErrorCodes, SmithersSandboxError } from "./errors.js";

/** The key of `workspace` that holds this provider's settings. */
export const STEP_SETTINGS_KEY = "smithersSandbox";

/** What a step may set for itself (each also an option of the provider, for every step). */
export type SmithersSandboxStepSettings = {
  /** The whole step's timeout on the host, in ms (bounded by `serve --max-timeout`). */
  timeoutMs?: number;
  /** The network the step may reach: a smithers-sandbox egress policy ({mode?, allow, deny}). */
  egressPolicy?: Record<string, unknown>;
  /** Bytes the step may write to its workspace and /tmp (`"1g"`, or a byte count). */
  diskLimit?: string | number;
  /** Processes and threads the step may have at once. */
  pidsLimit?: number;
  /** The step's working directory inside the sandbox (default `/workspace`). */
  cwd?: string;
};

export const STEP_SETTING_NAMES = ["timeoutMs", "egressPolicy", "diskLimit", "pidsLimit", "cwd"] as const;

/** Keys of a `SandboxWorkspaceSpec` that mean a persistent workspace; none may ride with settings. */
const WORKSPACE_SPEC_KEYS = ["snapshotId", "idleTimeoutSecs", "persistence"];

export function invalid(control: string, reason: string): SmithersSandboxError {
  return new SmithersSandboxError(ErrorCodes.INVALID_INPUT, `invalid sandbox config ${control}: ${reason}`, { details: { control } });
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** A `512m`-style size (binary multiples; `b`, `k`, `m`, `g`, `t`, optional `b`/`ib`), or a byte count. */
export function parseSize(control: string, value: unknown): number {
  if (typeof value === "number") {
    if (!Number.isFinite(value) || value < 1) throw invalid(control, `must be a positive size, got ${value}`);
    return Math.floor(value);
  }
  if (typeof value !== "string") throw invalid(control, `must be a size such as "512m", got ${typeof value}`);
  const m = /^\s*(\d+(?:\.\d+)?|\.\d+)\s*([a-z]*)\s*$/i.exec(value);
  const units: Record<string, number> = { "": 1, b: 1, k: 2 ** 10, kb: 2 ** 10, kib: 2 ** 10, m: 2 ** 20, mb: 2 ** 20, mib: 2 ** 20, g: 2 ** 30, gb: 2 ** 30, gib: 2 ** 30, t: 2 ** 40, tb: 2 ** 40, tib: 2 ** 40 };
  const multiplier = m ? units[m[2]!.toLowerCase()] : undefined;
  if (!m || multiplier === undefined) throw invalid(control, `unrecognised size ${JSON.stringify(value)} (expected e.g. 512m, 2g)`);
  const bytes = Number(m[1]) * multiplier;
  if (!Number.isFinite(bytes) || bytes < 1 || bytes > Number.MAX_SAFE_INTEGER) throw invalid(control, `size ${JSON.stringify(value)} out of range`);
  return Math.floor(bytes);
}

export function positiveNumber(control: string, value: unknown): number {
  const n = typeof value === "string" ? Number(value.trim()) : value;
  if (typeof n !== "number" || !Number.isFinite(n) || n <= 0) throw invalid(control, `must be a positive number, got ${JSON.stringify(value)}`);
  return n;
}

/** Checks each setting's type (the host checks its ceilings); throws INVALID_INPUT naming it. */
function checkSetting(name: string, value: unknown): void {
  if (value === undefined || value === null) return;
  switch (name) {
    case "timeoutMs":
      positiveNumber("timeoutMs", value);
      return;
    case "pidsLimit":
      if (!Number.isInteger(positiveNumber("pidsLimit", value))) throw invalid("pidsLimit", "must be a whole number");
      return;
    case "diskLimit":
      parseSize("diskLimit", value);
      return;
    case "cwd":
      if (typeof value !== "string" || !value.startsWith("/") || value.includes("\0")) throw invalid("cwd", "must be an absolute path inside the sandbox (e.g. /workspace/app)");
      return;
    case "egressPolicy":
      if (!isPlainObject(value)) throw invalid("egressPolicy", "must be a policy object ({mode?, allow: [...], deny: [...]})");
      return;
    default:
      throw invalid(name, "is not a setting of the smithers-sandbox provider");
  }
}

function checkSettings(settings: Record<string, unknown>, where: string): void {
  const unknown = Object.keys(settings).filter((k) => !(STEP_SETTING_NAMES as readonly string[]).includes(k));
  if (unknown.length > 0) {
    throw new SmithersSandboxError(
      ErrorCodes.INVALID_INPUT,
      `invalid sandbox config ${where}: unknown setting(s) ${unknown.map((k) => JSON.stringify(k.slice(0, 100))).slice(0, 10).join(", ")}; the smithers-sandbox provider takes ${STEP_SETTING_NAMES.join(", ")}`,
      { details: { control: where, unknown: unknown.slice(0, 10).map((k) => k.slice(0, 100)) } },
    );
  }
  for (const [name, value] of Object.entries(settings)) checkSetting(name, value);
}

/**
 * The value of a `<Sandbox workspace={...}>` prop carrying this step's settings to the
 * provider (see the module comment). Checked now, so a wrong setting fails where it is written.
 */
export function sandboxSettings(settings: SmithersSandboxStepSettings): { name: string; smithersSandbox: SmithersSandboxStepSettings } {
  if (!isPlainObject(settings)) throw invalid("workspace", "sandboxSettings takes an object of settings");
  checkSettings(settings, `workspace.${STEP_SETTINGS_KEY}`);
  return { name: "smithers-sandbox-settings", [STEP_SETTINGS_KEY]: { ...settings } } as { name: string; smithersSandbox: SmithersSandboxStepSettings };
}

/**
 * A request config's step settings (the top-level ones, overridden by the workspace's) and
 * the workspace to forward to the host (none when the workspace carried settings).
 */
export function stepSettingsOf(config: Record<string, unknown>): { settings: Record<string, unknown>; workspace: unknown } {
  const settings: Record<string, unknown> = {};
  for (const name of STEP_SETTING_NAMES) {
    if (config[name] !== undefined && config[name] !== null) settings[name] = config[name];
  }
  const workspace = config.workspace;
  if (!isPlainObject(workspace) || !Object.prototype.hasOwnProperty.call(workspace, STEP_SETTINGS_KEY)) {
    return { settings, workspace };
  }
  const own = workspace[STEP_SETTINGS_KEY];
  if (!isPlainObject(own)) throw invalid(`workspace.${STEP_SETTINGS_KEY}`, "must be an object of settings (see sandboxSettings)");
  const spec = WORKSPACE_SPEC_KEYS.filter((k) => workspace[k] !== undefined);
  if (spec.length > 0) {
    throw invalid("workspace", `a workspace carrying smithers-sandbox settings cannot also ask for a persistent workspace (${spec.join(", ")}); the host has none`);
  }
  checkSettings(own, `workspace.${STEP_SETTINGS_KEY}`);
  for (const [name, value] of Object.entries(own)) {
    if (value !== undefined && value !== null) settings[name] = value;
  }
  return { settings, workspace: undefined };
}
