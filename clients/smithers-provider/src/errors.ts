/**
 * The one error type this package throws. `code` is a stable code of the smithers-sandbox error
 * set (the same strings the host answers with: INVALID_INPUT, TOOL_PATH_ESCAPE,
 * SANDBOX_EXECUTION_FAILED, PROCESS_ABORTED, TASK_RUNTIME_UNAVAILABLE, ...), so callers branch
 * on `error.code`, never on the message.
 */
export class SmithersSandboxError extends Error {
  readonly code: string;
  readonly details: unknown;
  /** The HTTP status of the host's answer, when the error is one. */
  readonly httpStatus: number | undefined;

  constructor(
    code: string,
    message: string,
    options: { details?: unknown; httpStatus?: number; cause?: unknown } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "SmithersSandboxError";
    this.code = code;
    this.details = options.details ?? null;
    this.httpStatus = options.httpStatus;
  }
}

/** Codes this package produces on its own (the host's codes are passed through as they are). */
export const ErrorCodes = {
  INVALID_INPUT: "INVALID_INPUT",
  TOOL_PATH_ESCAPE: "TOOL_PATH_ESCAPE",
  SANDBOX_EXECUTION_FAILED: "SANDBOX_EXECUTION_FAILED",
  PROCESS_ABORTED: "PROCESS_ABORTED",
  TASK_RUNTIME_UNAVAILABLE: "TASK_RUNTIME_UNAVAILABLE",
  /** The host's NOT_FOUND: an unknown sandbox, or (a held session's `readFile`) a missing file. */
  NOT_FOUND: "NOT_FOUND",
  /** A session that cannot do it now (a checkpoint while a command works in the workspace). */
  BUSY: "BUSY",
} as const;

/** The message of anything thrown, with the chain of causes (fetch hides the useful part there). */
export function describeError(error: unknown): string {
  const parts: string[] = [];
  let current: unknown = error;
  for (let depth = 0; current !== undefined && current !== null && depth < 5; depth++) {
    if (current instanceof Error) {
      const code = (current as { code?: unknown }).code;
      parts.push(typeof code === "string" && !current.message.includes(code) ? `${current.message} (${code})` : current.message);
      current = current.cause;
    } else {
      parts.push(String(current));
      break;
    }
  }
  return parts.join(": ");
}
