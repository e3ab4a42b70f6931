/**
 * The bundle handed to Smithers carries each change once.
 *
 * The host's bundle holds the changes twice: as patch files (`patches/*.patch`, the source of
 * truth of our own review and accept) and as the manifest's `diffBundle` (what a JavaScript
 * caller applies). Smithers' `executeSandbox` adds the two up (2 changed files showed as
 * `patchCount 4` and twice the diff lines) and applies only the `diffBundle`. So before the
 * bundle is handed over, its patch files are removed and `patches` is emptied: what Smithers
 * counts, reviews and applies is then the same single list.
 *
 * Refused, rather than handed over short (each would make Smithers apply less than the step
 * changed, without a word):
 * - patch files and no `diffBundle` (it did not fit the 5 MiB README limit);
 * - changes the host left out of the `diffBundle` because the host's copy changed while the
 *   step ran (`changeNotes.hostChanged`).
 *
 * The bundle is the host's, and untrusted: README.md is read bounded, and every path it lists is
 * confined to `patches/` before it is removed.
 */

import { lstat, readFile, rename, rm, rmdir, unlink, writeFile } from "node:fs/promises";
import { isAbsolute, join, normalize, sep } from "node:path";

import { ErrorCodes, SmithersSandboxError } from "./errors.js";

/** SANDBOX_MAX_README_BYTES of the bundle format. */
export const MAX_README_BYTES = 5 * 1024 * 1024;

function refuse(message: string, details: Record<string, unknown>): SmithersSandboxError {
  return new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, message, { details });
}

function patchFilePath(dir: string, listed: unknown): string {
  if (typeof listed !== "string" || listed === "" || isAbsolute(listed) || listed.includes("\0")) {
    throw new SmithersSandboxError(ErrorCodes.TOOL_PATH_ESCAPE, `the bundle lists an invalid patch path ${JSON.stringify(listed)}`);
  }
  const rel = normalize(listed);
  if (!rel.startsWith(`patches${sep}`) || rel.split(sep).includes("..")) {
    throw new SmithersSandboxError(ErrorCodes.TOOL_PATH_ESCAPE, `the bundle lists a patch outside patches/: ${JSON.stringify(listed)}`);
  }
  return join(dir, rel);
}

/**
 * The manifest (README.md) of the unpacked bundle at `dir`, read bounded
 * ({@link MAX_README_BYTES}) and never through a link; `where` names the sandbox in errors.
 */
export async function readManifest(dir: string, where: string): Promise<Record<string, unknown>> {
  const readmePath = join(dir, "README.md");
  const info = await lstat(readmePath).catch(() => null);
  if (!info || !info.isFile()) throw refuse(`the bundle of ${where} has no README.md manifest`, { sandbox: where });
  if (info.size > MAX_README_BYTES) throw refuse(`the bundle of ${where} has a README.md over ${MAX_README_BYTES} bytes`, { sandbox: where });
  try {
    const parsed: unknown = JSON.parse(await readFile(readmePath, "utf8"));
    if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) throw new Error("not an object");
    return parsed as Record<string, unknown>;
  } catch (error) {
    throw refuse(`the bundle of ${where} has an unreadable README.md: ${error instanceof Error ? error.message : String(error)}`, { sandbox: where });
  }
}

export type SingleSourceReport = { patchFilesRemoved: number; diffBundlePatches: number };

/**
 * Rewrites the unpacked bundle at `dir` (not yet visible to Smithers) so that its changes are
 * only in `diffBundle` (see the module comment). `where` names the sandbox in errors.
 */
export async function keepChangesOnce(dir: string, where: string): Promise<SingleSourceReport> {
  const readmePath = join(dir, "README.md");
  const manifest = await readManifest(dir, where);
  const patches = Array.isArray(manifest.patches) ? (manifest.patches as unknown[]) : [];
  const diffBundle = manifest.diffBundle as { patches?: unknown } | undefined;
  const diffPatches = diffBundle && Array.isArray(diffBundle.patches) ? diffBundle.patches.length : 0;
  if (patches.length === 0) return { patchFilesRemoved: 0, diffBundlePatches: diffPatches };
  if (diffBundle === undefined || diffBundle === null) {
    throw refuse(
      `the bundle of ${where} holds ${patches.length} patch file(s) but no diffBundle (it did not fit README.md's 5 MiB limit); Smithers applies only a diffBundle, so these changes cannot land through it. Review and accept them with the smithers-sandbox CLI on the host instead`,
      { sandbox: where, patchFiles: patches.length },
    );
  }
  const notes = manifest.changeNotes as { hostChanged?: unknown } | undefined;
  const hostChanged = Array.isArray(notes?.hostChanged) ? (notes!.hostChanged as unknown[]).map(String) : [];
  if (hostChanged.length > 0) {
    const shown = hostChanged.slice(0, 10).map((p) => JSON.stringify(p)).join(", ");
    throw refuse(
      `${hostChanged.length} change(s) of ${where} are to files that changed on the host while the step ran (${shown}${hostChanged.length > 10 ? ", …" : ""}); they are in the patch files only, and Smithers would apply the rest without them`,
      { sandbox: where, hostChanged: hostChanged.slice(0, 100) },
    );
  }
  const files = patches.map((p) => patchFilePath(dir, p));
  for (const file of files) {
    await unlink(file).catch((error: NodeJS.ErrnoException) => {
      if (error.code !== "ENOENT") throw error;
    });
  }
  // Empty directories left under patches/ (grouped patches live in subdirectories).
  const dirs = new Set<string>();
  for (const file of files) {
    let d = file.slice(0, file.lastIndexOf(sep));
    while (d.length > dir.length) {
      dirs.add(d);
      d = d.slice(0, d.lastIndexOf(sep));
    }
  }
  for (const d of [...dirs].sort((a, b) => b.length - a.length)) {
    await rmdir(d).catch(() => undefined);
  }
  manifest.patches = [];
  // README.md is written last in a bundle: the new one replaces the old whole.
  const tmp = join(dir, ".README.md.tmp");
  await writeFile(tmp, `${JSON.stringify(manifest, null, 2)}\n`, { mode: 0o644 });
  await rename(tmp, readmePath).catch(async (error: unknown) => {
    await rm(tmp, { force: true });
    throw error;
  });
  return { patchFilesRemoved: files.length, diffBundlePatches: diffPatches };
}
