/**
 * The archive code on its own: the workspace packer round-trips a tree (long names, names
 * that are not UTF-8, empty and multi-chunk files) and stores links as links; the bundle
 * unpacker refuses every path trick and entry type a hostile host could send, and writes
 * nothing outside its destination. Archives for the refusals are built byte by byte here,
 * independently of the packer under test.
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdir, mkdtemp, readdir, readFile, readlink, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { after, test } from "node:test";

import { packTree, unpackTar } from "../src/tar.js";
import type { PackStats, UnpackLimits } from "../src/tar.js";

const scratch: string[] = [];
after(async () => {
  for (const dir of scratch) await rm(dir, { recursive: true, force: true });
});

async function tempDir(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "smithers-provider-tar-"));
  scratch.push(dir);
  return dir;
}

async function collect(gen: AsyncIterable<Buffer>): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const part of gen) parts.push(part);
  return Buffer.concat(parts);
}

/** Feeds `data` in small uneven chunks, as a network stream would. */
function chunked(data: Buffer): AsyncIterable<Uint8Array> {
  const sizes = [1, 7, 511, 513, 4096, 100];
  return Readable.from(
    (function* () {
      let pos = 0;
      let i = 0;
      while (pos < data.length) {
        const n = sizes[i++ % sizes.length]!;
        yield data.subarray(pos, pos + n);
        pos += n;
      }
    })(),
  );
}

// --- an independent, minimal ustar header builder for hand-made archives -------------------

function rawHeader(name: string | Buffer, type: string, size: number, linkname = "", magic: "ustar" | "gnu" = "ustar"): Buffer {
  const h = Buffer.alloc(512);
  (typeof name === "string" ? Buffer.from(name) : name).copy(h, 0, 0, 100);
  h.write("0000644\0", 100, "ascii");
  h.write("0000000\0", 108, "ascii");
  h.write("0000000\0", 116, "ascii");
  h.write(size.toString(8).padStart(11, "0") + "\0", 124, "ascii");
  h.write("00000000000\0", 136, "ascii");
  h.write(type, 156, "ascii");
  h.write(linkname, 157, "utf8");
  if (magic === "ustar") {
    h.write("ustar\0", 257, "binary");
    h.write("00", 263, "ascii");
  } else {
    h.write("ustar  \0", 257, "binary");
  }
  h.fill(0x20, 148, 156);
  let sum = 0;
  for (const b of h) sum += b;
  h.write(sum.toString(8).padStart(6, "0") + "\0 ", 148, "ascii");
  return h;
}

function pad(n: number): Buffer {
  return Buffer.alloc((512 - (n % 512)) % 512);
}

function entry(name: string | Buffer, type: string, data: Buffer = Buffer.alloc(0), linkname = "", magic: "ustar" | "gnu" = "ustar"): Buffer {
  return Buffer.concat([rawHeader(name, type, data.length, linkname, magic), data, pad(data.length)]);
}

const END = Buffer.alloc(1024);

function pax(records: Record<string, string>): Buffer {
  let body = "";
  for (const [k, v] of Object.entries(records)) {
    const rest = ` ${k}=${v}\n`;
    let len = rest.length + 1;
    while (String(len).length + rest.length !== len) len = String(len).length + rest.length;
    body += `${len}${rest}`;
  }
  return entry("PaxHeader", "x", Buffer.from(body));
}

async function unpackInto(archive: Buffer, limits?: UnpackLimits): Promise<{ dest: string; parent: string; result: Promise<unknown> }> {
  const parent = await tempDir();
  const dest = join(parent, "dest");
  await mkdir(dest);
  const result = unpackTar(chunked(archive), dest, limits);
  return { dest, parent, result };
}

async function assertRefused(archive: Buffer, code: string, message: RegExp, limits?: UnpackLimits): Promise<void> {
  const { parent, result } = await unpackInto(archive, limits);
  await assert.rejects(result, (error: { code?: string; message?: string }) => {
    assert.equal(error.code, code, String(error.message));
    assert.match(String(error.message), message);
    return true;
  });
  // Nothing landed next to the destination, whatever the archive tried.
  assert.deepEqual((await readdir(parent)).sort(), ["dest"]);
}

// --- packing ----------------------------------------------------------------------------------

test("a packed tree unpacks to the same files: long names, non-UTF-8 names, empty and large files", async () => {
  const root = await tempDir();
  const tree = join(root, "tree");
  const deep = join(tree, ...Array.from({ length: 5 }, (_, i) => `${"d".repeat(60)}${i}`));
  await mkdir(deep, { recursive: true });
  await writeFile(join(deep, "x".repeat(120)), "long");
  await writeFile(join(tree, "empty"), "");
  const big = randomBytes(300 * 1024 + 17);
  await writeFile(join(tree, "big.bin"), big);
  await writeFile(Buffer.from(`${tree}/\xff\xfe-latin`, "latin1"), "bytes");
  await mkdir(join(tree, ".smithers"));
  await writeFile(join(tree, ".smithers", "sandbox.db"), "state");
  await mkdir(join(tree, "sub", ".smithers"), { recursive: true });
  await writeFile(join(tree, "sub", ".smithers", "sandbox.db"), "planted state");
  const stats: PackStats = { entries: 0, bytes: 0, skippedSpecial: [], skippedPaths: 0 };
  const archive = await collect(packTree(tree, { skipAnywhere: [".smithers"] }, stats));
  assert.equal(archive.length % 512, 0);
  assert.ok(archive.subarray(archive.length - 1024).every((b) => b === 0), "ends with the end marker");
  assert.equal(stats.bytes, big.length + 4 + 5);

  const out = join(root, "out");
  await mkdir(out);
  const unpacked = await unpackTar(chunked(archive), out);
  assert.equal(unpacked.bytes, stats.bytes);
  assert.equal(await readFile(join(out, ...deep.slice(tree.length + 1).split("/"), "x".repeat(120)), "utf8"), "long");
  assert.deepEqual(await readFile(join(out, "big.bin")), big);
  assert.equal(await readFile(join(out, "empty"), "utf8"), "");
  assert.equal(await readFile(Buffer.from(`${out}/\xff\xfe-latin`, "latin1"), "utf8"), "bytes");
  assert.ok(!(await readdir(out)).includes(".smithers"), ".smithers/ was skipped");
  assert.ok(!(await readdir(join(out, "sub"))).includes(".smithers"), "a nested .smithers/ was skipped too");

  // GNU tar, when present, reads the same archive (PAX names included).
  const gnu = spawnSync("tar", ["-tf", "-"], { input: archive });
  if (gnu.status === 0) {
    assert.match(gnu.stdout.toString("latin1"), new RegExp(`${"x".repeat(120)}`));
  }
});

test("symlinks are packed as links, never followed", async () => {
  const root = await tempDir();
  const secret = join(root, "secret.txt");
  await writeFile(secret, "TOP-SECRET-CONTENT");
  const tree = join(root, "tree");
  await mkdir(tree);
  await symlink(secret, join(tree, "outside"));
  await symlink("inside.txt", join(tree, "rel"));
  await writeFile(join(tree, "inside.txt"), "ok");
  const stats: PackStats = { entries: 0, bytes: 0, skippedSpecial: [], skippedPaths: 0 };
  const archive = await collect(packTree(tree, {}, stats));
  assert.equal(archive.indexOf("TOP-SECRET-CONTENT"), -1, "the link target's content must not be in the archive");
  assert.notEqual(archive.indexOf(secret), -1, "the link is stored with its target text");
  assert.equal(stats.entries, 3);
  assert.equal(await readlink(join(tree, "outside")), secret);
});

// --- unpacking: what is accepted ---------------------------------------------------------------

test("GNU long names and PAX paths are honoured", async () => {
  const long = `${"a".repeat(80)}/${"b".repeat(90)}/file.txt`;
  const archive = Buffer.concat([
    entry("././@LongLink", "L", Buffer.from(`${long}\0`), "", "gnu"),
    entry(long.slice(0, 100), "0", Buffer.from("gnu"), "", "gnu"),
    pax({ path: `p/${"c".repeat(200)}` }),
    entry("ignored-stand-in", "0", Buffer.from("pax")),
    END,
  ]);
  const { dest, result } = await unpackInto(archive);
  await result;
  assert.equal(await readFile(join(dest, long), "utf8"), "gnu");
  assert.equal(await readFile(join(dest, "p", "c".repeat(200)), "utf8"), "pax");
});

// --- unpacking: what is refused ----------------------------------------------------------------

test("path tricks are refused with TOOL_PATH_ESCAPE", async () => {
  const file = Buffer.from("x");
  await assertRefused(Buffer.concat([entry("../escaped", "0", file), END]), "TOOL_PATH_ESCAPE", /'\.\.'/);
  await assertRefused(Buffer.concat([entry("a/../../escaped", "0", file), END]), "TOOL_PATH_ESCAPE", /'\.\.'/);
  await assertRefused(Buffer.concat([entry("/tmp/escaped", "0", file), END]), "TOOL_PATH_ESCAPE", /absolute/);
  await assertRefused(Buffer.concat([pax({ path: "../../escaped" }), entry("innocent", "0", file), END]), "TOOL_PATH_ESCAPE", /'\.\.'/);
  await assertRefused(Buffer.concat([entry("link", "2", Buffer.alloc(0), "/etc"), entry("link/passwd", "0", file), END]), "TOOL_PATH_ESCAPE", /symlink/);
  await assertRefused(Buffer.concat([entry("rel", "2", Buffer.alloc(0), "README.md"), END]), "TOOL_PATH_ESCAPE", /symlink/);
  await assertRefused(Buffer.concat([entry("hard", "1", Buffer.alloc(0), "/etc/passwd"), END]), "TOOL_PATH_ESCAPE", /hard link/);
  await assertRefused(Buffer.concat([pax({ path: "a\u0000b" }), entry("x", "0", file), END]), "TOOL_PATH_ESCAPE", /NUL/);
});

test("special entries, duplicates, limits and broken archives are refused with INVALID_INPUT", async () => {
  const file = Buffer.from("x");
  await assertRefused(Buffer.concat([entry("fifo", "6"), END]), "INVALID_INPUT", /fifo/);
  await assertRefused(Buffer.concat([entry("dev", "3"), END]), "INVALID_INPUT", /character device/);
  await assertRefused(Buffer.concat([entry("f", "0", file), entry("f", "0", file), END]), "INVALID_INPUT", /collides/);
  await assertRefused(Buffer.concat([entry("f", "0", file), entry("f/g", "0", file), END]), "INVALID_INPUT", /collides/);
  const limits: UnpackLimits = { maxTotalBytes: 10, maxEntries: 2, maxPathBytes: 20 };
  await assertRefused(Buffer.concat([entry("big", "0", Buffer.alloc(11)), END]), "INVALID_INPUT", /totalBytes/, limits);
  await assertRefused(Buffer.concat([entry("a", "0", file), entry("b", "0", file), entry("c", "0", file), END]), "INVALID_INPUT", /entries/, limits);
  await assertRefused(Buffer.concat([entry("p".repeat(21), "0", file), END]), "INVALID_INPUT", /pathBytes/, limits);
  const good = Buffer.concat([entry("f", "0", Buffer.alloc(2000, 1)), END]);
  await assertRefused(good.subarray(0, 1000), "INVALID_INPUT", /ends in the middle/);
  await assertRefused(good.subarray(0, 512 + 2048), "INVALID_INPUT", /end-of-archive marker/);
  const corrupt = Buffer.from(good);
  corrupt[0] = 0x67; // the name changes, the checksum does not
  await assertRefused(corrupt, "INVALID_INPUT", /checksum/);
});
