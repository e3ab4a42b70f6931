/**
 * How long one step takes through the provider as the workspace grows: the whole `run` (create,
 * streamed upload, ship, execute `true`, events, bundle download) and its upload part, against
 * the real `smithers-sandbox serve` on loopback. Median of ROUNDS rounds; incompressible data.
 *
 *   npm run build && SMITHERS_SANDBOX_BIN=... node dist/bench/upload.js [ROUNDS] [GZIP_LEVEL]
 */

import { randomBytes } from "node:crypto";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { createSmithersSandboxProvider } from "../src/index.js";
import { startServer, TOKEN } from "../test/helpers.js";

const rounds = Number(process.argv[2] ?? 3);
const gzipLevel = process.argv[3] === undefined ? undefined : Number(process.argv[3]);
const bin = process.env.SMITHERS_SANDBOX_BIN;
if (!bin) throw new Error("set SMITHERS_SANDBOX_BIN");

async function tree(files: number, size: number): Promise<string> {
  const root = await mkdtemp(join(tmpdir(), "smithers-provider-bench-"));
  for (let i = 0; i < files; i++) {
    const dir = join(root, `d${Math.floor(i / 100)}`);
    if (i % 100 === 0) await mkdir(dir);
    await writeFile(join(dir, `f${i}`), randomBytes(size));
  }
  return root;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

const server = await startServer(bin);
const provider = createSmithersSandboxProvider({
  url: server.url,
  token: TOKEN,
  livenessIntervalMs: 0,
  ...(gzipLevel === undefined ? {} : { gzipLevel }),
});
console.log(`gzip level ${gzipLevel ?? "default"}`);
console.log(`| workspace | bytes | run (ms, median of ${rounds}) | upload (ms) | upload MiB/s |`);
console.log("|---|---|---|---|---|");
let n = 0;
for (const [files, size] of [
  [1, 1024],
  [1000, 8 * 1024],
  [10_000, 8 * 1024],
  [1, 64 * 1024 * 1024],
] as const) {
  const root = await tree(files, size);
  const runs: number[] = [];
  const uploads: number[] = [];
  for (let r = 0; r < rounds; r++) {
    n += 1;
    const stamps = new Map<string, number>();
    const req = {
      runId: `bench-${process.pid}-${n}`,
      sandboxId: "step",
      rootDir: root,
      requestBundlePath: join(root, ".smithers", "req"),
      resultBundlePath: join(root, ".smithers", "sandboxes", `r${n}`, "result"),
      allowNetwork: false,
      maxOutputBytes: 1 << 20,
      toolTimeoutMs: 600_000,
      config: { command: ["true"] },
      heartbeat: (d?: unknown) => {
        const stage = (d as { stage: string }).stage;
        if (!stamps.has(stage)) stamps.set(stage, performance.now());
      },
    };
    const t0 = performance.now();
    await provider.run(req);
    runs.push(performance.now() - t0);
    uploads.push(stamps.get("workspace-uploaded")! - stamps.get("remote-created")!);
    await provider.cleanup(req);
  }
  const bytes = files * size;
  const up = median(uploads);
  console.log(`| ${files} file(s) × ${size >= 1 << 20 ? `${size >> 20} MiB` : `${size >> 10} KiB`} | ${bytes} | ${median(runs).toFixed(0)} | ${up.toFixed(0)} | ${(bytes / (1 << 20) / (up / 1000)).toFixed(1)} |`);
  await rm(root, { recursive: true, force: true });
}
await server.stop();
