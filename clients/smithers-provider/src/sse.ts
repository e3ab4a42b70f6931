/**
 * A minimal server-sent-events parser: the subset the sandbox host emits (`id`, `event`, `data`,
 * comments), fed with arbitrary chunks of the byte stream. Mirrors
 * `crates/smithers-runtime-remote/src/sse.rs`.
 */

export type SseFrame = {
  id: string | undefined;
  event: string | undefined;
  data: string;
};

export class SseParser {
  private buffer: Buffer = Buffer.alloc(0);
  private current: SseFrame = { id: undefined, event: undefined, data: "" };
  private hasData = false;
  /** Comment lines seen (the host's `: keepalive`): proof the connection is alive. */
  comments = 0;

  /** Feeds a chunk; returns every frame it completed. */
  push(chunk: Uint8Array): SseFrame[] {
    this.buffer = this.buffer.length === 0 ? Buffer.from(chunk) : Buffer.concat([this.buffer, chunk]);
    const frames: SseFrame[] = [];
    let start = 0;
    for (;;) {
      const nl = this.buffer.indexOf(0x0a, start);
      if (nl === -1) {
        break;
      }
      let end = nl;
      if (end > start && this.buffer[end - 1] === 0x0d) {
        end -= 1;
      }
      const line = this.buffer.subarray(start, end).toString("utf8");
      start = nl + 1;
      if (line === "") {
        if (this.hasData || this.current.event !== undefined) {
          frames.push(this.current);
        }
        this.current = { id: undefined, event: undefined, data: "" };
        this.hasData = false;
        continue;
      }
      if (line.startsWith(":")) {
        this.comments += 1;
        continue;
      }
      const colon = line.indexOf(":");
      const field = colon === -1 ? line : line.slice(0, colon);
      let value = colon === -1 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) {
        value = value.slice(1);
      }
      switch (field) {
        case "id":
          this.current.id = value;
          break;
        case "event":
          this.current.event = value;
          break;
        case "data":
          this.current.data = this.hasData ? `${this.current.data}\n${value}` : value;
          this.hasData = true;
          break;
        default:
          break;
      }
    }
    this.buffer = this.buffer.subarray(start);
    return frames;
  }
}
