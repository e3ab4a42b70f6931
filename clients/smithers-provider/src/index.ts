export { createSmithersSandboxProvider, controlsFor, stepCommandFor, parseSize, DEFAULT_PROVIDER_ID, DEFAULT_SANDBOX_COMMAND } from "./provider.js";
export type { SmithersSandboxProvider, SmithersSandboxProviderOptions } from "./provider.js";
export { SandboxHostClient, ENV_API_KEY, ENV_API_URL } from "./client.js";
export type {
  Controls,
  CreateSandbox,
  ExecBody,
  ExecOutcome,
  ExecuteAccepted,
  HostClientOptions,
  HostErrorReport,
  ResultInfo,
  RetryPolicy,
  SandboxInfo,
  SandboxState,
  StepCommand,
  TerminalEvent,
  WireEvent,
  WorkspaceUploaded,
} from "./client.js";
export { SmithersSandboxError, ErrorCodes } from "./errors.js";
export { packTree, unpackTar, BUNDLE_LIMITS } from "./tar.js";
export type { PackOptions, PackStats, UnpackLimits, UnpackStats } from "./tar.js";
export type { SandboxProvider, SandboxProviderBundleResult, SandboxProviderRequest, SandboxBundleStatus } from "./types.js";
export { selectUpload, workflowDatabasePath, SMITHERS_DB_NAMES } from "./upload.js";
export type { UploadOptions, UploadSelection } from "./upload.js";
export { keepChangesOnce, readManifest } from "./bundle.js";
export { sandboxSettings, STEP_SETTINGS_KEY, STEP_SETTING_NAMES } from "./settings.js";
export type { SmithersSandboxStepSettings } from "./settings.js";
export { STDERR_TAIL_BYTES } from "./failure.js";
export { EgressDecisions } from "./egress.js";
export type { EgressBeat, EgressTotals } from "./egress.js";
export type { SingleSourceReport } from "./bundle.js";
export { holdForReview, waitForDecision, reviewBin } from "./review.js";
export type { DurableReviewOptions, ReviewDecision, Held } from "./review.js";
export { createSmithersSandboxSession, KIT_REQUEST_FILE, KIT_RESULT_FILE } from "./session.js";
export type { SandboxExecOptions, SandboxExecResult, SandboxSession, SmithersSandboxSessionOptions } from "./session.js";
export { openSession, sessionIdsFor, FrameDecoder, DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_WORKDIR, MAX_FRAME_BYTES, MAX_STDIN_BYTES } from "./held.js";
export type { OpenSessionOptions, Session, SpawnOptions, SpawnResult, Termination } from "./held.js";
