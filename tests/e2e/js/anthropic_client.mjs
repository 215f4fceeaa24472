// Drives `vlm serve`'s /v1/messages with the official `@anthropic-ai/sdk` client.
// Usage: node anthropic_client.mjs BASE_URL API_KEY < jobs.json > results.json
// jobs.json: {"jobs": [{"op": "create" | "count" | "stream", "params": {...}, "abort_after": N}]}, run
// one after the other. Results: {"response": Message} (create; count: messages.countTokens's
// answer), {"events": [...], "final":
// finalMessage()} (stream: the client.messages.stream() helper, which checks the event order),
// {"events", "aborted": true} after N text deltas, or {"error": {"status", "name", "message",
// "type"}}.
import path from "node:path";
import fs from "node:fs";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const npm = path.resolve(here, "../../../tools/npm/node_modules");
const { default: Anthropic } = await import(pathToFileURL(path.join(npm, "@anthropic-ai/sdk/index.mjs")));

const [baseURL, apiKey] = process.argv.slice(2);
const spec = JSON.parse(fs.readFileSync(0, "utf8"));
const client = new Anthropic({ baseURL, apiKey: apiKey || "none", maxRetries: 0, timeout: 120000 });

async function run(job) {
  try {
    if (job.op === "create") return { response: await client.messages.create(job.params) };
    if (job.op === "count") return { response: await client.messages.countTokens(job.params) };
    const stream = client.messages.stream(job.params);
    const events = [];
    let deltas = 0;
    for await (const event of stream) {
      events.push(event);
      if (event.type === "content_block_delta" && event.delta.type === "text_delta") deltas++;
      if (job.abort_after !== undefined && deltas >= job.abort_after) {
        stream.abort();
        return { events, aborted: true };
      }
    }
    return { events, final: await stream.finalMessage() };
  } catch (e) {
    return { error: { status: e.status ?? null, name: e.constructor.name, message: e.message,
                      type: e.error?.error?.type ?? null } };
  }
}

const results = [];
for (const j of spec.jobs) results.push(await run(j));
process.stdout.write(JSON.stringify(results));
