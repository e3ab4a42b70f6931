/**
 * The provider against the real host: `smithers-sandbox serve` ($SMITHERS_SANDBOX_BIN) on a
 * free loopback port, running steps in real native sandboxes, and the real
 * `@smithers-orchestrator/sandbox` 0.32.0 ($SMITHERS_JS_HOME) judging the bundles that come back
 * and driving the provider through its registry and `executeSandbox`.
 *
 * Without the binary, native sandboxes or the reference package the tests print SKIP; under
 * CI=true they fail.
 */

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import type { TestContext } from "node:test";

import { createSmithersSandboxProvider, SandboxHostClient } from "../src/index.js";
import { startFaultProxy } from "./faultproxy.js";
import type { SandboxProviderRequest, SmithersSandboxProviderOptions, WireEvent } from "../src/index.js";
import {
  binPath,
  enforced,
  importReference,
  nativeUnavailable,
  skipOrFail,
  smithersJsAvailable,
  smithersJsHome,
  startServer,
  TOKEN,
} from "./helpers.js";
import type { ReferenceBundle, ReferenceExecute, ReferenceTaskRuntime, Server } from "./helpers.js";

/** A bound so a hung step fails the suite instead of hanging CI (not a timing assertion). */
const TEST_TIMEOUT_MS = 300_000;

let server: Server | undefined;
let skipReason: string | undefined;
let reference: ReferenceBundle;
let execute: ReferenceExecute;
let taskRuntime: ReferenceTaskRuntime;
let Effect: { succeed: (v: unknown) => unknown };
const scratch: string[] = [];

before(async () => {
  const bin = binPath();
  if (bin === undefined) {
    skipReason = skipOrFail("SMITHERS_SANDBOX_BIN does not name the smithers-sandbox binary");
    return;
  }
  const native = nativeUnavailable(bin);
  if (native !== null) {
    skipReason = skipOrFail(native);
    return;
  }
  if (!smithersJsAvailable()) {
    skipReason = skipOrFail(`@smithers-orchestrator/sandbox is not installed under ${smithersJsHome()} (scripts/setup installs it)`);
    return;
  }
  reference = await importReference<ReferenceBundle>("@smithers-orchestrator/sandbox/src/bundle.js");
  execute = await importReference<ReferenceExecute>("@smithers-orchestrator/sandbox/src/execute.js");
  taskRuntime = await importReference<ReferenceTaskRuntime>("@smithers-orchestrator/driver/src/task-runtime.js");
  ({ Effect } = await importReference<{ Effect: typeof Effect }>("effect/dist/index.js"));
  server = await startServer(bin);
});

after(async () => {
  await server?.stop();
  for (const dir of scratch) await rm(dir, { recursive: true, force: true });
});

function ready(t: TestContext): boolean {
  if (skipReason !== undefined) {
    t.skip(skipReason);
    return false;
  }
  return true;
}

function provider(options: SmithersSandboxProviderOptions = {}) {
  return createSmithersSandboxProvider({ url: server!.url, token: TOKEN, ...options });
}

function hostClient(): SandboxHostClient {
  return new SandboxHostClient({ url: server!.url, token: TOKEN });
}

/** A small project: files to keep, change and delete, a relative link, and Smithers state. */
async function project(): Promise<string> {
  const root = await mkdtemp(join(tmpdir(), "smithers-provider-project-"));
  scratch.push(root);
  await writeFile(join(root, "keep.txt"), "keep\n");
  await writeFile(join(root, "change.txt"), "before\n");
  await writeFile(join(root, "remove.txt"), "doomed\n");
  await symlink("keep.txt", join(root, "link"));
  // The project's own state: it must never travel (the host refuses uploads containing it).
  await mkdir(join(root, ".smithers"));
  await writeFile(join(root, ".smithers", "sandbox.db"), "not for the sandbox");
  return root;
}

let counter = 0;

type Recorded = SandboxProviderRequest & { beats: Array<Record<string, unknown>> };

function request(rootDir: string, over: Partial<SandboxProviderRequest> = {}): Recorded {
  counter += 1;
  const runId = `run-${process.pid}-${counter}`;
  const sandboxId = "step";
  const sandboxRoot = join(rootDir, ".smithers", "sandboxes", runId, sandboxId);
  const beats: Array<Record<string, unknown>> = [];
  return {
    runId,
    sandboxId,
    rootDir,
    requestBundlePath: join(sandboxRoot, "request-bundle"),
    resultBundlePath: join(sandboxRoot, "result"),
    allowNetwork: false,
    maxOutputBytes: 1024 * 1024,
    toolTimeoutMs: 600_000,
    config: {},
    heartbeat: (data?: unknown) => beats.push(data as Record<string, unknown>),
    beats,
    ...over,
  };
}

const CHANGE_STEP = `
set -e
test "$(cat link)" = keep
echo after > change.txt
rm remove.txt
mkdir -p sub && echo new > sub/added.txt
echo "step says hi"
printf '{"status":"finished","outputs":{"request":%s,"cwd":"%s"}}' "$(cat "$SMITHERS_SANDBOX_REQUEST_PATH")" "$(pwd)" > "$SMITHERS_SANDBOX_RESULT_PATH"
`;

test("a step's outputs and patches come back as a bundle the real package validates", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const root = await project();
  const events: WireEvent[] = [];
  const p = provider({ onEvent: (e) => events.push(e) });
  const req = request(root, { input: { task: "fix it", n: 3 }, config: { command: CHANGE_STEP } });
  const result = await p.run(req);
  assert.equal(result.bundlePath, req.resultBundlePath);
  assert.match(String(result.remoteRunId), /^sbx-/);

  const validated = await reference.validateSandboxBundle(result.bundlePath);
  assert.equal(validated.manifest.status, "finished");
  const outputs = validated.manifest.outputs as { request: Record<string, unknown>; cwd: string };
  assert.deepEqual(outputs.request.input, { task: "fix it", n: 3 });
  assert.equal(outputs.request.sandboxId, "step");
  assert.equal(outputs.request.runId, req.runId);
  assert.equal(outputs.cwd, "/workspace");

  // Each change once, in the diffBundle Smithers applies: no patch files beside it.
  assert.deepEqual(validated.patchFiles, []);
  const diffBundle = validated.manifest.diffBundle as { patches: Array<{ path: string; operation: string; diff: string }> };
  assert.deepEqual(
    diffBundle.patches.map((d) => `${d.operation} ${d.path}`).sort(),
    ["add sub/added.txt", "delete remove.txt", "modify change.txt"],
  );
  assert.ok(!existsSync(join(result.bundlePath, "patches")), "no patches/ directory is left");
  const patches = diffBundle.patches.map((d) => d.diff).join("\n");
  assert.match(patches, /change\.txt/);
  assert.match(patches, /^-before$/m);
  assert.match(patches, /^\+after$/m);
  assert.match(patches, /remove\.txt/);
  assert.match(patches, /^-doomed$/m);
  assert.match(patches, /sub\/added\.txt/);
  assert.match(patches, /^\+new$/m);

  // Nothing touched the project itself: changes wait in the bundle for review.
  assert.equal(await readFile(join(root, "change.txt"), "utf8"), "before\n");
  assert.ok(existsSync(join(root, "remove.txt")));
  assert.ok(!existsSync(join(root, "sub")));

  const stages = req.beats.map((b) => b.stage);
  for (const stage of ["remote-created", "workspace-uploaded", "request-shipped", "remote-running", "remote-completed", "bundle-downloaded"]) {
    assert.ok(stages.includes(stage), `heartbeat ${stage} in ${JSON.stringify(stages)}`);
  }
  assert.ok(req.beats.every((b) => b.sandboxId === "step" && typeof b.progress === "number"));
  assert.ok(events.some((e) => e.type === "stdout" && e.line === "step says hi"), "the step's output reached onEvent");

  // cleanup releases the sandbox on the host, and is idempotent.
  await p.cleanup(req);
  await assert.rejects(hostClient().info(String(result.remoteRunId)), (error: { code?: string; httpStatus?: number }) => {
    assert.equal(error.httpStatus, 404);
    assert.equal(error.code, "INVALID_INPUT");
    return true;
  });
  await p.cleanup(req);
});

test("registerSandboxProvider + resolveSandboxProvider find the provider by id, and it runs", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const id = `smithers-sandbox-registry-${process.pid}`;
  const p = provider({ id, command: ["/bin/sh", "-c", `printf '{"status":"finished","outputs":{"via":"registry"}}' > "$SMITHERS_SANDBOX_RESULT_PATH"`] });
  const unregister = execute.registerSandboxProvider(p);
  try {
    const resolved = execute.resolveSandboxProvider(id)!;
    assert.equal(resolved.id, id);
    assert.equal(resolved.run, p.run);
    const req = request(await project());
    const result = (await resolved.run(req)) as { bundlePath: string };
    const validated = await reference.validateSandboxBundle(result.bundlePath);
    assert.equal(validated.manifest.status, "finished");
    assert.deepEqual(validated.manifest.outputs, { via: "registry" });
    assert.deepEqual(validated.patchFiles, []);
    await resolved.cleanup!(req);
  } finally {
    unregister();
  }
  assert.throws(() => execute.resolveSandboxProvider(id), { code: "INVALID_INPUT" });
});

/** A failed step's error, as `run` throws it. */
type StepError = { code?: string; message?: string; details?: Record<string, unknown> };

const EDIT_AND_FAIL = `echo edited > change.txt; echo added > new.txt; echo "compiling"; printf 'the key is %s\\n' "$STEP_TOKEN" >&2; echo 'error: the build broke' >&2; exit 3`;

test("a step that fails is an error with its exit code and stderr tail, and no bundle reaches Smithers", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const secret = "tok-0123456789abcdef-secret";
  const p = provider({ env: { STEP_TOKEN: secret } });
  const root = await project();
  const req = request(root, { config: { command: EDIT_AND_FAIL } });
  try {
    await assert.rejects(p.run(req), (error: StepError) => {
      assert.equal(error.code, "SANDBOX_EXECUTION_FAILED");
      assert.match(String(error.message), /^Sandbox step step \(smithers-sandbox sbx-[0-9a-f]+\) exited with code 3; none of its changes were applied\n/);
      assert.match(String(error.message), /\nits stderr:\nthe key is \[redacted\]\nerror: the build broke$/);
      assert.ok(!JSON.stringify({ message: error.message, details: error.details }).includes(secret), "the env value leaked");
      assert.equal(error.details?.exitCode, 3);
      assert.equal(error.details?.termination, "exited");
      assert.equal(error.details?.status, "failed");
      assert.equal(error.details?.bundlePath, `${req.resultBundlePath}-failed`);
      return true;
    });
    // Nothing where Smithers reads a bundle; the host's (with its patches) kept aside.
    assert.ok(!existsSync(req.resultBundlePath));
    const kept = await reference.validateSandboxBundle(`${req.resultBundlePath}-failed`);
    assert.equal(kept.manifest.status, "failed");
    assert.equal(await readFile(join(root, "change.txt"), "utf8"), "before\n");
    const completed = req.beats.find((b) => b.stage === "remote-completed");
    assert.equal(completed?.exitCode, 3);
    assert.ok(req.beats.some((b) => b.stage === "bundle-downloaded" && b.applied === false));
  } finally {
    await p.cleanup(req);
  }
});

test("a failed step's stderr in its error is its last 4 KiB, redacted, with escapes made visible", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const secret = "long-secret-value-0123456789";
  const p = provider();
  // 20000 lines (about 400 KB) of stderr, a terminal escape, and the secret (from the step's
  // config.env) right at the end.
  const req = request(await project(), {
    config: { env: { API_SECRET: secret }, command: `i=0; while [ $i -lt 20000 ]; do echo "noise line $i" >&2; i=$((i+1)); done; printf '\\033[2Jcleared %s\\n' "$API_SECRET" >&2; exit 1` },
  });
  try {
    await assert.rejects(p.run(req), (error: StepError) => {
      const message = String(error.message);
      assert.equal(error.code, "SANDBOX_EXECUTION_FAILED");
      assert.ok(message.length < 4096 + 400, String(message.length));
      assert.match(message, /\nlast 4096 bytes of its stderr:\n/);
      assert.ok(message.endsWith("noise line 19999\n\\u001b[2Jcleared [redacted]"), message.slice(-80));
      assert.ok(!message.includes("noise line 100\n"));
      assert.ok(!message.includes("\x1b") && !message.includes(secret));
      assert.equal(error.details?.stderrTruncated, true);
      return true;
    });
  } finally {
    await p.cleanup(req);
  }
});

test("a result file the host rejects fails the step, and the error says why", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const p = provider();
  const req = request(await project(), { config: { command: `echo edited > change.txt; printf '{"status":"finished", oops' > "$SMITHERS_SANDBOX_RESULT_PATH"` } });
  try {
    await assert.rejects(p.run(req), (error: StepError) => {
      assert.equal(error.code, "SANDBOX_EXECUTION_FAILED");
      assert.match(String(error.message), /exited with code 0; none of its changes were applied\nits result file was rejected: the result JSON is not valid JSON/);
      assert.match(String(error.details?.resultRejected), /not valid JSON/);
      return true;
    });
    assert.ok(!existsSync(req.resultBundlePath));
  } finally {
    await p.cleanup(req);
  }
});

test("a step killed by its memory limit says so", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  if (!enforced(binPath()!, "memory")) {
    // Not a prerequisite of the suite: hosts without a memory controller run the rest.
    t.diagnostic("this host does not enforce memory limits (doctor); the memory case is not run here");
    return;
  }
  const p = provider();
  const req = request(await project(), { config: { memoryLimit: "64m", command: `python3 -c 'b = [bytearray(1 << 20) for _ in range(1024)]'` } });
  try {
    await assert.rejects(p.run(req), (error: StepError) => {
      assert.equal(error.code, "SANDBOX_EXECUTION_FAILED");
      assert.equal(error.details?.termination, "memory", String(error.message));
      assert.match(String(error.message), /was killed by its memory limit \(memoryLimit\)/);
      return true;
    });
  } finally {
    await p.cleanup(req);
  }
});

test("the engine's toolTimeoutMs is not the step's timeout: a step longer than it finishes", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const p = provider();
  // Smithers' tool timeout bounds one tool call (60 s by default); it used to become the
  // whole step's timeout, so a 2 s step under a 500 ms tool timeout was killed.
  const req = request(await project(), { toolTimeoutMs: 500, config: { command: `sleep 2; printf '{"status":"finished","outputs":{"slept":2}}' > "$SMITHERS_SANDBOX_RESULT_PATH"` } });
  try {
    const result = await p.run(req);
    const validated = await reference.validateSandboxBundle(result.bundlePath);
    assert.equal(validated.manifest.status, "finished");
    assert.deepEqual(validated.manifest.outputs, { slept: 2 });
    assert.equal(req.beats.find((b) => b.stage === "remote-completed")?.termination, "exited");
  } finally {
    await p.cleanup(req);
  }
});

test("the provider's timeoutMs (or the step's setting) is the host's timeout: a step that overruns it is killed, and its error says so", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  for (const [options, config] of [
    [{ timeoutMs: 500 }, {}],
    [{ timeoutMs: 600_000 }, { timeoutMs: 500 }],
    [{ timeoutMs: 600_000 }, { workspace: { smithersSandbox: { timeoutMs: 500 } } }],
  ] as const) {
    const p = provider(options);
    const req = request(await project(), { toolTimeoutMs: 600_000, config: { command: "echo edited > change.txt; echo 'waiting…' >&2; sleep 600", ...config } });
    try {
      await assert.rejects(p.run(req), (error: StepError) => {
        assert.equal(error.code, "SANDBOX_EXECUTION_FAILED");
        assert.match(String(error.message), /timed out after 500 ms \(timeoutMs\) and was killed; none of its changes were applied\nits stderr:\nwaiting…$/);
        assert.equal(error.details?.termination, "timeout");
        assert.equal(error.details?.timeoutMs, 500);
        return true;
      });
      assert.equal(req.beats.find((b) => b.stage === "remote-completed")?.termination, "timeout");
      assert.ok(!existsSync(req.resultBundlePath));
    } finally {
      await p.cleanup(req);
    }
  }
});

test("a step's cwd, pidsLimit and diskLimit settings (in its workspace) reach the host", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const root = await project();
  await mkdir(join(root, "sub"));
  const p = provider({ cwd: "/workspace" });
  const req = request(root, {
    config: {
      command: `printf '{"status":"finished","outputs":{"cwd":"%s"}}' "$(pwd)" > "$SMITHERS_SANDBOX_RESULT_PATH"`,
      workspace: { name: "x", smithersSandbox: { cwd: "/workspace/sub", ...(enforced(binPath()!, "pids") ? { pidsLimit: 128 } : {}), ...(enforced(binPath()!, "disk") ? { diskLimit: "256m" } : {}) } },
    },
  });
  try {
    const result = await p.run(req);
    const validated = await reference.validateSandboxBundle(result.bundlePath);
    assert.deepEqual(validated.manifest.outputs, { cwd: "/workspace/sub" });
  } finally {
    await p.cleanup(req);
  }
  // A limit too small for the step: the host enforced the step's own pidsLimit.
  if (enforced(binPath()!, "pids")) {
    const tight = request(root, {
      config: { command: `for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16; do sleep 5 & done; wait`, workspace: { smithersSandbox: { pidsLimit: 4 } } },
    });
    try {
      await assert.rejects(p.run(tight), (error: StepError) => {
        assert.equal(error.code, "SANDBOX_EXECUTION_FAILED");
        assert.equal(error.details?.termination, "pids", String(error.message));
        assert.match(String(error.message), /hit its process limit \(pidsLimit\)/);
        return true;
      });
    } finally {
      await p.cleanup(tight);
    }
  }
});

test("a resumed run replaces the sandbox its dead client left on the host; ifExists refuse gets 409", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const root = await project();
  // The first client dies mid-step (Smithers exits on Ctrl-C before the provider's cleanup):
  // its sandbox is left running on the host.
  const first = provider({ onEvent: (e) => void (e.type === "stdout" && e.line === "started" && firstStarted()) });
  let firstStarted: () => void = () => {};
  const started = new Promise<void>((resolve) => (firstStarted = resolve));
  const req = request(root, { config: { command: "echo started; sleep 600" } });
  const orphan = first.run({ ...req, resultBundlePath: `${req.resultBundlePath}-first` }).catch(() => undefined);
  await started;
  const client = hostClient();
  const before = (await client.list()).filter((s) => s.runId === req.runId && s.sandboxId === req.sandboxId);
  assert.equal(before.length, 1);
  assert.equal(before[0]!.state, "running");

  // Asked to refuse, the resumed run is told which sandbox is in the way.
  await assert.rejects(provider({ ifExists: "refuse" }).run({ ...req, beats: [] } as Recorded), (error: { httpStatus?: number; details?: { id?: string } }) => {
    assert.equal(error.httpStatus, 409);
    assert.equal(error.details?.id, before[0]!.id);
    return true;
  });
  // By default it replaces it: the old one is cancelled and removed, the new one runs.
  const second = provider();
  const again = { ...req, config: { command: `printf '{"status":"finished","outputs":{"resumed":true}}' > "$SMITHERS_SANDBOX_RESULT_PATH"` } };
  try {
    const result = await second.run(again);
    const validated = await reference.validateSandboxBundle(result.bundlePath);
    assert.deepEqual(validated.manifest.outputs, { resumed: true });
    const after = (await client.list()).filter((s) => s.runId === req.runId && s.sandboxId === req.sandboxId);
    assert.deepEqual(after.map((s) => s.id), [String(result.remoteRunId)]);
    assert.notEqual(String(result.remoteRunId), before[0]!.id);
    await assert.rejects(client.info(before[0]!.id), { httpStatus: 404 });
  } finally {
    await second.cleanup(again);
    await orphan;
  }
});

test("the upload leaves out Smithers' database and what .gitignore ignores, and says how much", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  for (const asRepository of [true, false]) {
    const root = await project();
    // Smithers' default store is smithers.db at the project's top, beside .smithers/.
    for (const name of ["smithers.db", "smithers.db-wal", "smithers.db-shm"]) await writeFile(join(root, name), "the whole run history");
    await mkdir(join(root, "nested"));
    await writeFile(join(root, "nested", "smithers.db"), "another store");
    await writeFile(join(root, "elsewhere.sqlite"), "a store named by SMITHERS_DB");
    await writeFile(join(root, ".gitignore"), "*.log\nbuild/\n!keep.log\n");
    await writeFile(join(root, "debug.log"), "ignored");
    await writeFile(join(root, "keep.log"), "re-included");
    await mkdir(join(root, "build"));
    await writeFile(join(root, "build", "out.bin"), "ignored");
    await mkdir(join(root, "src"));
    await writeFile(join(root, "src", ".gitignore"), "secret.txt\n");
    await writeFile(join(root, "src", "secret.txt"), "ignored by a nested .gitignore");
    await writeFile(join(root, "src", "main.c"), "int main;");
    if (asRepository) {
      const { execFileSync } = await import("node:child_process");
      const git = (...args: string[]) => execFileSync("git", ["-C", root, "-c", "user.email=t@t", "-c", "user.name=t", ...args], { stdio: "ignore" });
      git("init", "-q");
      // A tracked file git would ignore is still part of the project.
      await writeFile(join(root, "tracked.log"), "tracked");
      git("add", "-f", "tracked.log");
      git("commit", "-q", "-m", "base");
      // A tree's own git configuration naming a program for git to run is never obeyed.
      git("config", "core.fsmonitor", `touch ${join(root, ".git", "fsmonitor-ran")}; false`);
    }
    const p = provider({ databasePath: join(root, "elsewhere.sqlite") });
    const req = request(root, {
      config: { command: `find . \\( -path ./.git -o -path ./.smithers \\) -prune -o -type f -print | sort | tr '\n' ' ' > /tmp/list; printf '{"status":"finished","outputs":{"files":"%s"}}' "$(cat /tmp/list)" > "$SMITHERS_SANDBOX_RESULT_PATH"` },
    });
    try {
      const result = await p.run(req);
      const validated = await reference.validateSandboxBundle(result.bundlePath);
      const files = String((validated.manifest.outputs as { files: string }).files).trim().split(" ").sort();
      const expected = ["./.gitignore", "./change.txt", "./keep.log", "./keep.txt", "./remove.txt", "./src/.gitignore", "./src/main.c"];
      if (asRepository) expected.push("./tracked.log");
      assert.deepEqual(files, expected.sort(), `uploaded (${asRepository ? "a repository" : "no repository"})`);
      const uploaded = req.beats.find((b) => b.stage === "workspace-uploaded")!;
      // debug.log, build/, src/secret.txt, and elsewhere.sqlite (SMITHERS_DB's file); the
      // smithers.db files are left out by name and are not counted here.
      assert.equal(uploaded.skippedPaths, 4, JSON.stringify(uploaded));
      assert.ok(!existsSync(join(root, ".git", "fsmonitor-ran")), "the tree's core.fsmonitor ran");
    } finally {
      await p.cleanup(req);
    }
  }
});

test("aborting the signal cancels the running step on the host; run throws PROCESS_ABORTED and applies nothing", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const controller = new AbortController();
  const p = provider({
    onEvent: (e) => {
      if (e.type === "stdout" && e.line === "started") controller.abort(new Error("user pressed Ctrl-C"));
    },
  });
  const req = request(await project(), { signal: controller.signal, config: { command: "echo edited > change.txt; echo started; sleep 600" } });
  try {
    await assert.rejects(p.run(req), (error: StepError) => {
      assert.equal(error.code, "PROCESS_ABORTED");
      assert.equal(error.details?.status, "cancelled");
      assert.match(String(error.message), /was cancelled/);
      return true;
    });
    assert.equal(req.beats.find((b) => b.stage === "remote-completed")?.termination, "cancelled");
    assert.ok(!existsSync(req.resultBundlePath));
  } finally {
    await p.cleanup(req);
  }
});

test("a signal aborted before the start creates nothing and throws PROCESS_ABORTED", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const controller = new AbortController();
  controller.abort();
  const p = provider();
  const req = request(await project(), { signal: controller.signal });
  await assert.rejects(p.run(req), { code: "PROCESS_ABORTED" });
  const listed = await fetch(`${server!.url}/v1/sandboxes`, { headers: { authorization: `Bearer ${TOKEN}` } });
  const all = (await listed.json()) as Array<{ runId: string }>;
  assert.ok(!all.some((s) => s.runId === req.runId));
});

test("a wrong token is a clear error carrying the host's code", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const p = provider({ token: "wrong-token-wrong-token-wrong-token" });
  const req = request(await project());
  await assert.rejects(p.run(req), (error: { code?: string; httpStatus?: number; details?: { auth?: string }; message?: string }) => {
    assert.equal(error.code, "INVALID_INPUT");
    assert.equal(error.httpStatus, 401);
    assert.equal(error.details?.auth, "invalid");
    assert.match(String(error.message), /refused the API key/);
    assert.match(String(error.message), /CODEPLANE_API_KEY/);
    return true;
  });
  await p.cleanup(req);
});

test("a host refusal is thrown with its code: a workspace link that leaves the tree is TOOL_PATH_ESCAPE", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const root = await project();
  await symlink("/etc/passwd", join(root, "escape"));
  const p = provider();
  const req = request(root);
  try {
    await assert.rejects(p.run(req), (error: { code?: string; httpStatus?: number; details?: { path?: string } }) => {
      assert.equal(error.code, "TOOL_PATH_ESCAPE");
      assert.equal(error.httpStatus, 422);
      assert.equal(error.details?.path, "escape");
      return true;
    });
  } finally {
    await p.cleanup(req);
  }
});

test("network faults: a lost execute answer, a cut event stream and a cut bundle download are survived", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const proxy = await startFaultProxy(server!.url, [
    // The host starts the step but its answer never arrives: the retry must carry the same
    // Idempotency-Key and be told the step already started (a second start would be 409).
    { request: /^POST \S+\/execute /, action: { kind: "drop" } },
    // The event stream breaks off after its first few hundred bytes: resume from the next seq.
    { request: /^GET \S+\/events/, action: { kind: "cut", afterBytes: 400 } },
    // The bundle breaks off inside the first file: download it again, never keep half.
    { request: /^GET \S+\/bundle /, action: { kind: "cut", afterBytes: 700 } },
  ]);
  const seqs: number[] = [];
  const p = createSmithersSandboxProvider({
    url: proxy.url,
    token: TOKEN,
    retry: { maxAttempts: 5, initialBackoffMs: 20, maxBackoffMs: 200 },
  });
  const client = new SandboxHostClient({ url: proxy.url, token: TOKEN });
  const req = request(await project(), { input: { flaky: true }, config: { command: CHANGE_STEP } });
  try {
    const result = await p.run(req);
    for (const fault of proxy.faults) {
      assert.equal(fault.fired, true, `fault ${fault.request} was injected`);
    }
    const validated = await reference.validateSandboxBundle(result.bundlePath);
    assert.equal(validated.manifest.status, "finished");
    assert.deepEqual((validated.manifest.outputs as { request: { input: unknown } }).request.input, { flaky: true });
    assert.equal((validated.manifest.diffBundle as { patches: unknown[] }).patches.length, 3);
    assert.ok(req.beats.some((b) => b.stage === "remote-resumed"), "the event stream was resumed");
    // Replaying the whole stream now shows every event exactly once, in order: the resumed
    // follower above saw the same sequence (it checks for gaps and throws on one).
    const terminal = await client.follow(String(result.remoteRunId), { onEvent: (_e, seq) => seqs.push(seq) });
    assert.equal(terminal.type, "completed");
    assert.deepEqual(seqs, seqs.map((_, i) => i));
    const info = await client.info(String(result.remoteRunId));
    assert.equal(info.state, "completed");
  } finally {
    await p.cleanup(req);
    await proxy.close();
  }
});

/** Records what executeSandbox writes (see the report: the real store needs bun:sqlite). */
function memoryDb() {
  const rows = new Map<string, Record<string, unknown>>();
  const events: Array<{ type: string; payload: Record<string, unknown> }> = [];
  const heartbeats: number[] = [];
  return {
    rows,
    events,
    heartbeats,
    async listSandboxes(runId: string) {
      return [...rows.values()].filter((r) => r.runId === runId);
    },
    async upsertSandbox(row: Record<string, unknown>) {
      const key = `${row.runId}:${row.sandboxId}`;
      rows.set(key, { ...(rows.get(key) ?? {}), ...row });
    },
    async insertEventWithNextSeq(row: { type: string; payloadJson: string }) {
      events.push({ type: row.type, payload: JSON.parse(row.payloadJson) as Record<string, unknown> });
      return events.length - 1;
    },
    heartbeatSandbox(_runId: string, _sandboxId: string, at: number) {
      heartbeats.push(at);
      return Effect.succeed(undefined);
    },
  };
}

test("executeSandbox of the real package runs a step end to end through the provider", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const id = `smithers-sandbox-execute-${process.pid}`;
  const p = provider({ id });
  const unregister = execute.registerSandboxProvider(p);
  try {
    const root = await project();
    const db = memoryDb();
    const beats: Array<Record<string, unknown>> = [];
    const runId = `run-exec-${process.pid}`;
    const outputs = await taskRuntime.withTaskRuntime(
      { runId, stepId: "step", attempt: 1, iteration: 0, rootDir: root, signal: new AbortController().signal, db, heartbeat: (d: unknown) => beats.push(d as Record<string, unknown>), lastHeartbeat: null },
      () =>
        execute.executeSandbox({
          sandboxId: "answer",
          provider: id,
          input: { question: "six times seven" },
          rootDir: root,
          allowNetwork: false,
          maxOutputBytes: 1024 * 1024,
          toolTimeoutMs: 600_000,
          config: { command: `printf '{"status":"finished","outputs":{"answer":42}}' > "$SMITHERS_SANDBOX_RESULT_PATH"` },
        }),
    );
    assert.deepEqual(outputs, { answer: 42 });
    const types = db.events.map((e) => e.type);
    assert.deepEqual(types, ["SandboxCreated", "SandboxShipped", "SandboxBundleReceived", "SandboxCompleted"]);
    const row = db.rows.get(`${runId}:answer`)!;
    assert.equal(row.status, "finished");
    assert.match(String(row.remoteRunId), /^sbx-/);
    assert.equal(row.runtime, id);
    assert.ok(beats.some((b) => b.stage === "remote-completed"), "the provider's heartbeats reach the task runtime");
    assert.ok(db.heartbeats.length > 0, "and are persisted as sandbox heartbeats");
    assert.deepEqual(beats.at(-1), { sandboxId: "answer", stage: "completed", progress: 100, status: "finished" });
    // executeSandbox always calls cleanup: the host no longer has the sandbox.
    await assert.rejects(hostClient().info(String(row.remoteRunId)), { code: "INVALID_INPUT" });

    // Changes go through the package's review gate: without approval it refuses, and the
    // project is untouched.
    const db2 = memoryDb();
    await assert.rejects(
      taskRuntime.withTaskRuntime(
        { runId: `${runId}-review`, stepId: "step", attempt: 1, iteration: 0, rootDir: root, signal: new AbortController().signal, db: db2, heartbeat: () => {}, lastHeartbeat: null },
        () =>
          execute.executeSandbox({
            sandboxId: "edit",
            provider: id,
            rootDir: root,
            allowNetwork: false,
            maxOutputBytes: 1024 * 1024,
            toolTimeoutMs: 600_000,
            config: { command: CHANGE_STEP },
          }),
      ),
      (error: { code?: string; message?: string }) => {
        assert.equal(error.code, "INVALID_INPUT");
        assert.match(String(error.message), /require review approval/);
        return true;
      },
    );
    const review = db2.events.find((e) => e.type === "SandboxDiffReviewRequested");
    assert.ok(review, `review requested in ${JSON.stringify(db2.events.map((e) => e.type))}`);
    // Counted once: 3 changed files (change.txt, remove.txt, sub/added.txt) and their 4 diff
    // lines (-before +after -doomed +new). Patch files beside the diffBundle made this 6 and 8.
    assert.equal(review.payload.patchCount, 3);
    assert.equal(review.payload.totalDiffLines, 4);
    const received = db2.events.find((e) => e.type === "SandboxBundleReceived");
    assert.equal(received?.payload.patchCount, 3);
    assert.ok(db2.events.some((e) => e.type === "SandboxDiffRejected"));
    assert.equal(await readFile(join(root, "change.txt"), "utf8"), "before\n");
  } finally {
    unregister();
  }
});

test("executeSandbox of the real package applies nothing of a failed step, on every attempt, and fails with its error", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const id = `smithers-sandbox-failed-${process.pid}`;
  const p = provider({ id, env: { STEP_TOKEN: "a-token-value-never-shown" } });
  const unregister = execute.registerSandboxProvider(p);
  const applied: unknown[] = [];
  // Smithers' own applier would write the files; this one records that it was called.
  const applyDiffBundle = async (bundle: unknown) => void applied.push(bundle);
  try {
    const root = await project();
    const runId = `run-failed-${process.pid}`;
    // Two attempts, as a task with retries makes them: each a new sandbox, each failing.
    for (const attempt of [1, 2]) {
      const db = memoryDb();
      const beats: Array<Record<string, unknown>> = [];
      await assert.rejects(
        taskRuntime.withTaskRuntime(
          { runId, stepId: "edit", attempt, iteration: 0, rootDir: root, signal: new AbortController().signal, db, heartbeat: (d: unknown) => beats.push(d as Record<string, unknown>), lastHeartbeat: null },
          () =>
            execute.executeSandbox({
              sandboxId: "edit",
              provider: id,
              rootDir: root,
              allowNetwork: false,
              maxOutputBytes: 1024 * 1024,
              toolTimeoutMs: 600_000,
              autoAcceptDiffs: true,
              applyDiffBundle,
              config: { command: EDIT_AND_FAIL },
            }),
        ),
        (error: StepError) => {
          assert.equal(error.code, "SANDBOX_EXECUTION_FAILED");
          assert.match(String(error.message), /exited with code 3; none of its changes were applied/);
          assert.match(String(error.message), /error: the build broke$/);
          return true;
        },
      );
      assert.deepEqual(db.events.map((e) => e.type), ["SandboxCreated", "SandboxShipped", "SandboxFailed"], `attempt ${attempt}`);
      const failed = db.events[2]!.payload.error as StepError;
      assert.equal(failed.code, "SANDBOX_EXECUTION_FAILED");
      assert.equal(failed.details?.exitCode, 3);
      assert.ok(!JSON.stringify(db.events).includes("a-token-value-never-shown"));
      assert.equal(db.rows.get(`${runId}:edit`)?.status, "failed");
      // The task's last heartbeat carries the error too.
      assert.match(String(beats.at(-1)?.error), /exited with code 3/);
    }
    assert.deepEqual(applied, [], "Smithers was handed a failed step's changes");
    assert.equal(await readFile(join(root, "change.txt"), "utf8"), "before\n");
    assert.ok(!existsSync(join(root, "new.txt")));

    // The same step finishing: its changes are handed over (the applier is called once).
    const db = memoryDb();
    await taskRuntime.withTaskRuntime(
      { runId: `${runId}-ok`, stepId: "edit", attempt: 1, iteration: 0, rootDir: root, signal: new AbortController().signal, db, heartbeat: () => {}, lastHeartbeat: null },
      () =>
        execute.executeSandbox({
          sandboxId: "edit",
          provider: id,
          rootDir: root,
          allowNetwork: false,
          maxOutputBytes: 1024 * 1024,
          toolTimeoutMs: 600_000,
          autoAcceptDiffs: true,
          applyDiffBundle,
          config: { command: `echo edited > change.txt; printf '{"status":"finished","outputs":{}}' > "$SMITHERS_SANDBOX_RESULT_PATH"` },
        }),
    );
    assert.equal(applied.length, 1);
  } finally {
    unregister();
  }
});

test("with the durable review, a failed step's changes are never held for review", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const p = provider({ durableReview: { pollMs: 50 } });
  const root = await project();
  await rm(join(root, ".smithers"), { recursive: true, force: true });
  const req = request(root, { config: { command: EDIT_AND_FAIL } });
  try {
    await assert.rejects(p.run(req), { code: "SANDBOX_EXECUTION_FAILED" });
    assert.ok(!existsSync(`${req.resultBundlePath}-review`));
    assert.ok(!req.beats.some((b) => String(b.stage).startsWith("review-")), JSON.stringify(req.beats.map((b) => b.stage)));
    // Nothing in the project's review.
    assert.ok(!existsSync(join(root, ".smithers", "sandbox.db")), "a review store was made");
  } finally {
    await p.cleanup(req);
  }
});

test("egress decisions reach Smithers as heartbeats, and a denial is named in the step's error", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  // A host with an egress ceiling: a step's own policy is confined to it.
  const ceilingDir = await mkdtemp(join(tmpdir(), "smithers-provider-ceiling-"));
  scratch.push(ceilingDir);
  const ceiling = join(ceilingDir, "ceiling.json");
  await writeFile(ceiling, JSON.stringify({ allow: [{ host: "allowed.test", ports: [443] }, { host: "*.allowed.test", ports: [443] }] }));
  const host = await startServer(binPath()!, ["--egress-ceiling", ceiling]);
  try {
    const p = createSmithersSandboxProvider({ url: host.url, token: TOKEN, livenessIntervalMs: 60_000 });
    const policy = { allow: [{ host: "allowed.test", ports: [443] }, { host: "*.allowed.test", ports: [443] }] };
    const lookups = "getent hosts allowed.test; getent hosts denied.test; getent hosts denied.test; for i in 1 2 3 4 5 6 7 8; do getent hosts n$i.allowed.test; done";
    // A step that finishes: its decisions are heartbeats, its totals ride on later ones.
    const ok = request(await project(), {
      config: { command: `${lookups}; printf '{"status":"finished","outputs":{}}' > "$SMITHERS_SANDBOX_RESULT_PATH"`, workspace: { smithersSandbox: { egressPolicy: policy } } },
    });
    try {
      await p.run(ok);
    } finally {
      await p.cleanup(ok);
    }
    const egress = ok.beats.filter((b) => b.stage === "remote-egress").map((b) => b.egress as Record<string, unknown>);
    const denied = egress.find((e) => e.host === "denied.test");
    assert.ok(denied, JSON.stringify(egress));
    assert.equal(denied.verdict, "deny");
    assert.match(String(denied.reason), /denied\.test/);
    assert.ok(egress.some((e) => e.host === "allowed.test" && e.verdict === "allow"), JSON.stringify(egress));
    const completed = ok.beats.find((b) => b.stage === "remote-completed")!;
    const totals = completed.egressTotals as { allowed: number; denied: number };
    assert.ok(totals.denied >= 1 && totals.allowed >= 9, JSON.stringify(totals));
    // A step that fails: the denial is in its error.
    const failing = request(await project(), {
      config: { command: `getent hosts denied.test || { echo 'cannot resolve denied.test' >&2; exit 6; }`, workspace: { smithersSandbox: { egressPolicy: policy } } },
    });
    try {
      await assert.rejects(p.run(failing), (error: StepError) => {
        assert.equal(error.code, "SANDBOX_EXECUTION_FAILED");
        assert.match(String(error.message), /exited with code 6; none of its changes were applied\negress denied: denied\.test( ×\d+)? \([^)]*denied\.test[^)]*\)\nits stderr:\ncannot resolve denied\.test$/);
        assert.equal((error.details?.egressDenied as Array<{ host: string }>)[0]?.host, "denied.test");
        return true;
      });
    } finally {
      await p.cleanup(failing);
    }
  } finally {
    await host.stop();
  }
});

test("Smithers' secretBindings reach the host as secrets: the step holds a placeholder of the value's shape, never the value", { timeout: TEST_TIMEOUT_MS }, async (t) => {
  if (!ready(t)) return;
  const ceilingDir = await mkdtemp(join(tmpdir(), "smithers-provider-secret-"));
  scratch.push(ceilingDir);
  const ceiling = join(ceilingDir, "ceiling.json");
  await writeFile(ceiling, JSON.stringify({ allow: [{ host: "api.allowed.test", ports: [443] }] }));
  const host = await startServer(binPath()!, ["--egress-ceiling", ceiling]);
  const value = "sk-ant-api03-Zq8Wx7Cv6Bn5Mk4Lj3Hg2Fd1Sa0Pp9Oo8Ii7Uu";
  try {
    const p = createSmithersSandboxProvider({ url: host.url, token: TOKEN, livenessIntervalMs: 60_000, secretHosts: { API_KEY: ["api.allowed.test"] } });
    // The step reports its $API_KEY, where its trusted authority is, and whether the value's
    // middle (assembled here, so no command line holds it) is anywhere it can read.
    const command = `m=Wx7Cv6Bn; n=5Mk4Lj3H; hits=$( (env; grep -rs "$m$n" /workspace /run/smithers /tmp /etc) 2>/dev/null | grep -c "$m$n"); printf '{"status":"finished","outputs":{"key":"%s","ca":"%s","hits":"%s"}}' "$API_KEY" "$SSL_CERT_FILE" "$hits" > "$SMITHERS_SANDBOX_RESULT_PATH"`;
    const req = request(await project(), { egress: { secretBindings: { API_KEY: value } }, config: { command } });
    try {
      const result = await p.run(req);
      const validated = await reference.validateSandboxBundle(result.bundlePath);
      const outputs = validated.manifest.outputs as { key: string; ca: string; hits: string };
      assert.equal(outputs.key.length, value.length, outputs.key);
      assert.ok(outputs.key.startsWith("sk-ant-api03-") && outputs.key !== value, outputs.key);
      assert.match(outputs.ca, /^\/run\/smithers\/request\/egress-ca-bundle\.pem$/);
      assert.equal(outputs.hits, "0");
      assert.ok(!JSON.stringify(req.beats).includes(value));
    } finally {
      await p.cleanup(req);
    }
  } finally {
    await host.stop();
  }
});
