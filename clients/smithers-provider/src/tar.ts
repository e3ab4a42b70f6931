/**
 * A small streaming tar writer and a confined tar reader: the two archive formats of the
 * sandbox host API (`openapi/smithers-sandbox.yaml`).
 *
 * Writing (`packTree`): the workspace is walked depth first in byte order and emitted as POSIX
 * ustar entries, one chunk at a time, so a tree of any size is never held in memory. Names that
 * do not fit ustar's name/prefix fields get a PAX `path`/`linkpath` record, which the host's
 * reader (the Rust `tar` crate) honours. Symlinks travel as links and are never followed;
 * sockets, fifos and devices are not data and are left out; chosen names are skipped (`.smithers` at
 * any depth, `.git` at the top when asked, chosen paths: see `upload.ts`). Paths are handled as bytes, so names that are not UTF-8 survive.
 *
 * Reading (`unpackTar`): the result bundle comes from the network and is untrusted. It is
 * unpacked into a fresh staging directory under these rules: no absolute path, no `..`, no NUL
 * (TOOL_PATH_ESCAPE); no symlinks or hard links at all (a bundle may hold none,
 * TOOL_PATH_ESCAPE); no devices, fifos or other special entries (INVALID_INPUT); no entry twice
 * (INVALID_INPUT); bounded bytes, entries and path length (INVALID_INPUT). Files are created
 * with O_EXCL|O_NOFOLLOW and every parent directory is checked to be a real directory, so
 * nothing is ever written through a link.
 */

import { closeSync, constants as fsConstants, fstatSync, lstatSync, openSync, readdirSync, readlinkSync, readSync } from "node:fs";
import { lstat, mkdir, open } from "node:fs/promises";
import type { FileHandle } from "node:fs/promises";

import { ErrorCodes, SmithersSandboxError } from "./errors.js";

const BLOCK = 512;
const CHUNK = 64 * 1024;
const SLASH = Buffer.from("/");

// ---------------------------------------------------------------------------------------------
// Writing

export type PackOptions = {
  /** Top-level names left out (e.g. `.git` when it is not shipped). */
  skipTop?: string[];
  /** Names left out at any depth (`.smithers`: the host refuses it anywhere in an upload). */
  skipAnywhere?: string[];
  /** Root-relative paths left out (bytes as latin1, `/`-separated; a directory's ends with `/`). */
  skipPaths?: Set<string>;
  /**
   * Regular files added after the tree, at these root-relative paths (mode 0644; their parent
   * directories must be in the tree or among earlier extra files' parents, which are added).
   * A path the tree also holds is refused by the host as a duplicate entry.
   */
  extraFiles?: Array<{ path: string; content: Buffer }>;
};

export type PackStats = {
  entries: number;
  /** Bytes of regular file content. */
  bytes: number;
  /** Sockets, fifos and devices found and left out. */
  skippedSpecial: string[];
  /** Entries left out by `skipPaths` (a directory counts once). */
  skippedPaths: number;
};

function octal(value: number, width: number): Buffer {
  // width - 1 digits and a NUL terminator.
  const text = value.toString(8).padStart(width - 1, "0");
  return Buffer.from(`${text}\0`, "ascii");
}

const MAX_OCTAL_11 = 0o77777777777;

function writeNumeric(header: Buffer, offset: number, width: number, value: number): void {
  if (value <= MAX_OCTAL_11 || width !== 12) {
    octal(value, width).copy(header, offset);
    return;
  }
  // GNU base-256: high bit of the first byte set, the value big-endian in the rest.
  header.fill(0, offset, offset + width);
  header[offset] = 0x80;
  let v = BigInt(value);
  for (let i = offset + width - 1; i > offset && v > 0n; i--) {
    header[i] = Number(v & 0xffn);
    v >>= 8n;
  }
}

function checksum(header: Buffer): number {
  let sum = 0;
  for (let i = 0; i < BLOCK; i++) {
    sum += i >= 148 && i < 156 ? 0x20 : header[i]!;
  }
  return sum;
}

type HeaderFields = {
  name: Buffer;
  type: string;
  mode: number;
  size: number;
  mtime: number;
  linkname?: Buffer;
};

/** Splits a path into ustar `prefix` + `name`, or returns null when it does not fit. */
function splitUstar(path: Buffer): { prefix: Buffer; name: Buffer } | null {
  if (path.length <= 100) {
    return { prefix: Buffer.alloc(0), name: path };
  }
  // The prefix ends at a slash; the name after it must be 1..100 bytes.
  for (let i = Math.min(path.length - 2, 155); i > 0; i--) {
    if (path[i] === 0x2f && path.length - i - 1 <= 100) {
      return { prefix: path.subarray(0, i), name: path.subarray(i + 1) };
    }
  }
  return null;
}

function ustarHeader(f: HeaderFields): Buffer {
  const header = Buffer.alloc(BLOCK);
  const split = splitUstar(f.name);
  if (split === null) {
    throw new Error("internal: name does not fit ustar (a PAX record should have been written)");
  }
  split.name.copy(header, 0);
  octal(f.mode & 0o7777, 8).copy(header, 100);
  octal(0, 8).copy(header, 108);
  octal(0, 8).copy(header, 116);
  writeNumeric(header, 124, 12, f.size);
  writeNumeric(header, 136, 12, Math.max(0, Math.floor(f.mtime)));
  header.write(f.type, 156, "ascii");
  if (f.linkname !== undefined) {
    f.linkname.copy(header, 157);
  }
  header.write("ustar\0", 257, "binary");
  header.write("00", 263, "ascii");
  split.prefix.copy(header, 345);
  const sum = checksum(header);
  Buffer.from(`${sum.toString(8).padStart(6, "0")}\0 `, "ascii").copy(header, 148);
  return header;
}

function paxRecord(key: string, value: Buffer): Buffer {
  // "<len> <key>=<value>\n", where <len> counts the whole record including its own digits.
  const body = Buffer.concat([Buffer.from(` ${key}=`, "utf8"), value, Buffer.from("\n")]);
  let len = body.length + 1;
  while (String(len).length + body.length !== len) {
    len = String(len).length + body.length;
  }
  return Buffer.concat([Buffer.from(String(len), "ascii"), body]);
}

function padding(size: number): Buffer {
  const rest = size % BLOCK;
  return rest === 0 ? Buffer.alloc(0) : Buffer.alloc(BLOCK - rest);
}

/** The header block(s) of one entry: a PAX extension first when the names need it. */
function headerBlocks(f: HeaderFields): Buffer[] {
  const records: Buffer[] = [];
  let name = f.name;
  let linkname = f.linkname;
  if (splitUstar(f.name) === null) {
    records.push(paxRecord("path", f.name));
    // A readable stand-in for readers without PAX support (the PAX path wins everywhere else):
    // the end of the path, printable ASCII only.
    const tail = f.name.subarray(Math.max(0, f.name.length - 99)).toString("latin1");
    name = Buffer.from(tail.replace(/[^\x20-\x7e]/g, "_").replace(/^\/+/, ""), "latin1");
  }
  if (linkname !== undefined && linkname.length > 100) {
    records.push(paxRecord("linkpath", linkname));
    linkname = Buffer.alloc(0);
  }
  const out: Buffer[] = [];
  if (records.length > 0) {
    const data = Buffer.concat(records);
    out.push(
      ustarHeader({ name: Buffer.from("PaxHeader"), type: "x", mode: 0o644, size: data.length, mtime: f.mtime }),
      data,
      padding(data.length),
    );
  }
  out.push(ustarHeader({ ...f, name, ...(linkname === undefined ? {} : { linkname }) }));
  return out;
}

function displayPath(path: Buffer): string {
  return path.toString("utf8");
}

/**
 * Reads exactly `size` bytes of an open file whose header already promised `size`, in chunks: a
 * file that shrank while being packed is an error (the archive would be corrupt), one that grew
 * is cut at the size it had when stat'ed.
 */
function* readExactly(fd: number, size: number, path: Buffer): Generator<Buffer> {
  let remaining = size;
  let position = 0;
  while (remaining > 0) {
    const want = Math.min(CHUNK, remaining);
    // A fresh buffer per chunk: the consumer may still hold the previous one.
    const buf = Buffer.allocUnsafe(want);
    const n = readSync(fd, buf, 0, want, position);
    if (n === 0) {
      throw new SmithersSandboxError(ErrorCodes.SANDBOX_EXECUTION_FAILED, `${displayPath(path)} shrank while being archived`, {
        details: { path: displayPath(path) },
      });
    }
    position += n;
    remaining -= n;
    yield buf.subarray(0, n);
  }
}

/**
 * Yields `root` as a tar stream (sorted, so the same tree gives the same archive), never
 * following a symlink. `stats` is filled in as the walk goes.
 *
 * The file system is read with synchronous calls, one file (or one 64 KiB chunk) between two
 * yields: on a busy machine the promise API queues every lstat/open/read on libuv's small
 * thread pool and packed a tree of 10,000 small files 6x slower. The event loop still gets a
 * turn after every chunk. Files are opened O_NOFOLLOW|O_NONBLOCK, so a file swapped for a link
 * or a fifo since the lstat is refused or skipped, never followed or waited on.
 */
export async function* packTree(root: string, options: PackOptions, stats: PackStats): AsyncGenerator<Buffer> {
  const rootBytes = Buffer.from(root);
  const skip = new Set((options.skipTop ?? []).map((s) => Buffer.from(s).toString("latin1")));
  const skipAnywhere = new Set((options.skipAnywhere ?? []).map((s) => Buffer.from(s).toString("latin1")));
  const skipPaths = options.skipPaths !== undefined && options.skipPaths.size > 0 ? options.skipPaths : undefined;
  const stack: Buffer[] = [Buffer.alloc(0)];
  while (stack.length > 0) {
    const relDir = stack.pop()!;
    const absDir = relDir.length === 0 ? rootBytes : Buffer.concat([rootBytes, SLASH, relDir]);
    const names = readdirSync(absDir, { encoding: "buffer" }).sort(Buffer.compare);
    const subdirs: Buffer[] = [];
    for (const name of names) {
      if ((relDir.length === 0 && skip.has(name.toString("latin1"))) || skipAnywhere.has(name.toString("latin1"))) {
        continue;
      }
      const rel = relDir.length === 0 ? name : Buffer.concat([relDir, SLASH, name]);
      const abs = Buffer.concat([rootBytes, SLASH, rel]);
      const st = lstatSync(abs);
      if (skipPaths !== undefined) {
        const key = rel.toString("latin1");
        if (skipPaths.has(key) || (st.isDirectory() && skipPaths.has(`${key}/`))) {
          stats.skippedPaths += 1;
          continue;
        }
      }
      const mtime = st.mtimeMs / 1000;
      if (st.isDirectory()) {
        yield Buffer.concat(headerBlocks({ name: Buffer.concat([rel, SLASH]), type: "5", mode: st.mode, size: 0, mtime }));
        subdirs.push(rel);
      } else if (st.isFile()) {
        const fd = openSync(abs, fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW | fsConstants.O_NONBLOCK);
        try {
          const info = fstatSync(fd);
          if (!info.isFile()) {
            stats.skippedSpecial.push(displayPath(rel));
            continue;
          }
          const size = info.size;
          const header = headerBlocks({ name: rel, type: "0", mode: info.mode, size, mtime });
          if (size <= CHUNK) {
            // Small file: header, content and padding in one chunk.
            const parts = [...header, ...readExactly(fd, size, rel), padding(size)];
            yield Buffer.concat(parts);
          } else {
            yield Buffer.concat(header);
            for (const chunk of readExactly(fd, size, rel)) {
              yield chunk;
            }
            const pad = padding(size);
            if (pad.length > 0) {
              yield pad;
            }
          }
          stats.bytes += size;
        } finally {
          closeSync(fd);
        }
      } else if (st.isSymbolicLink()) {
        const target = readlinkSync(abs, { encoding: "buffer" });
        yield Buffer.concat(headerBlocks({ name: rel, type: "2", mode: 0o777, size: 0, mtime, linkname: target }));
      } else {
        stats.skippedSpecial.push(displayPath(rel));
        continue;
      }
      stats.entries += 1;
    }
    // Depth first in sorted order: push in reverse so the first subdirectory comes next.
    for (let i = subdirs.length - 1; i >= 0; i--) {
      stack.push(subdirs[i]!);
    }
  }
  const made = new Set<string>();
  for (const extra of options.extraFiles ?? []) {
    const parts = extra.path.split("/").filter((p) => p !== "" && p !== ".");
    if (parts.length === 0 || parts.includes("..")) throw new SmithersSandboxError(ErrorCodes.TOOL_PATH_ESCAPE, `extra file path ${JSON.stringify(extra.path)} leaves the workspace`);
    for (let i = 1; i < parts.length; i++) {
      const dir = parts.slice(0, i).join("/");
      if (!made.has(dir) && !existsSyncSafe(Buffer.concat([rootBytes, SLASH, Buffer.from(dir)]))) {
        made.add(dir);
        yield Buffer.concat(headerBlocks({ name: Buffer.from(`${dir}/`), type: "5", mode: 0o40755, size: 0, mtime: Date.now() / 1000 }));
        stats.entries += 1;
      }
    }
    const size = extra.content.length;
    yield Buffer.concat([...headerBlocks({ name: Buffer.from(parts.join("/")), type: "0", mode: 0o100644, size, mtime: Date.now() / 1000 }), extra.content, padding(size)]);
    stats.entries += 1;
    stats.bytes += size;
  }
  // End of archive: two zero blocks.
  yield Buffer.alloc(BLOCK * 2);
}

function existsSyncSafe(path: Buffer): boolean {
  try {
    lstatSync(path);
    return true;
  } catch {
    return false;
  }
}

// ---------------------------------------------------------------------------------------------
// Reading

export type UnpackLimits = {
  /** Total bytes of regular file content. */
  maxTotalBytes: number;
  /** Number of entries of any type. */
  maxEntries: number;
  /** Length in bytes of one entry path. */
  maxPathBytes: number;
};

/** The bundle format's limits: 100 MiB, and room for 1000 patches + 1000 artifacts + the rest. */
export const BUNDLE_LIMITS: UnpackLimits = {
  maxTotalBytes: 100 * 1024 * 1024,
  maxEntries: 4096,
  maxPathBytes: 4096,
};

export type UnpackStats = { entries: number; bytes: number };

/** Pulls exact byte counts out of a stream of chunks. */
class ByteSource {
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  private done = false;

  constructor(private readonly iterator: AsyncIterator<Uint8Array>) {}

  private async fill(n: number): Promise<void> {
    while (this.pendingBytes < n && !this.done) {
      const next = await this.iterator.next();
      if (next.done) {
        this.done = true;
        break;
      }
      const chunk = Buffer.from(next.value.buffer, next.value.byteOffset, next.value.byteLength);
      if (chunk.length > 0) {
        this.pending.push(chunk);
        this.pendingBytes += chunk.length;
      }
    }
  }

  /** At most `n` bytes (fewer only at the end of the stream), as soon as some are there. */
  private async take(n: number): Promise<Buffer> {
    await this.fill(1);
    const first = this.pending[0];
    if (first === undefined) {
      return Buffer.alloc(0);
    }
    if (first.length <= n) {
      this.pending.shift();
      this.pendingBytes -= first.length;
      return first;
    }
    this.pending[0] = first.subarray(n);
    this.pendingBytes -= n;
    return first.subarray(0, n);
  }

  /** Exactly `n` bytes; null at a clean end of stream; an error when it ends inside them. */
  async readExact(n: number): Promise<Buffer | null> {
    await this.fill(n);
    if (this.pendingBytes === 0 && this.done) {
      return null;
    }
    if (this.pendingBytes < n) {
      throw malformed(`the archive ends in the middle of a block (${this.pendingBytes} of ${n} bytes)`, true);
    }
    const parts: Buffer[] = [];
    let need = n;
    while (need > 0) {
      const part = await this.take(need);
      parts.push(part);
      need -= part.length;
    }
    return parts.length === 1 ? parts[0]! : Buffer.concat(parts);
  }

  /** Passes exactly `n` bytes to `sink` chunk by chunk. */
  async forward(n: number, sink: (chunk: Buffer) => Promise<void>): Promise<void> {
    let need = n;
    while (need > 0) {
      const part = await this.take(Math.min(need, CHUNK * 4));
      if (part.length === 0) {
        throw malformed("the archive ends in the middle of an entry", true);
      }
      await sink(part);
      need -= part.length;
    }
  }

  async skip(n: number): Promise<void> {
    await this.forward(n, async () => {});
  }
}

/** `truncated`: the stream ended early (a transport failure worth retrying, not bad data). */
function malformed(reason: string, truncated = false): SmithersSandboxError {
  return new SmithersSandboxError(ErrorCodes.INVALID_INPUT, `malformed bundle archive: ${reason}`, {
    details: truncated ? { truncated: true } : null,
  });
}

function escape(path: string, reason: string): SmithersSandboxError {
  return new SmithersSandboxError(ErrorCodes.TOOL_PATH_ESCAPE, `bundle archive entry ${JSON.stringify(path)} ${reason}`, {
    details: { path },
  });
}

function tooLarge(limit: string, max: number): SmithersSandboxError {
  return new SmithersSandboxError(ErrorCodes.INVALID_INPUT, `the bundle archive exceeds the ${limit} limit of ${max}`, {
    details: { limit, max },
  });
}

function cString(field: Buffer): Buffer {
  const nul = field.indexOf(0);
  return nul === -1 ? field : field.subarray(0, nul);
}

function parseNumeric(field: Buffer, what: string): number {
  if (field[0]! & 0x80) {
    // Base-256 (GNU): the value big-endian, the first byte's high bit is the marker.
    let v = BigInt(field[0]! & 0x7f);
    for (let i = 1; i < field.length; i++) {
      v = (v << 8n) | BigInt(field[i]!);
    }
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) {
      throw malformed(`${what} out of range`);
    }
    return Number(v);
  }
  const text = cString(field).toString("ascii").replace(/ /g, "");
  if (text === "") {
    return 0;
  }
  if (!/^[0-7]+$/.test(text)) {
    throw malformed(`${what} is not an octal number: ${JSON.stringify(text)}`);
  }
  return parseInt(text, 8);
}

function parsePax(data: Buffer): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  let pos = 0;
  while (pos < data.length) {
    const space = data.indexOf(0x20, pos);
    if (space === -1) {
      throw malformed("a PAX record without a length");
    }
    const len = Number(data.subarray(pos, space).toString("ascii"));
    if (!Number.isInteger(len) || len <= 0 || pos + len > data.length) {
      throw malformed("a PAX record with a bad length");
    }
    const record = data.subarray(space + 1, pos + len - 1); // without the trailing newline
    const eq = record.indexOf(0x3d);
    if (eq === -1) {
      throw malformed("a PAX record without '='");
    }
    out.set(record.subarray(0, eq).toString("utf8"), record.subarray(eq + 1));
    pos += len;
  }
  return out;
}

/** The plain components of an entry path; throws on absolute paths, `..` and NUL. */
function plainComponents(raw: Buffer): Buffer[] {
  const shown = raw.toString("utf8");
  if (raw.includes(0)) {
    throw escape(shown, "contains a NUL byte");
  }
  if (raw[0] === 0x2f) {
    throw escape(shown, "is an absolute path");
  }
  const parts: Buffer[] = [];
  let start = 0;
  for (let i = 0; i <= raw.length; i++) {
    if (i === raw.length || raw[i] === 0x2f) {
      const part = raw.subarray(start, i);
      start = i + 1;
      if (part.length === 0 || (part.length === 1 && part[0] === 0x2e)) {
        continue;
      }
      if (part.length === 2 && part[0] === 0x2e && part[1] === 0x2e) {
        throw escape(shown, "contains '..'");
      }
      parts.push(part);
    }
  }
  return parts;
}

function join(base: Buffer, parts: Buffer[]): Buffer {
  const pieces: Buffer[] = [base];
  for (const p of parts) {
    pieces.push(SLASH, p);
  }
  return Buffer.concat(pieces);
}

/** Creates every directory of `parts` under `base`, checking each is a real directory. */
async function ensureDirs(base: Buffer, parts: Buffer[], shown: string): Promise<void> {
  for (let i = 1; i <= parts.length; i++) {
    const dir = join(base, parts.slice(0, i));
    try {
      await mkdir(dir, { mode: 0o755 });
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") {
        throw error;
      }
    }
    const st = await lstat(dir);
    if (st.isSymbolicLink()) {
      throw escape(shown, "would be written through a symlink");
    }
    if (!st.isDirectory()) {
      throw new SmithersSandboxError(ErrorCodes.INVALID_INPUT, `bundle archive entry ${JSON.stringify(shown)} collides with an earlier entry`, {
        details: { path: shown },
      });
    }
  }
}

/**
 * Unpacks a plain tar stream into `dest`, an existing empty directory, under the rules of the
 * module documentation. On error `dest` may hold part of the archive: it is a staging
 * directory, the caller removes it.
 */
export async function unpackTar(
  chunks: AsyncIterable<Uint8Array>,
  dest: string,
  limits: UnpackLimits = BUNDLE_LIMITS,
): Promise<UnpackStats> {
  const source = new ByteSource(chunks[Symbol.asyncIterator]());
  const base = Buffer.from(dest);
  const stats: UnpackStats = { entries: 0, bytes: 0 };
  let longName: Buffer | null = null;
  let pax: Map<string, Buffer> | null = null;
  const readData = async (size: number, what: string): Promise<Buffer> => {
    if (size > 1024 * 1024) {
      throw malformed(`a ${what} of ${size} bytes`);
    }
    const data = size === 0 ? Buffer.alloc(0) : await source.readExact(size);
    if (data === null) {
      throw malformed(`the archive ends inside a ${what}`, true);
    }
    await source.skip(padding(size).length);
    return data;
  };
  for (;;) {
    const header = await source.readExact(BLOCK);
    if (header === null) {
      // The host always ends its archives with the end marker: without it the transfer broke
      // off, and a bundle missing its tail must not pass for a complete one.
      throw malformed("the archive ends without its end-of-archive marker", true);
    }
    if (header.every((b) => b === 0)) {
      break; // end-of-archive marker
    }
    const stored = parseNumeric(header.subarray(148, 156), "checksum");
    let signed = 0;
    for (let i = 0; i < BLOCK; i++) {
      signed += i >= 148 && i < 156 ? 0x20 : ((header[i]! << 24) >> 24);
    }
    if (stored !== checksum(header) && stored !== signed) {
      throw malformed("a header checksum does not match");
    }
    const type = String.fromCharCode(header[156]!);
    let size = parseNumeric(header.subarray(124, 136), "size");
    if (type === "L") {
      longName = cString(await readData(size, "long name"));
      continue;
    }
    if (type === "K") {
      await readData(size, "long link name");
      continue; // links are refused below whatever their target
    }
    if (type === "x") {
      pax = parsePax(await readData(size, "PAX header"));
      continue;
    }
    if (type === "g") {
      await readData(size, "global PAX header");
      continue;
    }
    const isUstar = header.subarray(257, 263).toString("binary") === "ustar\0";
    let rawName: Buffer;
    if (longName !== null) {
      rawName = longName;
    } else if (pax?.has("path")) {
      rawName = pax.get("path")!;
    } else {
      const name = cString(header.subarray(0, 100));
      const prefix = isUstar ? cString(header.subarray(345, 500)) : Buffer.alloc(0);
      rawName = prefix.length > 0 ? Buffer.concat([prefix, SLASH, name]) : name;
    }
    if (pax?.has("size")) {
      const paxSize = Number(pax.get("size")!.toString("ascii"));
      if (!Number.isSafeInteger(paxSize) || paxSize < 0) {
        throw malformed("a PAX size that is not a number");
      }
      size = paxSize;
    }
    longName = null;
    pax = null;
    stats.entries += 1;
    if (stats.entries > limits.maxEntries) {
      throw tooLarge("entries", limits.maxEntries);
    }
    if (rawName.length > limits.maxPathBytes) {
      throw tooLarge("pathBytes", limits.maxPathBytes);
    }
    const shown = rawName.toString("utf8");
    const parts = plainComponents(rawName);
    const mode = parseNumeric(header.subarray(100, 108), "mode") & 0o777;
    switch (type) {
      case "5": {
        if (parts.length > 0) {
          await ensureDirs(base, parts, shown);
        }
        await source.skip(size + padding(size).length);
        break;
      }
      case "0":
      case "\0":
      case "7": {
        if (parts.length === 0) {
          throw escape(shown, "is not a directory but names the destination itself");
        }
        if (stats.bytes + size > limits.maxTotalBytes) {
          throw tooLarge("totalBytes", limits.maxTotalBytes);
        }
        await ensureDirs(base, parts.slice(0, -1), shown);
        let fh: FileHandle;
        try {
          fh = await open(
            join(base, parts),
            fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_EXCL | fsConstants.O_NOFOLLOW,
            (mode | 0o600) & 0o777,
          );
        } catch (error) {
          if ((error as NodeJS.ErrnoException).code === "EEXIST") {
            throw new SmithersSandboxError(ErrorCodes.INVALID_INPUT, `bundle archive entry ${JSON.stringify(shown)} collides with an earlier entry`, {
              details: { path: shown },
            });
          }
          throw error;
        }
        try {
          await source.forward(size, async (chunk) => {
            let off = 0;
            while (off < chunk.length) {
              const { bytesWritten } = await fh.write(chunk, off, chunk.length - off);
              off += bytesWritten;
            }
          });
        } finally {
          await fh.close();
        }
        stats.bytes += size;
        await source.skip(padding(size).length);
        break;
      }
      case "1":
        throw escape(shown, "is a hard link; hard links are not allowed in a bundle");
      case "2":
        throw escape(shown, "is a symlink; symlinks are not allowed in a bundle");
      default: {
        const kinds: Record<string, string> = { "3": "character device", "4": "block device", "6": "fifo", S: "sparse file" };
        throw new SmithersSandboxError(
          ErrorCodes.INVALID_INPUT,
          `bundle archive entry ${JSON.stringify(shown)} has unsupported type ${kinds[type] ?? JSON.stringify(type)}`,
          { details: { path: shown, kind: kinds[type] ?? type } },
        );
      }
    }
  }
  return stats;
}
