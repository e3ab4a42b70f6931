/** @jsxImportSource smithers-orchestrator */
// Per-step settings from a workflow (crates/smithers-cli/tests/ts_provider/smithers_workflow.rs
// runs it). They ride in `workspace`, the one free-form prop Smithers 0.32 hands a provider,
// written out here as the plain object `sandboxSettings` makes (the README's example, which CI
// runs too, uses the helper). `where` runs in its own cwd; `egress` asks for a name its egress
// policy denies, and its error names the denial; `slow` sleeps past its own timeoutMs and is
// killed by the host (whose own ceiling is an hour), and the run's error names the timeout.
import { createSmithers } from "smithers-orchestrator";
import { registerSandboxProvider } from "smithers-orchestrator/sandbox";
import { z } from "zod";
import { createSmithersSandboxProvider } from "smithers-sandbox-provider";

registerSandboxProvider(createSmithersSandboxProvider());

const { Workflow, Sandbox, Sequence, smithers, outputs } = createSmithers({
  result: z.object({ dir: z.string() }),
});

const report = `printf '{"status":"finished","outputs":{"dir":"%s"}}' "$(pwd)" > "$SMITHERS_SANDBOX_RESULT_PATH"`;

export default smithers(() => (
  <Workflow name="settings-e2e">
    <Sequence>
      <Sandbox id="where" provider="smithers-sandbox" output={outputs.result} command={report} workspace={{ name: "where", smithersSandbox: { cwd: "/workspace/src" } }} retries={0} />
      <Sandbox
        id="egress"
        provider="smithers-sandbox"
        output={outputs.result}
        command={`getent hosts denied.test || { echo 'cannot resolve denied.test' >&2; exit 6; }; ${report}`}
        workspace={{ name: "egress", smithersSandbox: { egressPolicy: { allow: [{ host: "allowed.test", ports: [443] }] } } }}
        retries={0}
        continueOnFail
      />
      <Sandbox
        id="slow"
        provider="smithers-sandbox"
        output={outputs.result}
        command={`echo 'going to sleep' >&2; sleep 120; ${report}`}
        workspace={{ name: "slow", smithersSandbox: { timeoutMs: 1500 } }}
        retries={0}
      />
    </Sequence>
  </Workflow>
));
