/**
 * How a Smithers request becomes the host's controls and command, and the errors for what
 * cannot be honoured — checked before any network traffic, so no server is needed. The URL
 * points at a closed loopback port: a test that wrongly reached the network would fail with
 * TASK_RUNTIME_UNAVAILABLE instead of the code it expects (the last test checks exactly that).
 */

import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { controlsFor, createSmithersSandboxProvider, DEFAULT_SANDBOX_COMMAND, parseSize, sandboxSettings, stepCommandFor } from "../src/index.js";
import type { SandboxProviderRequest } from "../src/index.js";
import { carriesSecretsSafely } from "../src/provider.js";

let root = "";
/** A loopback URL nothing listens on (a port just released; fetch refuses "bad ports" like 9). */
const closedPort = { url: "", token: "unused-token-unused-token" };
before(async () => {
  root = await mkdtemp(join(tmpdir(), "smithers-provider-config-"));
  const probe = createServer();
  await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const port = (probe.address() as { port: number }).port;
  await new Promise((resolve) => probe.close(resolve));
  closedPort.url = `http://127.0.0.1:${port}`;
});
after(async () => {
  await rm(root, { recursive: true, force: true });
});

function request(over: Partial<SandboxProviderRequest> = {}): SandboxProviderRequest {
  return {
    runId: "run-config",
    sandboxId: "step",
    rootDir: root,
    requestBundlePath: join(root, "req"),
    resultBundlePath: join(root, "res"),
    allowNetwork: false,
    maxOutputBytes: 4096,
    toolTimeoutMs: 1500.5,
    config: {},
    heartbeat: () => {},
    ...over,
  };
}


test("execution options and config map to the host's controls", () => {
  const { controls, image } = controlsFor(
    request({
      allowNetwork: true,
      config: { env: { A: "1" }, memoryLimit: "512m", diskLimit: "1g", cpuLimit: "0.5", pidsLimit: 64, ports: [{ host: 8080, container: 80 }], image: "alpine", timeoutMs: 1500.5 },
    }),
    { env: { A: "base", B: "2" } },
  );
  assert.deepEqual(controls, {
    allowNetwork: true,
    maxOutputBytes: 4096,
    timeoutMs: 1501,
    env: { A: "1", B: "2" },
    memoryLimitBytes: 512 * 1024 * 1024,
    diskLimitBytes: 1024 ** 3,
    cpuLimit: 0.5,
    pidsLimit: 64,
    ports: [{ host: 8080, container: 80 }],
  });
  assert.equal(image, "alpine");
  // The step's timeout is config.timeoutMs, else the provider's timeoutMs; never the engine's
  // toolTimeoutMs (one tool call's bound, 1500.5 in these requests).
  assert.equal(controlsFor(request()).controls.timeoutMs, undefined);
  assert.equal(controlsFor(request(), { timeoutMs: 90_000 }).controls.timeoutMs, 90_000);
  assert.equal(controlsFor(request({ config: { timeoutMs: "2500" } }), { timeoutMs: 90_000 }).controls.timeoutMs, 2500);
  assert.throws(() => controlsFor(request({ config: { timeoutMs: -1 } })), /timeoutMs/);
  // An egress policy: the provider's for every step, a step's own instead.
  const policy = { allow: [{ host: "api.example.com", ports: [443] }] };
  assert.deepEqual(controlsFor(request(), { egressPolicy: policy }).controls.egressPolicy, policy);
  const own = { mode: "audit", allow: [] };
  assert.deepEqual(controlsFor(request({ config: { egressPolicy: own } }), { egressPolicy: policy }).controls.egressPolicy, own);
  assert.throws(() => controlsFor(request({ config: { egressPolicy: "all" } })), /egressPolicy/);
  assert.throws(() => controlsFor(request({ allowNetwork: true, config: { egressPolicy: policy } })), /egressPolicy/);
  // Zero or missing limits are left to the host's defaults.
  assert.deepEqual(controlsFor(request({ maxOutputBytes: 0, toolTimeoutMs: 0 })).controls, { allowNetwork: false });
  assert.equal(parseSize("memoryLimit", "1.5KiB"), 1536);
});

test("Smithers' secretBindings become secrets bound to the provider's secretHosts; the values ride beside the controls, never in them", () => {
  const value = "sk-ant-api03-provider-secret-value-0123456789";
  const egress = { secretBindings: { API_KEY: value } };
  const options = { secretHosts: { API_KEY: ["api.example.com"] }, egressPolicy: { allow: [{ host: "registry.example.com", ports: [443] }] } };
  const { controls, secretValues } = controlsFor(request({ egress }), options);
  assert.deepEqual(controls.secrets, [{ name: "API_KEY", hosts: ["api.example.com"] }]);
  // The binding's host allowed on 443 beside the policy's own (as `run --secret` does).
  assert.deepEqual(controls.egressPolicy, {
    allow: [
      { host: "registry.example.com", ports: [443] },
      { host: "api.example.com", ports: [443] },
    ],
  });
  assert.deepEqual(secretValues, { API_KEY: Buffer.from(value).toString("base64") });
  assert.ok(!JSON.stringify(controls).includes(value));
  // The provider's policy object is not changed for the next step.
  assert.equal(options.egressPolicy.allow.length, 1);
  // The same from the step's config.egress; without any binding, nothing.
  assert.deepEqual(controlsFor(request({ config: { egress } }), options).controls.secrets, controls.secrets);
  assert.equal(controlsFor(request({ egress: { secretBindings: {} } }), options).secretValues, undefined);
  // A binding with no hosts, or with allowNetwork: refused, naming neither the binding nor its value.
  const cases: Array<[SandboxProviderRequest, { secretHosts?: Record<string, string[]> }]> = [
    [request({ egress }), {}],
    [request({ egress }), { secretHosts: { API_KEY: [] } }],
    [request({ egress, allowNetwork: true }), { secretHosts: { API_KEY: ["api.example.com"] } }],
  ];
  for (const [req, opts] of cases) {
    assert.throws(
      () => controlsFor(req, opts),
      (error: { code?: string; message?: string }) => {
        assert.equal(error.code, "INVALID_INPUT");
        assert.match(String(error.message), /secretBindings/);
        assert.ok(!String(error.message).includes("API_KEY") && !String(error.message).includes(value), error.message);
        return true;
      },
    );
  }
  // A value that is not a string: refused.
  assert.throws(() => controlsFor(request({ egress: { secretBindings: { API_KEY: 7 } } }), options), /secretBindings/);
  // Both places read: a proxy in the config's egress is refused though the request's has bindings.
  assert.throws(() => controlsFor(request({ egress, config: { egress: { httpsProxy: "http://p:3128" } } }), options), /egress/);
  assert.throws(() => controlsFor(request({ egress, config: { egress: { secretBindings: { OTHER: value } } } }), options), /different secrets/);
});

test("secrets' values go to the host over https, or over http to this machine's loopback only", () => {
  for (const ok of ["https://host.example:7420", "http://127.0.0.1:7420", "http://localhost:1", "http://[::1]:7420"]) {
    assert.ok(carriesSecretsSafely(ok), ok);
  }
  for (const no of ["http://10.0.0.5:7420", "http://host.example", "not a url"]) {
    assert.ok(!carriesSecretsSafely(no), no);
  }
});

test("a step's settings ride in its workspace prop (what Smithers 0.32 hands a provider), over the provider's", () => {
  // What <Sandbox workspace={sandboxSettings({...})}> becomes in request.config (Smithers
  // builds config from image, env, egress, ports, volumes, memoryLimit, cpuLimit, command and
  // workspace only).
  const policy = { allow: [{ host: "api.example.com", ports: [443] }] };
  const workspace = sandboxSettings({ timeoutMs: 2500, cwd: "/workspace/app", diskLimit: "1g", pidsLimit: 64, egressPolicy: policy });
  assert.deepEqual(workspace, {
    name: "smithers-sandbox-settings",
    smithersSandbox: { timeoutMs: 2500, cwd: "/workspace/app", diskLimit: "1g", pidsLimit: 64, egressPolicy: policy },
  });
  const config = { image: undefined, env: { A: "1" }, egress: undefined, ports: undefined, volumes: undefined, memoryLimit: "512m", cpuLimit: undefined, command: "make", workspace };
  const options = { timeoutMs: 90_000, cwd: "/workspace", diskLimit: "8g", pidsLimit: 4096, egressPolicy: { allow: [] } };
  const { controls } = controlsFor(request({ config }), options);
  // The settings' workspace is never sent to the host as a workspace.
  assert.equal(controls.workspace, undefined);
  assert.deepEqual(controls, {
    allowNetwork: false,
    maxOutputBytes: 4096,
    timeoutMs: 2500,
    env: { A: "1" },
    memoryLimitBytes: 512 * 1024 * 1024,
    diskLimitBytes: 1024 ** 3,
    pidsLimit: 64,
    egressPolicy: policy,
  });
  assert.deepEqual(stepCommandFor(request({ config }), options), { argv: ["/bin/sh", "-c", "make"], cwd: "/workspace/app" });
  // The plain object works as well; settings not given fall back to the provider's options.
  const plain = { workspace: { smithersSandbox: { cwd: "/workspace/sub" } } };
  assert.deepEqual(controlsFor(request({ config: plain }), options).controls, {
    allowNetwork: false,
    maxOutputBytes: 4096,
    timeoutMs: 90_000,
    diskLimitBytes: 8 * 1024 ** 3,
    pidsLimit: 4096,
    egressPolicy: { allow: [] },
  });
  assert.equal(stepCommandFor(request({ config: plain })).cwd, "/workspace/sub");
  // The workspace's settings win over the same ones at the top of config (executeSandbox callers).
  assert.equal(controlsFor(request({ config: { timeoutMs: 100, workspace: { smithersSandbox: { timeoutMs: 200 } } } })).controls.timeoutMs, 200);
  // A workspace without settings is forwarded as before (the host decides).
  assert.deepEqual(controlsFor(request({ config: { workspace: { name: "ws" } } })).controls.workspace, { name: "ws" });
});

test("a wrong step setting is refused where it is written, never dropped", async () => {
  // A typo must not leave a step without its bound.
  assert.throws(() => sandboxSettings({ timeout: 5 } as unknown as Parameters<typeof sandboxSettings>[0]), (error: { code?: string; message?: string; details?: { unknown?: string[] } }) => {
    assert.equal(error.code, "INVALID_INPUT");
    assert.match(String(error.message), /unknown setting\(s\) "timeout"/);
    assert.deepEqual(error.details?.unknown, ["timeout"]);
    return true;
  });
  assert.throws(() => sandboxSettings({ timeoutMs: -1 }), { code: "INVALID_INPUT" });
  assert.throws(() => sandboxSettings({ cwd: "relative" }), { code: "INVALID_INPUT" });
  assert.throws(() => sandboxSettings({ pidsLimit: 1.5 }), { code: "INVALID_INPUT" });
  assert.throws(() => sandboxSettings({ diskLimit: "lots" }), { code: "INVALID_INPUT" });
  assert.throws(() => sandboxSettings({ egressPolicy: [] as unknown as Record<string, unknown> }), { code: "INVALID_INPUT" });
  // The same checks when the workspace is written by hand, before anything is sent.
  const provider = createSmithersSandboxProvider(closedPort);
  for (const [workspace, control] of [
    [{ smithersSandbox: { timout: 5 } }, "workspace.smithersSandbox"],
    [{ smithersSandbox: "timeoutMs=5" }, "workspace.smithersSandbox"],
    [{ smithersSandbox: { diskLimit: "lots" } }, "diskLimit"],
    [{ smithersSandbox: { cwd: "" } }, "cwd"],
    [{ name: "ws", snapshotId: "snap", smithersSandbox: { timeoutMs: 5 } }, "workspace"],
  ] as const) {
    await assert.rejects(provider.run(request({ config: { workspace } })), (error: { code?: string; details?: { control?: string } }) => {
      assert.equal(error.code, "INVALID_INPUT");
      assert.equal(error.details?.control, control, JSON.stringify(workspace));
      return true;
    });
  }
});

test("the command: config.command, else the provider's, else Smithers' default", () => {
  assert.deepEqual(stepCommandFor(request({ config: { command: "echo hi", cwd: "/workspace/sub" } }), { command: ["true"] }), {
    argv: ["/bin/sh", "-c", "echo hi"],
    cwd: "/workspace/sub",
  });
  assert.deepEqual(stepCommandFor(request({ config: { command: "  " } }), { command: ["node", "step.js"], cwd: "/workspace" }), {
    argv: ["node", "step.js"],
    cwd: "/workspace",
  });
  assert.deepEqual(stepCommandFor(request()), { argv: ["/bin/sh", "-c", DEFAULT_SANDBOX_COMMAND] });
});

test("bad config values are INVALID_INPUT before anything is sent", async () => {
  const provider = createSmithersSandboxProvider(closedPort);
  for (const [config, control] of [
    [{ memoryLimit: "lots" }, "memoryLimit"],
    [{ cpuLimit: -1 }, "cpuLimit"],
    [{ pidsLimit: 1.5 }, "pidsLimit"],
    [{ env: { A: 1 } }, "env"],
    [{ ports: [{ host: "80" }] }, "ports"],
    [{ command: [] }, "command"],
  ] as const) {
    await assert.rejects(provider.run(request({ config: config as Record<string, unknown> })), (error: { code?: string; details?: { control?: string } }) => {
      assert.equal(error.code, "INVALID_INPUT");
      assert.equal(error.details?.control, control);
      return true;
    });
  }
  await assert.rejects(provider.run(request({ rootDir: join(root, "missing") })), { code: "INVALID_INPUT" });
});

test("controls the host cannot honour for a remote client are refused, never dropped", async () => {
  const provider = createSmithersSandboxProvider(closedPort);
  await assert.rejects(provider.run(request({ config: { volumes: [{ host: "/data", container: "/data" }] } })), (error: { code?: string; message?: string }) => {
    assert.equal(error.code, "TASK_RUNTIME_UNAVAILABLE");
    assert.match(String(error.message), /volumes/);
    return true;
  });
  await assert.rejects(provider.run(request({ egress: { httpsProxy: "http://proxy:3128" } })), (error: { code?: string; message?: string }) => {
    assert.equal(error.code, "TASK_RUNTIME_UNAVAILABLE");
    assert.match(String(error.message), /egress/);
    return true;
  });
});

test("url and token come from CODEPLANE_API_URL / CODEPLANE_API_KEY; missing ones are named", () => {
  const saved = { url: process.env.CODEPLANE_API_URL, key: process.env.CODEPLANE_API_KEY };
  try {
    delete process.env.CODEPLANE_API_URL;
    process.env.CODEPLANE_API_KEY = "from-env-token-from-env-token";
    assert.throws(() => createSmithersSandboxProvider(), (error: { code?: string; message?: string }) => {
      assert.equal(error.code, "TASK_RUNTIME_UNAVAILABLE");
      assert.match(String(error.message), /CODEPLANE_API_URL/);
      return true;
    });
    process.env.CODEPLANE_API_URL = "http://127.0.0.1:7420";
    delete process.env.CODEPLANE_API_KEY;
    assert.throws(() => createSmithersSandboxProvider(), /CODEPLANE_API_KEY/);
    process.env.CODEPLANE_API_KEY = "from-env-token-from-env-token";
    const provider = createSmithersSandboxProvider({ id: "  named  " });
    assert.equal(provider.id, "named");
    assert.equal(typeof provider.run, "function");
    assert.equal(typeof provider.cleanup, "function");
    assert.throws(() => createSmithersSandboxProvider({ url: "ftp://host" }), { code: "TASK_RUNTIME_UNAVAILABLE" });
  } finally {
    if (saved.url === undefined) delete process.env.CODEPLANE_API_URL;
    else process.env.CODEPLANE_API_URL = saved.url;
    if (saved.key === undefined) delete process.env.CODEPLANE_API_KEY;
    else process.env.CODEPLANE_API_KEY = saved.key;
  }
});

test("a host that is not listening is TASK_RUNTIME_UNAVAILABLE naming the fix", async () => {
  const provider = createSmithersSandboxProvider({ ...closedPort, retry: { maxAttempts: 2, initialBackoffMs: 1, maxBackoffMs: 1 } });
  await assert.rejects(provider.run(request()), (error: { code?: string; message?: string; details?: { fix?: string } }) => {
    assert.equal(error.code, "TASK_RUNTIME_UNAVAILABLE");
    assert.match(String(error.message), /cannot reach the sandbox host at http:\/\/127\.0\.0\.1:\d+/);
    assert.match(String(error.message), /ECONNREFUSED/);
    assert.match(String(error.details?.fix), /smithers-sandbox serve/);
    return true;
  });
  // Nothing was created, so cleanup has nothing to do.
  await provider.cleanup(request());
});
