/**
 * A loopback TCP proxy in front of the real host that breaks chosen HTTP exchanges once each,
 * the way a flaky network does: it forwards the request, then drops the connection without
 * the response, or cuts the response off after some bytes. It looks only at the request line
 * of each request (HTTP/1.1, one request at a time per connection, as fetch sends them).
 */

import { connect, createServer } from "node:net";
import type { Server, Socket } from "node:net";

export type Fault = {
  /** Matches the request line, e.g. /^POST \S+\/execute /. */
  request: RegExp;
  /** `drop`: no response at all; `cut`: relay this many response bytes, then close. */
  action: { kind: "drop" } | { kind: "cut"; afterBytes: number };
  /** Set once the fault was injected. */
  fired?: boolean;
};

export type FaultProxy = { url: string; faults: Fault[]; close: () => Promise<void> };

const METHOD = /^(GET|POST|PUT|DELETE|HEAD|PATCH|OPTIONS) \S+ HTTP\/1\.1\r\n/;

export async function startFaultProxy(upstreamUrl: string, faults: Fault[]): Promise<FaultProxy> {
  const upstream = new URL(upstreamUrl);
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    const up = connect(Number(upstream.port), upstream.hostname);
    sockets.add(client);
    sockets.add(up);
    let active: Fault | undefined;
    let relayed = 0;
    const closeBoth = () => {
      client.destroy();
      up.destroy();
    };
    client.on("data", (chunk: Buffer) => {
      const line = chunk.toString("latin1", 0, Math.min(chunk.length, 512));
      if (METHOD.test(line)) {
        // A new request on this connection: does a fault that has not fired yet match it?
        active = faults.find((f) => !f.fired && f.request.test(line));
        if (active) active.fired = true;
        relayed = 0;
      }
      up.write(chunk);
    });
    up.on("data", (chunk: Buffer) => {
      if (!active) {
        client.write(chunk);
        return;
      }
      if (active.action.kind === "drop") {
        closeBoth();
        return;
      }
      const room = active.action.afterBytes - relayed;
      if (room > 0) {
        client.write(chunk.subarray(0, room));
        relayed += Math.min(room, chunk.length);
      }
      if (relayed >= active.action.afterBytes) {
        client.end(() => closeBoth());
      }
    });
    for (const s of [client, up]) {
      s.on("error", () => closeBoth());
      s.on("close", () => {
        sockets.delete(s);
        closeBoth();
      });
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}`,
    faults,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}
