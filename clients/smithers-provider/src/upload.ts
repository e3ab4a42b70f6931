/**
 * What of `rootDir` is uploaded to the host, and what is left out (and why).
 *
 * Left out:
 * - `.smithers/` at any depth (the project's own state; the host refuses it in an upload);
 * - `.git/` at the top when `includeGit: false`;
 * - Smithers' database and its sidecars (`smithers.db`, `-wal`, `-shm`, `-journal`) at any
 *   depth, and wherever else the run's store is when it is inside `rootDir`: the file the
 *   workflow's own database handle names (`request.parentWorkflow.db`, a `dbPath` given to
 *   `createSmithers`), the `databasePath` option and `$SMITHERS_DB`. Uploaded, the whole run
 *   history (prompts, outputs, approvals) would be readable by the step;
 * - what git ignores (`.gitignore` files at every level, `.git/info/exclude`, the user's
 *   `core.excludesFile`), asked of git itself so the rules are git's exactly. Outside a
 *   repository the `.gitignore` files still apply (git is run on a scratch repository whose
 *   work tree is `rootDir`). Files git tracks are uploaded even when a pattern matches them,
 *   as git would.
 *
 * A `rootDir` that holds a `.gitignore` on a machine without git fails: the provider would
 * otherwise upload what the user meant to keep out, silently.
 */

import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { isAbsolute, join, relative, resolve, sep } from "node:path";

import { ErrorCodes, SmithersSandboxError } from "./errors.js";

/** The names of Smithers' SQLite database and the files SQLite keeps beside it. */
export const SMITHERS_DB_NAMES = ["smithers.db", "smithers.db-wal", "smithers.db-shm", "smithers.db-journal"];

export type UploadSelection = {
  /** Names left out at any depth. */
  skipAnywhere: string[];
  /** Names left out at the top. */
  skipTop: string[];
  /** Paths relative to the root (bytes as latin1, `/`-separated) left out; a directory's ends with `/`. */
  skipPaths: Set<string>;
  /** How many paths git's ignore rules left out (files, or whole directories). */
  gitIgnored: number;
};

export type UploadOptions = {
  includeGit?: boolean;
  /** Honour `.gitignore` (default true). */
  honourGitignore?: boolean;
  /** Where Smithers keeps its database, if not a `smithers.db` in the tree (also `$SMITHERS_DB`). */
  databasePath?: string;
  /** More database files to leave out (the workflow's own, see {@link workflowDatabasePath}). */
  databasePaths?: string[];
};

/**
 * The file of the SQLite database the workflow runs on (`request.parentWorkflow.db`, a Drizzle
 * handle over bun:sqlite whose client names its file; relative names are the engine's, from
 * its working directory), or undefined (an in-memory store, another backend, an unknown shape).
 */
export function workflowDatabasePath(request: { parentWorkflow?: unknown }): string | undefined {
  const workflow = request.parentWorkflow as { db?: { $client?: { filename?: unknown } } } | undefined;
  const name = workflow?.db?.$client?.filename;
  if (typeof name !== "string" || name === "" || name === ":memory:") return undefined;
  return resolve(process.cwd(), name);
}

function git(args: string[], cwd: string, env?: NodeJS.ProcessEnv): { status: number | null; stdout: Buffer; error?: Error } {
  const out = spawnSync("git", args, {
    cwd,
    encoding: "buffer",
    maxBuffer: 256 * 1024 * 1024,
    stdio: ["ignore", "pipe", "pipe"],
    env: env ?? process.env,
  });
  return out.error ? { status: null, stdout: Buffer.alloc(0), error: out.error } : { status: out.status, stdout: out.stdout };
}

/** `-z` output split into latin1 strings (the packer compares paths as latin1 of their bytes). */
function nulSeparated(buf: Buffer): string[] {
  const out: string[] = [];
  let start = 0;
  for (let i = 0; i < buf.length; i++) {
    if (buf[i] === 0) {
      if (i > start) out.push(buf.subarray(start, i).toString("latin1"));
      start = i + 1;
    }
  }
  return out;
}

/** The untracked paths git ignores under `root` (directories as one `dir/` entry). */
function gitIgnoredPaths(root: string): string[] {
  // A project's own git configuration could name a program for git to run (core.fsmonitor):
  // switched off, so listing what is ignored never runs anything of the tree's.
  const listArgs = ["-c", "core.fsmonitor=false", "ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory"];
  const inside = git(["rev-parse", "--is-inside-work-tree"], root);
  if (inside.error) {
    throw new SmithersSandboxError(
      ErrorCodes.TASK_RUNTIME_UNAVAILABLE,
      `${root} has a .gitignore but git cannot be run (${inside.error.message}): without it the upload would include what .gitignore keeps out`,
      { details: { fix: "install git, or pass honourGitignore: false to upload ignored files too" } },
    );
  }
  // The paths are listed relative to the current directory, which is `root` in both cases.
  const env = { ...process.env, GIT_LITERAL_PATHSPECS: undefined, GIT_DIR: undefined, GIT_WORK_TREE: undefined };
  if (inside.status === 0 && inside.stdout.toString().trim() === "true") {
    const listed = git(listArgs, root, env);
    if (listed.status !== 0) {
      throw new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, `git ls-files in ${root} failed (exit ${listed.status}): cannot tell what .gitignore keeps out`);
    }
    return nulSeparated(listed.stdout);
  }
  // Not a repository: a scratch one whose work tree is `root`, so git reads its .gitignore files.
  const scratch = mkdtempSync(join(tmpdir(), "smithers-provider-ignore-"));
  try {
    const init = git(["init", "-q", "--bare", scratch], root, env);
    if (init.status !== 0) throw new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, `git init of a scratch repository failed (exit ${init.status})`);
    const listed = git([`--git-dir=${scratch}`, `--work-tree=${root}`, ...listArgs], root, env);
    if (listed.status !== 0) {
      throw new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, `git ls-files over ${root} failed (exit ${listed.status}): cannot tell what .gitignore keeps out`);
    }
    return nulSeparated(listed.stdout);
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}

function hasGitignore(root: string): boolean {
  if (existsSync(join(root, ".gitignore"))) return true;
  // Nested ones count too, but a walk here would cost as much as the upload; git is asked
  // whenever it exists, so only "no git and a top-level .gitignore" is refused.
  return false;
}

/** Decides what of `root` is uploaded (see the module comment). */
export function selectUpload(root: string, options: UploadOptions = {}): UploadSelection {
  const skipPaths = new Set<string>();
  const databases = [options.databasePath, process.env.SMITHERS_DB, ...(options.databasePaths ?? [])];
  for (const dbPath of databases) {
    if (dbPath === undefined || dbPath.trim() === "") continue;
    const abs = resolve(root, dbPath);
    const rel = relative(resolve(root), abs);
    if (rel !== "" && !rel.startsWith("..") && !isAbsolute(rel)) {
      const base = rel.split(sep).join("/");
      for (const suffix of ["", "-wal", "-shm", "-journal"]) {
        skipPaths.add(Buffer.from(base + suffix).toString("latin1"));
      }
    }
  }
  let gitIgnored = 0;
  if (options.honourGitignore !== false) {
    const gitAvailable = !git(["--version"], root).error;
    if (gitAvailable || hasGitignore(root)) {
      for (const p of gitIgnoredPaths(root)) {
        skipPaths.add(p);
        gitIgnored += 1;
      }
    }
  }
  return {
    skipAnywhere: [".smithers", ...SMITHERS_DB_NAMES],
    skipTop: options.includeGit === false ? [".git"] : [],
    skipPaths,
    gitIgnored,
  };
}
