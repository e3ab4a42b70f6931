/**
 * `keepChangesOnce` on its own: the bundle handed to Smithers keeps each change once (in its
 * diffBundle), and a bundle that would make Smithers apply less than the step changed, or
 * that names a patch file outside `patches/`, is refused with nothing rewritten.
 */

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";

import { keepChangesOnce } from "../src/bundle.js";

const scratch: string[] = [];
after(async () => {
  for (const dir of scratch) await rm(dir, { recursive: true, force: true });
});

const diffBundle = {
  seq: 0,
  baseRef: "HEAD",
  patches: [
    { path: "a.txt", operation: "modify", diff: "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-one\n+two\n" },
    { path: "b/c.txt", operation: "add", diff: "--- /dev/null\n+++ b/b/c.txt\n@@ -0,0 +1 @@\n+new\n" },
  ],
};

async function bundle(manifest: Record<string, unknown>, files: Record<string, string>): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "smithers-provider-bundle-"));
  scratch.push(dir);
  for (const [name, content] of Object.entries(files)) {
    await mkdir(join(dir, name, ".."), { recursive: true });
    await writeFile(join(dir, name), content);
  }
  await writeFile(join(dir, "README.md"), JSON.stringify(manifest, null, 2));
  return dir;
}

test("patch files go, the diffBundle stays, and README.md lists no patches", async () => {
  const dir = await bundle(
    { outputs: { ok: true }, status: "finished", patches: ["patches/0001-a.txt.patch", "patches/b/0002-c.txt.patch"], diffBundle },
    { "patches/0001-a.txt.patch": "x", "patches/b/0002-c.txt.patch": "y", "artifacts/keep.txt": "kept" },
  );
  const report = await keepChangesOnce(dir, "test");
  assert.deepEqual(report, { patchFilesRemoved: 2, diffBundlePatches: 2 });
  const manifest = JSON.parse(await readFile(join(dir, "README.md"), "utf8"));
  assert.deepEqual(manifest.patches, []);
  assert.deepEqual(manifest.diffBundle, diffBundle);
  assert.deepEqual(manifest.outputs, { ok: true });
  assert.ok(!existsSync(join(dir, "patches")), "the emptied patches/ tree is gone");
  assert.equal(await readFile(join(dir, "artifacts/keep.txt"), "utf8"), "kept");
});

test("a bundle without changes is left as it is", async () => {
  const dir = await bundle({ outputs: null, status: "finished", patches: [] }, {});
  const before = await readFile(join(dir, "README.md"), "utf8");
  assert.deepEqual(await keepChangesOnce(dir, "test"), { patchFilesRemoved: 0, diffBundlePatches: 0 });
  assert.equal(await readFile(join(dir, "README.md"), "utf8"), before);
});

test("refused, with nothing rewritten: no diffBundle, host-changed files, paths outside patches/", async () => {
  const cases: Array<[string, Record<string, unknown>, RegExp, string]> = [
    ["no diffBundle", { status: "finished", patches: ["patches/0001-a.patch"] }, /no diffBundle/, "SANDBOX_EXECUTION_FAILED"],
    [
      "host changed",
      { status: "finished", patches: ["patches/0001-a.patch"], diffBundle, changeNotes: { hostChanged: ["a.txt"] } },
      /changed on the host/,
      "SANDBOX_EXECUTION_FAILED",
    ],
    ["escape", { status: "finished", patches: ["patches/../../etc/passwd"], diffBundle }, /outside patches/, "TOOL_PATH_ESCAPE"],
    ["absolute", { status: "finished", patches: ["/etc/passwd"], diffBundle }, /invalid patch path/, "TOOL_PATH_ESCAPE"],
    ["not patches/", { status: "finished", patches: ["README.md"], diffBundle }, /outside patches/, "TOOL_PATH_ESCAPE"],
  ];
  for (const [name, manifest, message, code] of cases) {
    const dir = await bundle(manifest, { "patches/0001-a.patch": "x" });
    const before = await readFile(join(dir, "README.md"), "utf8");
    await assert.rejects(keepChangesOnce(dir, "test"), (error: { code?: string; message?: string }) => {
      assert.equal(error.code, code, name);
      assert.match(String(error.message), message, name);
      return true;
    });
    assert.equal(await readFile(join(dir, "README.md"), "utf8"), before, `${name}: README.md untouched`);
    assert.ok(existsSync(join(dir, "patches/0001-a.patch")), `${name}: no patch file removed`);
  }
});

test("an oversized or unreadable README.md is refused", async () => {
  const dir = await bundle({}, {});
  await writeFile(join(dir, "README.md"), "{ not json");
  await assert.rejects(keepChangesOnce(dir, "test"), /unreadable README\.md/);
  await writeFile(join(dir, "README.md"), Buffer.alloc(5 * 1024 * 1024 + 1, 0x20));
  await assert.rejects(keepChangesOnce(dir, "test"), /README\.md over/);
});
