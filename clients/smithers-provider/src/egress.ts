/**
 * The egress engine's decisions, as Smithers heartbeats.
 *
 * A step that runs with an egress policy has every connection (and DNS question) decided by
 * the host's egress engine; the host streams each decision as an `egress` event of the
 * sandbox's event stream (a `smithers_egress::EgressRecord`: `host`, `port`, `verdict` allow /
 * deny / would-deny, `reason`, `rule`, `entry`). They reach Smithers as `remote-egress`
 * heartbeats `{sandboxId, stage, progress, hostId, egress: {host, port, verdict, reason, rule,
 * entry, count, allowed, denied, wouldDeny}}`, where `count` is this destination's decisions of
 * that verdict so far and `allowed`/`denied`/`wouldDeny` the step's totals.
 *
 * The records name what the step asked for, so they are the step's words: every string is
 * bounded and the request's environment values are redacted from it. A step can make
 * thousands of connections, and Smithers keeps only the latest heartbeat it is given within
 * half a second: a destination's first decision of each verdict is sent at once (up to
 * {@link MAX_DESTINATIONS} destinations), the rest at most once per liveness interval, and the
 * totals ride on every later heartbeat of the provider, so the one Smithers keeps has them.
 */

import type { Denial } from "./failure.js";
import { visible } from "./failure.js";

/** Destinations counted one by one; past them only the totals grow. */
export const MAX_DESTINATIONS = 256;
/** Destinations whose first decision is sent at once; past them decisions are throttled. */
const IMMEDIATE_DESTINATIONS = 32;

export type EgressTotals = { allowed: number; denied: number; wouldDeny: number };

export type EgressBeat = {
  host: string;
  port: number;
  verdict: string;
  reason: string;
  rule?: string;
  entry?: string;
  count: number;
} & EgressTotals;

function str(value: unknown, max: number, redact: (text: string) => string): string {
  return typeof value === "string" ? visible(redact(value.slice(0, 4 * max))).slice(0, max) : "";
}

export class EgressDecisions {
  readonly totals: EgressTotals = { allowed: 0, denied: 0, wouldDeny: 0 };
  private readonly counts = new Map<string, { host: string; port: number; verdict: string; reason: string; count: number }>();
  private immediate = 0;
  private lastThrottled = Number.NEGATIVE_INFINITY;
  /** Decisions seen but not sent yet (throttled), the latest of them kept. */
  private pending: EgressBeat | null = null;

  constructor(
    private readonly redact: (text: string) => string,
    private readonly intervalMs: number,
  ) {}

  /** Takes one record; returns the heartbeat payload to send now, if any. */
  take(record: unknown, now: number = Date.now()): EgressBeat | null {
    if (typeof record !== "object" || record === null) return null;
    const r = record as Record<string, unknown>;
    const verdict = r.verdict === "allow" || r.verdict === "deny" || r.verdict === "would-deny" ? r.verdict : null;
    if (verdict === null) return null;
    if (verdict === "allow") this.totals.allowed += 1;
    else if (verdict === "deny") this.totals.denied += 1;
    else this.totals.wouldDeny += 1;
    const host = str(r.host, 255, this.redact);
    const port = typeof r.port === "number" && Number.isInteger(r.port) && r.port >= 0 && r.port <= 65535 ? r.port : 0;
    const reason = str(r.reason, 300, this.redact);
    const key = `${verdict} ${host}:${port}`;
    let entry = this.counts.get(key);
    let first = false;
    if (entry === undefined && this.counts.size < MAX_DESTINATIONS) {
      entry = { host, port, verdict, reason, count: 0 };
      this.counts.set(key, entry);
      first = true;
    }
    if (entry !== undefined) entry.count += 1;
    const beat: EgressBeat = {
      host,
      port,
      verdict,
      reason,
      ...(typeof r.rule === "string" ? { rule: str(r.rule, 200, this.redact) } : {}),
      ...(typeof r.entry === "string" ? { entry: str(r.entry, 32, (t) => t) } : {}),
      count: entry?.count ?? 1,
      ...this.totals,
    };
    if (first && this.immediate < IMMEDIATE_DESTINATIONS) {
      this.immediate += 1;
      return beat;
    }
    if (now - this.lastThrottled >= this.intervalMs) {
      this.lastThrottled = now;
      this.pending = null;
      return beat;
    }
    this.pending = beat;
    return null;
  }

  /** A throttled decision still unsent (sent with the step's end), then forgotten. */
  flush(): EgressBeat | null {
    const beat = this.pending;
    this.pending = null;
    return beat === null ? null : { ...beat, ...this.totals };
  }

  /** True once any decision was seen. */
  get seen(): boolean {
    return this.totals.allowed + this.totals.denied + this.totals.wouldDeny > 0;
  }

  /** The destinations denied, most often first (audit mode's would-deny were let through: not here). */
  denials(): Denial[] {
    return [...this.counts.values()]
      .filter((d) => d.verdict === "deny")
      .sort((a, b) => b.count - a.count)
      .map((d) => ({ host: d.host, port: d.port, reason: d.reason, count: d.count }));
  }
}
