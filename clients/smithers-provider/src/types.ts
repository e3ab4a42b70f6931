/**
 * The provider contract of `@smithers-orchestrator/sandbox` 0.32.0 (`src/SandboxProvider.ts`),
 * restated so this package needs no runtime dependency on it. The request is typed loosely
 * where this provider does not read a field (workflow, executeChildWorkflow), so the real
 * package's request type is assignable to it and this provider is assignable to its
 * `SandboxProvider`.
 */

export type SandboxBundleStatus = "finished" | "failed" | "cancelled";

export type SandboxProviderRequest = {
  runId: string;
  sandboxId: string;
  input?: unknown;
  rootDir: string;
  requestBundlePath: string;
  resultBundlePath: string;
  workflow?: unknown;
  parentWorkflow?: unknown;
  executeChildWorkflow?: unknown;
  allowNetwork: boolean;
  maxOutputBytes: number;
  toolTimeoutMs: number;
  egress?: unknown;
  config: Record<string, unknown>;
  signal?: AbortSignal;
  heartbeat: (data?: unknown) => void;
};

/** The `{ bundlePath }` form of the real package's `SandboxProviderResult`. */
export type SandboxProviderBundleResult = {
  bundlePath: string;
  remoteRunId?: string;
  workspaceId?: string;
  containerId?: string;
};

export type SandboxProvider = {
  id: string;
  run: (request: SandboxProviderRequest) => Promise<SandboxProviderBundleResult> | SandboxProviderBundleResult;
  cleanup?: (request: SandboxProviderRequest) => Promise<void> | void;
};
