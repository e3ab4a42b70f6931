#!/usr/bin/env node
// Batch driver for the compatibility tests: runs many validate/write operations of the REAL
// JavaScript package (@smithers-orchestrator/sandbox) in one Node process, because one
// process per operation costs ~1 s (the package's imports) and the tests run ~100 of them.
//
// It loads the package from the same place as ../../../../shared/tools/smithers-js/
// smithers-bundle.mjs ($SMITHERS_JS_HOME, default ~/.cache/smithers-js; the tests run that tool
// first, which installs the package) and reports results and errors in the tool's format:
// a result as {"ok": <value>}, a rejection as {"error": {"code", "message"}}.
//
//   node batch.mjs <ops.json>    ops: [{"op": "validate", "dir"}, {"op": "write", "dir", "specFile"}]
import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const home = process.env.SMITHERS_JS_HOME ?? join(homedir(), ".cache", "smithers-js");
const pkgDir = join(home, "node_modules", "@smithers-orchestrator", "sandbox");
const bundle = await import(pathToFileURL(join(pkgDir, "src", "bundle.js")).href);

const ops = JSON.parse(readFileSync(process.argv[2], "utf8"));
const results = [];
for (const op of ops) {
  try {
    if (op.op === "validate") {
      results.push({ ok: await bundle.validateSandboxBundle(op.dir) });
    } else if (op.op === "write") {
      // Parsed exactly as the tool parses its spec file.
      const spec = JSON.parse(readFileSync(op.specFile, "utf8"));
      await bundle.writeSandboxBundle({ bundlePath: op.dir, ...spec });
      results.push({ ok: true });
    } else {
      throw new Error(`unknown op ${op.op}`);
    }
  } catch (error) {
    results.push({ error: { code: error?.code ?? null, message: error?.summary ?? error?.message ?? String(error) } });
  }
}
// Each result on its own line: a consumer can parse them without one huge document.
for (const r of results) console.log(JSON.stringify(r));
