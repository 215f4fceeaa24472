// Drives `vlm serve` with the official `openai` npm client, as a user's tool would.
// Usage: node openai_client.mjs BASE_URL API_KEY < jobs.json > results.json
// jobs.json: {"concurrent": bool, "jobs": [{"op": "chat" | "chat_stream" | "completion" | "response" |
//   "response_stream" | "models" | "retrieve",
//   "params": {...request...}, "id": "model id" (retrieve), "abort_after": N (streams: abort
//   after N content chunks), "abort_after_ms": N (streams: abort N ms after the response
//   headers), "delay_ms": N (start later)}]}
// Each result: {"chunks": [...]} for streams (every chunk or event the client yielded), {"response": ...}
// otherwise, or {"error": {"status", "name", "message", "code", "param"}}; "aborted": true when
// the job aborted its own stream. "response" is client.responses.create (with its output_text);
// "response_stream" is the client.responses.stream() helper, whose checks of the event sequence
// apply: {"chunks": events, "final": finalResponse()}. "chat_stream" is the
// client.chat.completions.stream() helper, which assembles content and tool calls from the deltas:
// {"chunks", "final": finalChatCompletion()}.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const npm = path.resolve(here, "../../../tools/npm/node_modules");
const { default: OpenAI } = await import(pathToFileURL(path.join(npm, "openai/index.mjs")));

const [baseURL, apiKey] = process.argv.slice(2);
const spec = JSON.parse(fs.readFileSync(0, "utf8"));
const client = new OpenAI({ baseURL, apiKey: apiKey || "none", maxRetries: 0, timeout: 120000 });

async function run(job) {
  if (job.delay_ms) await new Promise((r) => setTimeout(r, job.delay_ms));
  try {
    if (job.op === "models") return { response: await client.models.list().then((p) => p.data) };
    if (job.op === "retrieve") return { response: await client.models.retrieve(job.id) };
    if (job.op === "response_stream" || job.op === "chat_stream") {
      const stream = job.op === "chat_stream" ? client.chat.completions.stream(job.params)
                                              : client.responses.stream(job.params);
      const chunks = [];
      for await (const event of stream) chunks.push(event);
      const final = job.op === "chat_stream" ? await stream.finalChatCompletion() : await stream.finalResponse();
      return { chunks, final };
    }
    if (job.op === "response" && !job.params.stream) {
      const r = await client.responses.create(job.params);
      return { response: { ...r, output_text: r.output_text } };
    }
    const api = job.op === "chat" ? client.chat.completions : job.op === "response" ? client.responses : client.completions;
    if (!job.params.stream) return { response: await api.create(job.params) };
    const stream = await api.create(job.params);
    const chunks = [];
    if (job.abort_after_ms !== undefined) {
      await new Promise((r) => setTimeout(r, job.abort_after_ms));
      stream.controller.abort();
      return { chunks, aborted: true };
    }
    let content = 0;
    for await (const chunk of stream) {
      chunks.push(chunk);
      const c = chunk.choices && chunk.choices[0];
      const text = c ? (c.delta ? c.delta.content : c.text) : chunk.type === "response.output_text.delta" && chunk.delta;
      if (text) content++;
      if (job.abort_after !== undefined && content >= job.abort_after) {
        stream.controller.abort();
        return { chunks, aborted: true };
      }
    }
    return { chunks };
  } catch (e) {
    return { error: { status: e.status ?? null, name: e.constructor.name, message: e.message, code: e.code ?? null,
                      param: e.param ?? null } };
  }
}

const results = spec.concurrent ? await Promise.all(spec.jobs.map(run)) : [];
if (!spec.concurrent) for (const j of spec.jobs) results.push(await run(j));
process.stdout.write(JSON.stringify(results));
