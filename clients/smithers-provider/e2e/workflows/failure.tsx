/** @jsxImportSource smithers-orchestrator */
// A step that edits two files, says why it fails on stderr and exits 3, retried twice
// (crates/smithers-cli/tests/ts_provider/smithers_workflow.rs runs it). Smithers must apply
// neither edit on any attempt, nor hold one for review, and the run's error must carry the
// exit code and the end of the step's stderr, without the value of the request's API key.
// `--input '{"provider":"…"}'` picks the provider: "smithers-sandbox" or, with the durable
// review, "smithers-sandbox-review".
import { createSmithers } from "smithers-orchestrator";
import { registerSandboxProvider } from "smithers-orchestrator/sandbox";
import { z } from "zod";
import { createSmithersSandboxProvider } from "smithers-sandbox-provider";

const step = [
  "echo edited > a.txt",
  "echo edited > b.txt",
  "echo 'compiling…'",
  `printf 'using the key %s\\n' "$STEP_API_KEY" >&2`,
  "echo 'error: the build broke (3 errors)' >&2",
  "exit 3",
].join("; ");
const env = { STEP_API_KEY: "sk-e2e-0123456789-secret" };
registerSandboxProvider(createSmithersSandboxProvider({ command: step, env }));
registerSandboxProvider(createSmithersSandboxProvider({ id: "smithers-sandbox-review", command: step, env, durableReview: { pollMs: 100 } }));

const { Workflow, Sandbox, smithers, outputs } = createSmithers({
  input: z.object({ provider: z.string() }),
  result: z.object({ summary: z.string() }),
});

export default smithers((ctx) => (
  <Workflow name="failure-e2e">
    <Sandbox id="edit" provider={ctx.input.provider} output={outputs.result} autoAcceptDiffs retries={2} />
  </Workflow>
));
