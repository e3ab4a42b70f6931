/**
 * The provider is a `SandboxProvider` as the real package types it: a TypeScript program that
 * assigns our provider to `@smithers-orchestrator/sandbox`'s own `SandboxProvider` type (from
 * `src/SandboxProvider.ts` of the installed 0.32.0) and passes its `SandboxProviderRequest` to
 * our `run` must compile. A control program that breaks the contract must not.
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { test } from "node:test";

import { skipOrFail, smithersJsAvailable, smithersJsHome } from "./helpers.js";

const packageDir = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");

function typecheck(dir: string, program: string): Promise<{ status: number | null; output: string }> {
  return (async () => {
    await writeFile(join(dir, "check.ts"), program);
    await writeFile(
      join(dir, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: {
          target: "ES2022",
          module: "NodeNext",
          moduleResolution: "NodeNext",
          strict: true,
          noEmit: true,
          allowImportingTsExtensions: true,
          // The reference package's own sidecars pull in types of its dependencies that are
          // not ours to check; the assignments below are checked either way.
          skipLibCheck: true,
          types: ["node"],
          typeRoots: [join(packageDir, "node_modules", "@types")],
        },
        files: ["check.ts"],
      }),
    );
    const out = spawnSync(process.execPath, [join(packageDir, "node_modules", "typescript", "bin", "tsc"), "-p", dir], { encoding: "utf8" });
    return { status: out.status, output: `${out.stdout}${out.stderr}` };
  })();
}

test("the provider type-checks as the real package's SandboxProvider", async (t) => {
  if (!smithersJsAvailable()) {
    t.skip(skipOrFail(`@smithers-orchestrator/sandbox is not installed under ${smithersJsHome()}`));
    return;
  }
  const dir = await mkdtemp(join(tmpdir(), "smithers-provider-types-"));
  try {
    const reference = join(smithersJsHome(), "node_modules", "@smithers-orchestrator", "sandbox", "src", "SandboxProvider.ts");
    const ours = join(packageDir, "src", "index.ts");
    const header = `
import type { SandboxProvider, SandboxProviderRequest } from ${JSON.stringify(reference)};
import { createSmithersSandboxProvider } from ${JSON.stringify(ours)};
const ours = createSmithersSandboxProvider({ url: "http://127.0.0.1:7420", token: "a-token-of-some-length" });
`;
    const good = await typecheck(dir, `${header}
export const asTheirs: SandboxProvider = ours;
export const run = (request: SandboxProviderRequest) => ours.run(request);
export const cleanup = (request: SandboxProviderRequest) => ours.cleanup(request);
`);
    assert.equal(good.status, 0, good.output);
    const bad = await typecheck(dir, `${header}
export const broken: SandboxProvider = { ...ours, run: (request: { only: number }) => ours.run(request as never) };
`);
    assert.notEqual(bad.status, 0, "a provider with the wrong run signature must not type-check");
    assert.match(bad.output, /not assignable/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
